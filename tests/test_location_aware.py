"""Location-aware convolutional post-processors (issue 55): a U-Net that reads E learned numbers per grid
point learns what belongs to a place, and every network starts at the raw ensemble's law exactly (residual
form: the head's raw outputs are corrections of the raw ensemble's mean and spread, zero at the start)."""

import pytest
import torch

from postcast.datasets.core.errors import BadInputError, ConfigError
from postcast.models import registry
from postcast.models.kernels import crps_gaussian
from postcast.models.module import PostProcessor
from postcast.models.smoe import GATES

H, W, C, M, V = 12, 16, 9, 6, 3
# 3 input variables (the target's is the second) + 3 location features = C channels
SPEC = {"target": "t850", "variables": ["z", "t", "u"], "season_features": False, "members": True}


def batch(b: int, seed: int) -> dict[str, torch.Tensor]:
    """Physical = normalised inputs (the model's statistics are 0/1), the raw ensemble (m, s) and a truth."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, C, H, W, generator=g)
    m = torch.randn(b, H, W, generator=g)
    return {
        "fields": x[:, : 2 * V],
        "features": x[:, 2 * V :],
        "members": torch.randn(b, M, V, H, W, generator=g),
        "m": m,
        "s": torch.rand(b, H, W, generator=g) + 0.5,
        "y": m + torch.randn(b, H, W, generator=g),
    }


def build(family: str, net: dict | None = None) -> PostProcessor:
    return PostProcessor(family, net=net or {}, sample=SPEC, grid=(H, W), n_members=M)


@pytest.fixture
def one_thread():
    """Tensors this small gain nothing from a second thread; on a busy 2-core machine two spin-waiting threads
    made the training 20x slower (54 s against 2.3 s for 20 steps)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- learning a planted per-point bias --------------------------------------------------------------
BIAS = 1.5 * torch.randn(H, W, generator=torch.Generator().manual_seed(7))  # (H, W), units of s, no pattern


def planted(seed: int, b: int = 8) -> dict[str, torch.Tensor]:
    """``b`` dates whose truth is offset at every point by a bias of its own, drawn independently from point to
    point: no smooth function of the inputs (the location features included) explains it."""
    out = batch(b, seed)
    noise = torch.randn(out["m"].shape, generator=torch.Generator().manual_seed(seed + 100))
    return {**out, "y": out["m"] + out["s"] * (BIAS + noise)}  # truth ~ N(m + s bias, s^2)


def fit(net: dict, steps: int = 200) -> float:
    """Test CRPS relative to the oracle's after ``steps`` Adam steps, each on 8 new dates (a stream: the inputs
    are noise, which a U-Net memorises from a fixed set of dates)."""
    torch.manual_seed(0)
    model = build("unet", net).train()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(steps):
        train = planted(10 + step)
        opt.zero_grad()
        mu, sigma = model(train)
        crps_gaussian(mu, sigma, train["y"]).mean().backward()
        opt.step()
    test = planted(10**6, 32)
    with torch.no_grad():
        mu, sigma = model.eval()(test)
    oracle = crps_gaussian(test["m"] + test["s"] * BIAS, test["s"], test["y"]).mean()
    return float(crps_gaussian(mu, sigma, test["y"]).mean() / oracle)


def test_a_unet_with_an_embedding_learns_each_points_own_bias_and_the_plain_unet_does_not(one_thread):
    """With 4 learned numbers per point the U-Net comes within 10 % of the oracle's CRPS (1.004x); without them
    it stays 30 % or more above (1.70x; the raw ensemble: 1.83x). Its convolutions pad as the globe: with zero
    padding, the plain U-Net read every point's place from the grid's edges on this small grid (1.04x)."""
    with_embedding = fit({"base_filters": 4, "embedding": 4})
    plain = fit({"base_filters": 4})
    assert with_embedding < 1.1
    assert plain > 1.3


def test_the_embedding_binds_the_model_to_its_grid_and_a_negative_count_is_refused():
    net = build("unet", {"base_filters": 4, "embedding": 2}).net.eval()
    with pytest.raises(BadInputError, match="embedding was learned on a \\(12, 16\\) grid"):
        net({"x": torch.randn(1, C, H, 8)})
    with pytest.raises(ConfigError, match="embedding=-1"):
        registry.make("unet", {"embedding": -1})


# --- residual form: the untrained model is the raw ensemble's law ------------------------------------
NETWORKS = [
    ("unet", {"base_filters": 4}),
    ("unet", {"base_filters": 4, "embedding": 3}),
    ("lenet", {"embedding": 3}),
    ("transformer", {"width": 8, "embedding": 3}),
    ("transformer", {"width": 8}),
    ("smoe", {"embedding": 3, "smoe": {"gate": "lcn"}}),
    *[("unet_smoe", {"base_filters": 4, "embedding": 3, "decoder_experts": 2, "smoe": {"gate": g}}) for g in GATES],
    ("unet_smoe", {"base_filters": 4, "embedding": 3, "head": 8, "norm": "none", "smoe": {"gate": "latent"}}),
]


@pytest.mark.parametrize(("family", "net"), NETWORKS, ids=[f"{f}-{n}" for f, n in NETWORKS])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_every_untrained_network_is_the_raw_ensembles_law_exactly(family, net, mode):
    """mu = m and sigma = s to the bit, in training mode (BatchNorm on the batch, gate noise) and in eval mode;
    identical members (s floored) included."""
    model = build(family, {**net, **({"smoe": {**net["smoe"], "noise": 1.0}} if "smoe" in net else {})})
    model.train(mode == "train")
    b = batch(2, 0)
    b["members"][1] = b["members"][1, :1]  # the second date: every member equal (z's std floored)
    with torch.no_grad():
        mu, sigma = model(b)
    assert torch.equal(mu, b["m"])
    assert torch.equal(sigma, b["s"])
