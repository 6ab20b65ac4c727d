"""The post-processor networks and the SMoE layer, on small random tensors (no store needed)."""

import numpy as np
import pytest
import torch

from postcast.datasets.core.errors import ConfigError
from postcast.models import convnets, earth, registry, smoe, transformer
from postcast.models.kernels import crps_gaussian
from postcast.models.module import PostProcessor
from postcast.models.smoe import SMoEConfig, SMoEHead, TopKRouting, rc_labels, routing_correct

H, W, C, M, V = 13, 20, 9, 6, 3  # odd grid on purpose
# 3 input variables (the target's is the second: channels 2, 3) + 3 location features = C channels
SPEC = {"target": "t850", "variables": ["z", "t", "u"], "season_features": False, "members": True}
MODELS = list(registry.architectures())


def net_batch(b: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    """What a network (not the PostProcessor) sees: ``x`` = normalised fields + features."""
    out = batch(b, seed)
    return {**out, "x": torch.cat([out["fields"], out["features"]], dim=1)}


def batch(b: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    members = torch.randn(b, M, V, H, W, generator=g)
    x = torch.randn(b, C, H, W, generator=g)  # the model's statistics are 0/1: physical = normalised
    m = torch.randn(b, H, W, generator=g)
    return {
        "fields": x[:, : 2 * V],
        "features": x[:, 2 * V :],
        "members": members,
        "m": m,
        "s": torch.rand(b, H, W, generator=g) + 0.5,
        "y": m + torch.randn(b, H, W, generator=g),
    }


def build(kind: str, **kw) -> PostProcessor:
    net = {"base_filters": 8} if "base_filters" in registry.get(kind).__dataclass_fields__ else {}
    return PostProcessor(kind, net=net, sample=SPEC, grid=(H, W), n_members=M, **kw)


@pytest.mark.parametrize("kind", MODELS)
def test_every_model_starts_at_the_raw_ensemble_and_learns(kind):
    torch.manual_seed(0)
    model = build(kind)
    b = batch()
    mu, sigma = model(b)
    assert mu.shape == sigma.shape == (2, H, W)
    torch.testing.assert_close(mu, b["m"])
    torch.testing.assert_close(sigma, b["s"], rtol=1e-4, atol=1e-5)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        mu, sigma = model(b)
        loss = crps_gaussian(mu, sigma, b["y"]).mean()
        losses.append(float(loss.detach()))
        if model.smoe_layer is not None:
            loss = loss + model.smoe_layer.rc_loss(loss)
        loss.backward()
        opt.step()
    assert losses[-1] < losses[0]


def test_global_emos_has_13_parameters_for_10_members():
    model = PostProcessor("emos_global", sample={**SPEC, "variables": ["t"]}, grid=(H, W), n_members=10)
    assert sum(p.numel() for p in model.parameters()) == 13


@pytest.mark.parametrize("shape", [(361, 12), (37, 72), (5, 7)])  # ENS-10 has 361 rows
def test_unet_handles_odd_grids(shape):
    net = convnets.UNet(4, base=4)
    x = torch.randn(1, 4, *shape)
    a, b = net({"x": x})
    assert a.shape == b.shape == (1, *shape)


def test_earth_padding_is_periodic_in_longitude():
    x = torch.arange(2 * 5, dtype=torch.float32).view(1, 1, 2, 5)
    p = earth.earth_pad(x, 1)
    assert p.shape == (1, 1, 4, 7)
    torch.testing.assert_close(p[0, 0, 1, 0], x[0, 0, 0, -1])  # wraps around the date line
    torch.testing.assert_close(p[0, 0, 0, 1:-1], x[0, 0, 0])  # replicated at the pole


@pytest.mark.parametrize("pads", [(1,), (2, 3, 0, 0), (0, 0, 1, 2), (3, 1, 2, 0)])
def test_earth_padding_equals_the_reference_padding(pads):
    """numpy's wrap (longitude) then edge (latitude) padding, bit for bit, with and without gradients."""
    x = torch.randn(2, 3, 7, 9, dtype=torch.float64, requires_grad=True)
    top, bottom, left, right = (pads * 4)[:4] if len(pads) == 1 else pads
    ref = np.pad(x.detach().numpy(), ((0, 0), (0, 0), (0, 0), (left, right)), mode="wrap")
    ref = np.pad(ref, ((0, 0), (0, 0), (top, bottom), (0, 0)), mode="edge")
    p = earth.earth_pad(x, *pads)
    np.testing.assert_array_equal(p.detach().numpy(), ref)
    (g,) = torch.autograd.grad(p.sum(), x)  # each input counted once per copy of it
    expected = np.zeros((7, 9))
    rows = np.clip(np.arange(-top, 7 + bottom), 0, 6)
    cols = np.arange(-left, 9 + right) % 9
    np.add.at(expected, (rows[:, None], cols[None, :]), 1.0)
    np.testing.assert_array_equal(g[0, 0].numpy(), expected)


def test_transformer_is_equivariant_to_member_order():
    torch.manual_seed(0)
    net = transformer.EnsembleTransformer(C, V, 1, width=8, heads=2)
    torch.nn.init.normal_(net.correct.weight, std=0.1)  # leave the zero start
    b = net_batch()
    a1, b1 = net(b)
    perm = dict(b, members=b["members"][:, torch.randperm(M)])
    a2, b2 = net(perm)
    torch.testing.assert_close(a1, a2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b1, b2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", [k for k in MODELS if registry.get(k).needs_members])
def test_member_models_ask_for_members(kind):
    """A family that reads the members refuses a sample spec without them, naming the setting."""
    with pytest.raises(ValueError, match="members: true"):
        PostProcessor(kind, sample={**SPEC, "members": False}, grid=(H, W), n_members=M)


def test_adding_a_family_is_one_registered_config():
    """Every family is found by discovery and builds from its own small config, nothing else."""
    assert set(MODELS) == {"emos", "emos_global", "mlp", "lenet", "unet", "unet_smoe", "smoe", "transformer"}
    with pytest.raises(Exception, match="unknown keys"):
        registry.make("unet", {"hidden": 3})  # another architecture's option
    with pytest.raises(ValueError, match="choose one of"):
        registry.get("resnet")


# --- SMoE ----------------------------------------------------------------------------------------
def routed(values, weights, k=1, weighted=False, block=False, damping=1.0, q=0.5):
    return TopKRouting.apply(values, weights, k, weighted, block, damping, q)


@pytest.mark.parametrize("weighted", [False, True])
def test_routing_forward_is_a_gather_of_the_top_k(weighted):
    g = torch.Generator().manual_seed(1)
    values, weights = torch.randn(2, 4, 3, 5, generator=g), torch.randn(2, 4, 3, 5, generator=g)
    y = routed(values, weights, k=2, weighted=weighted)
    idx = weights.topk(2, dim=1).indices
    want = values.gather(1, idx) * (weights.gather(1, idx) if weighted else 1)
    torch.testing.assert_close(y, want)


@pytest.mark.parametrize("weighted", [False, True])
def test_routing_backward_gradcheck(weighted):
    g = torch.Generator().manual_seed(2)
    values = torch.randn(2, 3, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 3, 2, 3, generator=g, dtype=torch.float64)
    weights = weights.requires_grad_(weighted)  # unweighted: the gate gradient is straight-through, not exact
    assert torch.autograd.gradcheck(lambda v, w: routed(v, w, k=2, weighted=weighted), (values, weights))


def test_unselected_experts_get_no_gradient_and_rc_blocks_the_gate():
    values = torch.randn(1, 3, 4, 4, requires_grad=True)
    weights = torch.randn(1, 3, 4, 4, requires_grad=True)
    y = routed(values, weights, k=1, block=True)
    y.sum().backward()
    chosen = torch.zeros(1, 3, 4, 4, dtype=torch.bool).scatter(1, weights.topk(1, dim=1).indices, True)
    assert (values.grad[~chosen] == 0).all() and (values.grad[chosen] == 1).all()
    assert weights.grad is None


def test_damping_zeroes_expert_gradient_where_routing_was_wrong():
    values = torch.randn(1, 3, 4, 4, requires_grad=True)
    weights = torch.randn(1, 3, 4, 4)
    e = torch.randn(1, 1, 4, 4)
    y = routed(values, weights, damping=0.0, q=0.5)
    (y * e).sum().backward()
    correct = routing_correct(e, 0.5)
    got = values.grad.gather(1, weights.topk(1, dim=1).indices)
    assert (got[~correct] == 0).all() and torch.equal(got[correct], e[correct])
    values.grad = None
    (routed(values, weights, damping=1.0) * e).sum().backward()
    torch.testing.assert_close(values.grad.gather(1, weights.topk(1, dim=1).indices), e)  # factor 1 = no damping


def test_rc_labels_sum_to_k_and_handle_edge_quantiles():
    g = torch.Generator().manual_seed(3)
    weights, e = torch.randn(2, 5, 3, 4, generator=g), torch.randn(2, 2, 3, 4, generator=g)
    idx = weights.topk(2, dim=1).indices
    labels = rc_labels(idx, routing_correct(e, 0.3), 5)
    assert ((labels >= 0) & (labels <= 1)).all()
    torch.testing.assert_close(labels.sum(dim=1), torch.full((2, 3, 4), 2.0))
    everything = rc_labels(idx, routing_correct(e, 1.0), 5)
    torch.testing.assert_close(everything, torch.zeros_like(everything).scatter(1, idx, 1.0))
    nothing = rc_labels(idx, routing_correct(e * 0 + torch.arange(24.0).view(2, 1, 3, 4) + 1, 0.0), 5)
    assert nothing.gather(1, idx)[:, :, 0, 0].eq(torch.tensor([[1.0, 1.0], [1.0, 1.0]])).all()  # the minimum
    idx2 = torch.randn(2, 2, 3, 4, generator=g).topk(2, dim=1).indices
    assert torch.isfinite(rc_labels(idx2, routing_correct(e, 0.5), 2)).all()  # E = k: no division by zero


def test_latent_gate_ignores_the_input_and_conv_gate_does_not():
    torch.manual_seed(0)
    x1, x2 = torch.randn(1, 4, 6, 8), torch.randn(1, 4, 6, 8)
    latent = SMoEHead(4, (6, 8), SMoEConfig(gate="latent"))
    assert torch.equal(latent.routing_weights(x1), latent.routing_weights(x2))
    conv = SMoEHead(4, (6, 8), SMoEConfig(gate="conv"))
    assert not torch.equal(conv.routing_weights(x1), conv.routing_weights(x2))
    with pytest.raises(ValueError, match="gate: conv"):
        latent.routing_weights(torch.randn(1, 4, 5, 8))


def test_gate_learns_only_from_the_rc_loss():
    torch.manual_seed(0)
    layer = smoe.SMoE(C, (H, W), SMoEConfig(rc_loss=True))
    torch.nn.init.normal_(layer.smoe.experts.weight)
    b = net_batch()
    a, _ = layer(b)
    task = ((a - b["y"]) ** 2).mean()
    task.backward(retain_graph=True)
    assert layer.smoe.gate.map.grad is None or (layer.smoe.gate.map.grad == 0).all()
    layer.smoe.rc_loss(task).backward()
    assert layer.smoe.gate.map.grad.abs().sum() > 0


def test_smoe_config_is_validated():
    with pytest.raises(ValueError, match="gate"):
        SMoEConfig(gate="linear")
    with pytest.raises(ValueError, match="experts"):
        SMoEConfig(experts=1)


class _Payload:
    """Unpickling this runs code: it creates the file named in ``target``."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_loading_a_checkpoint_runs_no_code(tmp_path):
    """A crafted checkpoint whose pickle would create a file is refused with one error, and no file appears."""
    from postcast.models.module import load_checkpoint

    planted = tmp_path / "created_by_the_checkpoint"
    path = tmp_path / "evil.ckpt"
    torch.save({"postcast": {"format_version": 2}, "state_dict": {}, "hook": _Payload(str(planted))}, path)
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(str(path))
    assert not planted.exists()


def _saved_checkpoint(path):
    """A real Lightning checkpoint of a small EMOS model with non-trivial weights (Trainer.save_checkpoint
    runs the module's on_save_checkpoint, which records the content checksum)."""
    import lightning as L

    torch.manual_seed(0)
    model = build("emos")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.strategy.connect(model)
    trainer.save_checkpoint(path)
    return model


def test_a_bit_flipped_or_truncated_checkpoint_is_refused(tmp_path):
    """One flipped bit in a weight (torch.load itself does not notice) or a truncated file is refused."""
    from postcast.models.module import load_checkpoint

    good = tmp_path / "good.ckpt"
    model = _saved_checkpoint(good)
    loaded, meta = load_checkpoint(str(good))
    assert meta["checksum"].startswith("sha256:")
    torch.testing.assert_close(loaded.state_dict(), model.state_dict())
    data = bytearray(good.read_bytes())
    weight = model.state_dict()["net.coef"].numpy().tobytes()
    at = bytes(data).find(weight[:16])
    assert at > 0
    data[at + 2] ^= 0x10  # one bit of the first coefficient
    flipped = tmp_path / "flipped.ckpt"
    flipped.write_bytes(data)
    assert not torch.equal(torch.load(flipped, weights_only=True)["state_dict"]["net.coef"], model.net.coef)
    with pytest.raises(ValueError, match="do not match the checksum"):
        load_checkpoint(str(flipped))
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(str(truncated))


def _fit_mlp(embedding: int, train: dict[str, torch.Tensor], steps: int = 300) -> PostProcessor:
    torch.manual_seed(0)
    model = PostProcessor("mlp", net={"hidden": 32, "embedding": embedding}, sample=SPEC, grid=(H, W), n_members=M)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        mu, sigma = model(train)
        crps_gaussian(mu, sigma, train["y"]).mean().backward()
        opt.step()
    return model


@pytest.mark.system  # trains two MLPs to convergence: minutes of CPU (tests/tiers.py)
def test_the_mlp_learns_each_points_own_bias_through_its_embedding():
    """A truth offset by a bias of its own at every point, independent from point to point, so that no
    smooth function of the inputs explains it: the MLP with 4 learned numbers per point comes within 10 % of
    the oracle's CRPS on 64 new dates (1.06x); without them it stays 50 % or more above (1.77x) (ISSUE 39: the
    MLP presets closed 53-70 % of the raw-to-oracle gap where the synthetic world's bias varies with the place)."""
    bias = 1.5 * torch.randn(H, W, generator=torch.Generator().manual_seed(7))  # (H, W), in units of s

    def world(seed: int) -> dict[str, torch.Tensor]:
        b = batch(64, seed)
        noise = torch.randn(b["m"].shape, generator=torch.Generator().manual_seed(seed + 100))
        return {**b, "y": b["m"] + b["s"] * (bias + noise)}  # truth ~ N(m + s bias, s^2)

    test = world(2)
    oracle = float(crps_gaussian(test["m"] + test["s"] * bias, test["s"], test["y"]).mean())

    def score(model: PostProcessor) -> float:
        with torch.no_grad():
            mu, sigma = model(test)
        return float(crps_gaussian(mu, sigma, test["y"]).mean())

    assert score(_fit_mlp(4, world(1))) < 1.1 * oracle
    assert score(_fit_mlp(0, world(1))) > 1.5 * oracle


@pytest.mark.system  # trains two MLPs: a minute of CPU (tests/tiers.py)
def test_a_smoothed_embedding_learns_a_smooth_bias_from_fewer_dates():
    """A bias that varies slowly over the grid, learned from 6 dates of noise twice its size: read through a
    Gaussian filter of 2 cells, the embedding pools neighbouring points' dates and comes closer to the oracle on
    64 new dates than the same MLP reading each point's own numbers, which learns its 6 dates' noise."""
    lat, lon = torch.meshgrid(torch.linspace(0, torch.pi, H), torch.linspace(0, 2 * torch.pi, W), indexing="ij")
    bias = torch.sin(lat) * torch.cos(lon) + 0.5 * torch.cos(2 * lat)  # (H, W), in units of s

    def world(seed: int, dates: int) -> dict[str, torch.Tensor]:
        b = batch(dates, seed)
        noise = 2.0 * torch.randn(b["m"].shape, generator=torch.Generator().manual_seed(seed + 100))
        return {**b, "y": b["m"] + b["s"] * (bias + noise)}  # truth ~ N(m + s bias, (2 s)^2)

    train, test = world(1, 6), world(2, 64)

    def score(smoothing: float) -> float:
        torch.manual_seed(0)
        net = {"hidden": 16, "embedding": 4, "smoothing": smoothing}
        model = PostProcessor("mlp", net=net, sample=SPEC, grid=(H, W), n_members=M)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(300):
            opt.zero_grad()
            crps_gaussian(*model(train), train["y"]).mean().backward()
            opt.step()
        with torch.no_grad():
            return float(crps_gaussian(*model(test), test["y"]).mean())

    assert score(2.0) < 0.8 * score(0.0)  # measured 1.36 against 2.33 (the oracle: 1.11)


def test_the_embeddings_filter_equals_scipys_gaussian_filter():
    """earth.Smoother against scipy.ndimage: periodic in longitude (``mode="wrap"`` over the whole circle; W
    odd, so that each point is reached one way round) and, in latitude, zero beyond the poles renormalised by
    the filtered ones (the weights that fall off the grid given back to the points on it)."""
    from scipy import ndimage

    h, w, cells = 13, 21, 1.7
    f = np.random.default_rng(3).standard_normal((4, h, w))
    ref = ndimage.gaussian_filter1d(f, cells, axis=2, mode="wrap", truncate=(w // 2) / cells)
    ones = ndimage.gaussian_filter1d(np.ones_like(f), cells, axis=1, mode="constant", truncate=h / cells)
    ref = ndimage.gaussian_filter1d(ref, cells, axis=1, mode="constant", truncate=h / cells) / ones
    got = earth.Smoother((h, w), cells)(torch.from_numpy(f).float())
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["mlp", "unet", "unet_smoe"])
def test_a_smoothed_embedding_keeps_the_checkpoints_parameters(name):
    """The filter is a function of the grid and the width: a model with smoothing has the same state dict keys
    and shapes as one without (checkpoints of either load into the other's architecture)."""
    io = registry.NetIO(C, (H, W), M, V, 1)
    plain = registry.make(name, {"embedding": 3}).build(io)
    smooth = registry.make(name, {"embedding": 3, "smoothing": 2.0}).build(io)
    assert {k: v.shape for k, v in plain.state_dict().items()} == {k: v.shape for k, v in smooth.state_dict().items()}


@pytest.mark.parametrize("name", ["mlp", "unet", "unet_smoe"])
def test_a_negative_smoothing_is_refused_naming_it(name):
    with pytest.raises(ConfigError, match=f"model.net \\({name}\\) smoothing=-1"):
        registry.make(name, {"embedding": 2, "smoothing": -1})


@pytest.mark.parametrize("value", ["abc", True, [1.0]])
def test_a_number_option_given_something_else_is_refused_naming_it(value):
    """A float option (``smoothing``) given text, a boolean or a list: one line naming the option and the value
    (it reached the dataclass unchecked, and ``smoothing: abc`` answered "'<' not supported between instances
    of 'str' and 'int'")."""
    with pytest.raises(ConfigError, match=r"model.net \(mlp\).smoothing: expected a number, got"):
        registry.make("mlp", {"embedding": 2, "smoothing": value})


def test_a_number_option_written_as_yaml_1_1_text_reads_as_the_number():
    """PyYAML reads ``smoothing: 2e0`` (an exponent without a dot) as text: the option takes the number."""
    assert registry.make("mlp", {"embedding": 2, "smoothing": "2e0"}).smoothing == 2.0


@pytest.mark.parametrize("options", [{"layers": 0}, {"hidden": 0}, {"embedding": -1}])
def test_mlp_options_out_of_range_are_refused_naming_them(options):
    with pytest.raises(ConfigError, match=f"model.net \\(mlp\\) .*{next(iter(options))}"):
        registry.make("mlp", options)


def test_the_model_record_names_the_network_and_the_predictive_family_apart(tmp_path):
    """PostProcessor.meta: the checkpoint's ``family`` key is the network kind (``network``), ``distribution``
    the predictive law (``family``); a saved and reloaded checkpoint gives the same record."""
    import lightning as L

    from postcast.models.hyperparameters import ModelMeta
    from postcast.models.module import load_checkpoint

    model = PostProcessor(
        "mlp", net={"hidden": 8}, sample=SPEC, grid=(H, W), n_members=M, grid_area=(30, 70, 340, 400),
        distribution="truncnormal",
    )  # fmt: skip
    want = ModelMeta("mlp", model.meta.net, "truncnormal", (H, W), (30.0, 70.0, 340.0, 400.0), M)
    assert model.meta == want and model.meta.net["hidden"] == 8
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(model)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    assert load_checkpoint(str(tmp_path / "m.ckpt"))[0].meta == want
    model.set_net_option("form", "standard")
    assert model.meta.net == {**want.net, "form": "standard"} and model.meta.family == "truncnormal"
