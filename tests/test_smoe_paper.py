"""The SMoE as Dryden and Hoefler (2022) describe it, on small exact cases: the gate's gradient with and
without the routing-classification (RC) loss, computed by hand; expert-error damping on the experts'
gradient; the gate variants; the SMoE layer between the U-Net's decoder blocks."""

import pytest
import torch
import torch.nn.functional as F

from postcast.datasets.core.errors import BadInputError, ConfigError
from postcast.models.convnets import UNet
from postcast.models.module import PostProcessor
from postcast.models.smoe import GATES, Gate, SMoEConfig, SMoEHead, SMoELayer, UNetSMoE

E, GRID = 3, (1, 4)  # 3 experts on a 1 x 4 grid, one output channel, top-1
MAP = torch.tensor([[[[2.0, 0.0, 0.0, 1.0]], [[0.0, 3.0, 0.0, 0.0]], [[1.0, 1.0, 2.0, 0.0]]]])  # (1, E, 1, 4)
SELECTED = [0, 1, 2, 0]  # argmax over experts at each point
E_GRAD = torch.tensor([0.1, -0.2, 0.3, -0.4])  # dL/dy at the 4 points: L = sum(E_GRAD * y)


def head(**options) -> tuple[SMoEHead, torch.Tensor]:
    """A latent-gate head with the routing map MAP and 1-channel input x whose experts are known convolutions."""
    torch.manual_seed(0)
    layer = SMoEHead(1, GRID, SMoEConfig(experts=E, quantile=0.5, **options), outputs=1).train()
    with torch.no_grad():
        layer.gate.map.copy_(MAP[0])
        layer.experts.weight.normal_()
    return layer, torch.randn(1, 1, *GRID)


def step(layer: SMoEHead, x: torch.Tensor) -> torch.Tensor:
    """One backward of the task loss (plus the RC loss when on); returns the expert values (1, E, 1, 4)."""
    y = layer(x)  # (1, 1, 1, 4)
    task = (E_GRAD.view(1, 1, 1, 4) * y).sum()
    loss = task + layer.rc_loss(task) if layer.cfg.rc_loss else task
    loss.backward()
    with torch.no_grad():
        return layer.experts(x)


