"""Training plugins on real gloo process groups (2 and 4 spawned ranks) and real Lightning Trainers.

The algorithm checks run the plugins' rank programs (``postcast.models.plugins.testing``) once per
world size, with a FileStore per launch and a timeout on every collective; each test asserts one
property of the collected results. They spawn processes, so they are in the ``system`` tier. Full
``postcast train fit`` runs on 2 processes are opt-in (``-m distributed``).
"""

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from postcast.models.plugins import lion, sparsity, testing, wagma
from postcast.models.plugins.sparsity import MagnitudePruning, NMSparsity

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def two():
    return testing.launch(testing.prog_two_ranks, 2, timeout_s=240)


@pytest.fixture(scope="module")
def four():
    return testing.launch(testing.prog_four_ranks, 4, timeout_s=240)


# ---- gradient compression -------------------------------------------------------------------------


@pytest.mark.system  # spawns gloo process groups (2 and 4 ranks): the system tier
@pytest.mark.parametrize("world", [2, 4])
def test_topk_and_oktopk_at_full_density_equal_the_dense_allreduce(world, two, four):
    for r in two if world == 2 else four:
        assert r["sparse"]["topk_k_eq_n"] and r["sparse"]["oktopk_density1"]


@pytest.mark.system  # spawns gloo process groups (2 and 4 ranks): the system tier
@pytest.mark.parametrize("world", [2, 4])
def test_error_feedback_conserves_the_gradient_sum(world, two, four):
    for r in two if world == 2 else four:
        assert r["sparse"]["topk_conservation_err"] < 1e-4
        assert r["sparse"]["oktopk_conservation_err"] < 1e-4