def test_with_the_rc_loss_the_gate_gets_the_bce_gradient_of_the_labels_by_hand_and_no_task_gradient():
    """quantile 0.5 of |e| = (0.1, 0.2, 0.3, 0.4) is 0.25: points 0 and 1 are routed correctly (label 1 for
    the selected expert, 0 for the others), points 2 and 3 not (0 for the selected, 1/2 for each other).
    d BCE-with-logits(R, labels) / dR = (sigmoid(R) - labels) / (E * 4), and nothing from the task loss."""
    layer, x = head(rc_loss=True)
    step(layer, x)
    labels = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 0.5, 0.5], [0.0, 0.0, 0.0, 0.5]]).view(E, 1, 4)
    expected = (torch.sigmoid(MAP[0]) - labels) / (E * 4)
    torch.testing.assert_close(layer.gate.map.grad, expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("weighted", [False, True])
def test_without_the_rc_loss_the_gate_gets_the_task_gradient_at_the_selected_experts(weighted):
    """Unweighted: dL/dR = e at the selected expert (straight through), 0 elsewhere; weighted (y = v R):
    dL/dR = e v at the selected expert."""
    layer, x = head(rc_loss=False, weighted=weighted)
    values = step(layer, x)[0]  # (E, 1, 4)
    expected = torch.zeros(E, 1, 4)
    for p, s in enumerate(SELECTED):
        expected[s, 0, p] = E_GRAD[p] * (values[s, 0, p] if weighted else 1.0)
    torch.testing.assert_close(layer.gate.map.grad, expected, rtol=0, atol=1e-7)


def expert_weight_grad(x: torch.Tensor, weight: torch.Tensor, grad_values: torch.Tensor) -> torch.Tensor:
    """The gradient of a bias-free 3 x 3 convolution's weight for a given gradient of its output (torch's own)."""
    w = weight.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad(F.conv2d(x, w, padding=1), w, grad_outputs=grad_values)
    return g


@pytest.mark.parametrize("damping", [0.0, 0.25, 1.0])
def test_damping_scales_the_experts_gradient_where_routing_was_wrong_and_leaves_the_gate_alone(damping):
    """The experts' values get e at the selected (expert, point) pairs, times ``damping`` at the two points
    routed wrongly (|e| above the quantile); the gate's gradient (RC loss on) does not depend on damping."""
    layer, x = head(rc_loss=True, damping=damping)
    step(layer, x)
    grad_values = torch.zeros(1, E, 1, 4)
    for p, s in enumerate(SELECTED):
        grad_values[0, s, 0, p] = E_GRAD[p] * (1.0 if p < 2 else damping)
    expected = expert_weight_grad(x, layer.experts.weight, grad_values)
    torch.testing.assert_close(layer.experts.weight.grad, expected, rtol=1e-6, atol=1e-7)
    undamped, _ = head(rc_loss=True, damping=1.0)
    step(undamped, x)
    torch.testing.assert_close(layer.gate.map.grad, undamped.gate.map.grad, rtol=0, atol=0)


# --- gate variants ---------------------------------------------------------------------------------
def gate(kind: str, **options) -> Gate:
    torch.manual_seed(0)
    return Gate(4, E, (6, 8), SMoEConfig(experts=E, gate=kind, **options))


@pytest.mark.parametrize("kind", GATES)
def test_every_gate_routes_each_point_and_only_the_grid_free_ones_take_another_grid(kind):
    g = gate(kind).eval()
    x = torch.randn(2, 4, 6, 8)
    assert g(x).shape == (2, E, 6, 8)
    other = torch.randn(2, 4, 4, 8)
    if kind in ("latent", "lcn", "fixed"):
        with pytest.raises(BadInputError, match="grid"):
            g(other)
    else:
        assert g(other).shape == (2, E, 4, 8)


def test_the_fixed_gate_gives_each_expert_a_band_of_latitudes_and_learns_nothing():
    g = gate("fixed")
    chosen = g(torch.randn(1, 4, 6, 8)).argmax(dim=1)[0]  # (6, 8)
    assert chosen[:, 0].tolist() == [0, 0, 1, 1, 2, 2]
    assert (chosen == chosen[:, :1]).all()
    assert not list(g.parameters())
    two = SMoEHead(4, (6, 8), SMoEConfig(experts=E, gate="fixed"), outputs=2)  # the same bands for a and for b
    routed = two.routing_weights(torch.randn(1, 4, 6, 8)).argmax(dim=1)  # (2, 6, 8)
    assert torch.equal(routed[0], chosen) and torch.equal(routed[1], chosen)


def test_coordconv_sees_where_it_is_and_the_conv_gate_does_not():
    """On a constant input a 3 x 3 conv gate is constant away from the border; a CoordConv is not."""
    x = torch.ones(1, 4, 6, 8)
    plain = gate("conv")(x)[..., 1:-1, 1:-1]
    coord = gate("coordconv")(x)[..., 1:-1, 1:-1]
    assert torch.equal(plain, plain[..., :1, :1].expand_as(plain))
    assert not torch.equal(coord, coord[..., :1, :1].expand_as(coord))
    deep = gate("coordconv", gate_layers=3)
    assert deep.convs is not None and sum(isinstance(m, torch.nn.Conv2d) for m in deep.convs) == 3


def test_gate_extras_softmax_absolute_value_and_training_noise():
    x = torch.randn(2, 4, 6, 8)
    soft = gate("conv", normalise=True).eval()(x)
    torch.testing.assert_close(soft.sum(dim=1), torch.ones(2, 6, 8))
    assert (gate("conv", absolute=True).eval()(x) >= 0).all()
    noisy = gate("latent", noise=3.0)
    assert torch.equal(noisy.eval()(x), noisy.eval()(x))
    diff = noisy.train()(x) - noisy.eval()(x)
    assert 0.5 < float(diff.std()) < 1.5  # std noise / E = 1


@pytest.mark.parametrize("options", [{"gate": "linear"}, {"gate_layers": 0}, {"noise": -1.0}])
def test_bad_gate_options_are_refused_naming_them(options):
    with pytest.raises(ConfigError, match=next(iter(options))):
        SMoEConfig(**options)


# --- the SMoE layer between decoder blocks ---------------------------------------------------------
def test_the_hidden_smoe_layer_selects_the_top_c_experts_and_starts_as_the_identity():
    torch.manual_seed(0)
    layer = SMoELayer(4, 8, (6, 8), SMoEConfig(gate="latent"))
    x = torch.randn(2, 4, 6, 8)
    assert torch.equal(layer(x), x)
    torch.nn.init.normal_(layer.experts.weight)
    values, weights = layer.experts(x), layer.gate(x)
    top = weights.topk(4, dim=1).indices  # (2, 4, 6, 8)
    torch.testing.assert_close(layer(x) - x, values.gather(1, top))
    with pytest.raises(ConfigError, match="at least 4 experts"):
        SMoELayer(4, 3, (6, 8), SMoEConfig())


def test_a_unet_with_an_smoe_between_its_decoder_blocks_trains_its_gate_on_an_odd_grid():
    spec = {"target": "t850", "variables": ["z", "t"], "season_features": False}
    net = {"base_filters": 4, "decoder_experts": 2, "smoe": {"gate": "latent"}}
    model = PostProcessor("unet_smoe", net=net, sample=spec, grid=(13, 10), n_members=4).train()
    (layer,) = model.net.trunk.between
    assert layer.gate.map.shape == (16, 8, 6)  # 2 x 8 experts on the padded 16 x 12 grid halved once
    torch.nn.init.normal_(layer.experts.weight)
    torch.nn.init.normal_(model.net.smoe.experts.weight)
    g = torch.Generator().manual_seed(0)
    b = {
        "fields": torch.randn(2, 4, 13, 10, generator=g),
        "features": torch.randn(2, 3, 13, 10, generator=g),
        "m": torch.zeros(2, 13, 10),
        "s": torch.ones(2, 13, 10),
        "y": torch.randn(2, 13, 10, generator=g),
    }
    mu, _ = model(b)
    mu.square().mean().backward()
    assert layer.gate.map.grad is not None and layer.gate.map.grad.abs().sum() > 0


def test_the_unet_smoe_with_a_head_is_the_unet_plus_the_routed_experts():
    """``head: n``: the U-Net's pointwise head beside the SMoE, outputs added. With the U-Net's weights copied in,
    the U-Net + SMoE's answer is the U-Net's plus, at each point, the selected expert's value (worked from the
    experts' convolution and the gate's argmax)."""
    shape = {"base": 4, "grid": (6, 8), "embedding": 2, "norm": "none", "head": 8}  # (a, b): 2 outputs
    torch.manual_seed(0)
    unet = UNet(5, **shape).eval()
    both = UNetSMoE(5, cfg=SMoEConfig(experts=E), **shape).eval()
    torch.nn.init.normal_(unet.head.net[-1].weight)  # a U-Net that corrects something
    missing = both.load_state_dict(unet.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["smoe.experts.weight", "smoe.gate.map"]  # all else is the U-Net's
    torch.nn.init.normal_(both.smoe.experts.weight)
    x = torch.randn(2, 5, 6, 8, generator=torch.Generator().manual_seed(1))  # (B, C, H, W)
    with torch.no_grad():
        alone = torch.stack(unet({"x": x}), 1)  # (B, 2, H, W): the U-Net's (a, b)
        together = torch.stack(both({"x": x}), 1)
        feats = both.trunk(x)  # (B, 4 + 2, H, W)
        values = both.smoe.experts(feats).view(2, 2, E, 6, 8)  # (B, K, E, H, W)
        pick = both.smoe.gate(feats).view(2, 2, E, 6, 8).argmax(2, keepdim=True)
    torch.testing.assert_close(together, alone + values.gather(2, pick).squeeze(2))