@pytest.mark.system  # spawns gloo process groups (2 and 4 ranks): the system tier
@pytest.mark.parametrize("world", [2, 4])
def test_oktopk_kept_entries_stay_in_band_and_match_what_ranks_sent(world, two, four):
    for r in two if world == 2 else four:
        k = r["sparse"]["oktopk_k"]
        assert all(2 * k // 3 <= nnz <= 4 * k // 3 for nnz in r["sparse"]["oktopk_nnz"]), r["sparse"]["oktopk_nnz"]
        assert r["sparse"]["oktopk_invariant"]  # sum over ranks of (acc - residual) == kept sums


@pytest.mark.system  # spawns gloo process groups (2 and 4 ranks): the system tier
def test_lightning_registers_the_hook_on_cpu(two):
    """Guards against Lightning's silent CPU skip: the hook runs once per step (one bucket)."""
    for r in two:
        dense = r["lightning"]["allreduce"]
        assert dense["steps"] == 12 and dense["hook_calls"] == 12 and dense["replicas_equal"]


@pytest.mark.system  # spawns gloo process groups (2 and 4 ranks): the system tier
def test_powersgd_under_lightning_stays_near_dense_ddp(two):
    for r in two:
        dense, psgd = r["lightning"]["allreduce"], r["lightning"]["powersgd"]
        assert psgd["hook_calls"] == 12 and psgd["replicas_equal"]
        assert psgd["bytes"] < 0.8 * dense["bytes"]  # the 16 x 8 weight went as rank-2 factors
        assert psgd["loss"] == pytest.approx(dense["loss"], rel=0.1)


# ---- Lion Cub ---------------------------------------------------------------------------------------


@pytest.mark.system  # spawns gloo process groups (2 and 4 ranks): the system tier
def test_lion_cub_votes_are_the_sign_of_the_summed_signs(two):
    for r in two:
        assert r["lion"]["vote8"] and r["lion"]["vote1"] and r["lion"]["lion_replicas_equal"]
    n_params = 5 * 3 + 3
    assert two[0]["lion"]["lion_bytes_per_step"] < 4 * n_params  # int8 votes + momentum every 2 steps


def test_lion_cub_on_one_process_is_plain_lion():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    opt = lion.LionCub(a.parameters(), lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)
    moms = [torch.zeros_like(p) for p in b.parameters()]
    for _ in range(4):
        x = torch.randn(8, 4)
        opt.zero_grad()
        a(x).sum().backward()
        opt.step()
        b.zero_grad()
        b(x).sum().backward()
        with torch.no_grad():  # reference Lion (Chen et al. 2023)
            for p, m in zip(b.parameters(), moms, strict=True):
                u = torch.sign(0.9 * m + 0.1 * p.grad)
                p.mul_(1 - 0.01 * 0.1).add_(u, alpha=-0.01)
                m.mul_(0.99).add_(p.grad, alpha=0.01)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_sign_packing_round_trips():
    u = torch.tensor([1.0, -1, -1, 1, 1, 1, -1, 1, -1, 1, -1])
    packed = lion.pack_signs(u)
    assert packed.dtype == torch.uint8 and packed.numel() == 2
    assert torch.equal(lion.unpack_signs(packed, u.numel()).float(), u)
    with pytest.raises(ValueError, match="bits=4"):
        lion.vote(u, bits=4)


# ---- eager-SGD ----------------------------------------------------------------------------------------


@pytest.mark.system  # spawns gloo process groups (2 and 4 ranks): the system tier
def test_eager_sgd_fast_rank_is_not_blocked_by_the_delayed_rank(two):
    fast = two[0]["eager"]
    delay = 0.05
    assert fast["sync"]["blocked_mean_s"] > 0.6 * delay  # synchronous rounds wait for the slow rank
    assert fast["solo"]["blocked_mean_s"] < 0.4 * delay  # solo rounds do not
    assert any(len(c) < 2 for c in fast["solo"]["contributors"])  # rounds ran without the slow rank


@pytest.mark.system  # spawns gloo process groups (2 and 4 ranks): the system tier
def test_eager_sgd_staleness_is_bounded_and_nothing_is_lost(two):
    for r in two:
        assert r["eager"]["bounded"]["max_staleness"] < 3  # a synchronous round every 3
        for label in ("solo", "sync", "bounded", "majority"):
            assert r["eager"][label]["conservation_err"] < 1e-4
    slow = two[1]["eager"]
    assert slow["bounded"]["max_staleness"] >= 1  # late gradients did arrive late, within the bound


@pytest.mark.system  # spawns gloo process groups (2 and 4 ranks): the system tier
def test_eager_sgd_majority_rounds_include_their_initiator(two):
    log = two[0]["eager"]["majority"]
    assert log["initiators"] == two[1]["eager"]["majority"]["initiators"]  # no communication needed
    for t, who in enumerate(log["contributors"]):
        assert log["initiators"][t] in who


# ---- WAGMA ----------------------------------------------------------------------------------------------


def test_wagma_butterfly_groups():
    phases = wagma.butterfly_groups(8, 2)
    assert phases == [
        [[0, 1], [2, 3], [4, 5], [6, 7]],
        [[0, 2], [1, 3], [4, 6], [5, 7]],
        [[0, 4], [1, 5], [2, 6], [3, 7]],
    ]
    assert wagma.butterfly_groups(16, 4)[1][0] == [0, 4, 8, 12]
    with pytest.raises(ValueError, match="power of two"):
        wagma.butterfly_groups(6, 2)


@pytest.mark.system  # spawns gloo process groups (2 and 4 ranks): the system tier
def test_wagma_reaches_consensus_with_four_ranks(four):
    for r in four:
        assert r["wagma"]["kinds"] == ["group", "group", "global"]
        assert r["wagma"]["consensus"] and r["wagma"]["global_equal"]


# ---- sparsity ---------------------------------------------------------------------------------------------


def test_nm_masks_have_exact_per_block_counts():
    torch.manual_seed(0)
    for w in (torch.randn(8, 16, 3, 3), torch.randn(6, 32)):
        mask = sparsity.nm_mask(w, 2, 4)
        blocks = mask.reshape(w.shape[0], -1, 4)  # (out, blocks, 4)
        assert (blocks.sum(-1) == 2).all()
        kept = w.reshape(w.shape[0], -1, 4).abs()
        lowest_kept = torch.where(blocks, kept, torch.inf).min(-1).values
        highest_dropped = torch.where(blocks, -torch.inf, kept).max(-1).values
        assert (lowest_kept >= highest_dropped).all()  # the two largest |w| survive
    with pytest.raises(ValueError, match="multiple of m=4"):
        sparsity.nm_mask(torch.randn(4, 19, 3, 3))


def test_magnitude_masks_and_cubic_schedule():
    w = torch.randn(10, 37)
    for s in (0.0, 0.5, 0.9):
        assert int((~sparsity.magnitude_mask(w, s)).sum()) == round(s * w.numel())
    rows = sparsity.magnitude_mask(w, 0.3, structured=True)
    assert int((~rows.any(1)).sum()) == 3  # whole output channels
    sched = [sparsity.cubic_sparsity(t, 0.8, 10, 50) for t in (0, 10, 30, 50, 70)]
    assert sched[:2] == [0.0, 0.0] and sched[2] == pytest.approx(0.8 * (1 - 0.5**3)) and sched[3:] == [0.8, 0.8]
    with pytest.raises(ValueError, match=r"sparsity=1\.0"):
        MagnitudePruning(sparsity=1.0)


def _fit(tmp: Path, cb: L.Callback, steps: int, ckpt: str | None = None) -> testing.TinyRegression:
    L.seed_everything(0, verbose=False)
    model = testing.TinyRegression()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        callbacks=[cb],
        default_root_dir=tmp,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(model, ckpt_path=ckpt)
    trainer.save_checkpoint(tmp / f"step{steps}.ckpt")
    return model


def test_pruning_masks_survive_optimizer_steps_and_a_checkpoint_round_trip(tmp_path):
    first = MagnitudePruning(sparsity=0.5, schedule="cubic", start_step=0, end_step=6, every=2, min_numel=16)
    model = _fit(tmp_path, first, steps=8)
    assert first.sparsity() == pytest.approx(0.5, abs=1 / 128)
    masks = {k: v.clone() for k, v in first.masks.items()}
    params = dict(model.named_parameters())
    for name, mask in masks.items():
        assert not params[name][~mask].any()  # pruned entries are exact zeros after the last step
    ckpt = torch.load(tmp_path / "step8.ckpt", weights_only=False)
    for name, mask in masks.items():  # the weights in the checkpoint are zero there, too
        assert not ckpt["state_dict"][name][~mask].any()
    resumed = MagnitudePruning(sparsity=0.5, schedule="cubic", start_step=0, end_step=6, every=2, min_numel=16)
    model = _fit(tmp_path, resumed, steps=16, ckpt=str(tmp_path / "step8.ckpt"))
    assert resumed.step == 16 and masks.keys() == resumed.masks.keys()
    params = dict(model.named_parameters())
    for name, mask in masks.items():
        assert torch.equal(resumed.masks[name], mask)
        assert not params[name][~mask].any() and params[name][mask].all()  # 8 more steps, same zeros


def test_nm_sparsity_callback_trains_with_2_to_4_masks(tmp_path):
    cb = NMSparsity(2, 4, min_numel=16)
    model = _fit(tmp_path, cb, steps=4)
    w = model.net[0].weight  # (16, 8): two blocks of 4 per row
    assert (w.reshape(16, 2, 4).ne(0).sum(-1) <= 2).all() and "net.0.weight" in cb.masks
    assert cb.skipped == [] and cb.sparsity() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="CUDA GPU"):
        sparsity.to_semi_structured(model)


# ---- the Lightning CLI on 2 processes (opt-in) ---------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.parametrize(
    "plugin", ["topk", "oktopk", "powersgd", "wagma", "eager_solo", "eager_majority", "lion_cub", "sparsity_2to4"]
)
def test_plugin_presets_train_on_two_processes(process, store, tmp_path, plugin):
    """A real ``postcast`` process: Lightning's DDP launcher starts rank 1 by re-running the command line,
    which inside a pytest worker is pytest's (in-process, the worker crashed)."""
    report = tmp_path / "comm.json"
    process(
        "train",
        "fit",
        "-c",
        str(ROOT / "configs/train/unet_t850.yaml"),
        "-c",
        str(ROOT / f"configs/plugins/{plugin}.yaml"),
        "--data.cfg.store",
        str(store),
        "--model.net",
        '{"base_filters": 8}',
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_epochs",
        "2",
        "--data.cfg.batch_size",
        "2",
        "--trainer.devices",
        "2",
        "--trainer.callbacks+=postcast.models.plugins.CommReport",
        "--trainer.callbacks.path",
        str(report),
        check=True,
        timeout=900,
    )
    rep = json.loads(report.read_text())
    assert rep["world_size"] == 2 and rep["steps"] > 0
    if plugin != "sparsity_2to4":
        assert rep["bytes_per_step"] > 0
    assert sorted(tmp_path.rglob("best*.ckpt"))
