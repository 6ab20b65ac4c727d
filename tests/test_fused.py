"""Seeds as one fused array (models/fused.py, issue 55): S copies of a network trained together equal the same
S trained one after another with torch.optim.Adam, to float round-off, each with its own learning rate and
its own early stopping."""

import time

import pytest
import torch

from postcast.datasets.core.errors import ConfigError
from postcast.models.convnets import LeNet, UNet
from postcast.models.fused import FusedAdam, FusedArray
from postcast.models.kernels import crps_gaussian

H, W, C = 8, 12, 5
LRS = [1e-3, 3e-3, 1e-2]  # a seed each, with a small sweep of learning rates


def data(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(4, H, W, generator=g)
    return {"x": torch.randn(4, C, H, W, generator=g), "m": m, "s": torch.ones(4, H, W), "y": m + 0.5}


def members(arch: str = "lenet") -> list[torch.nn.Module]:
    out = []
    for seed in range(len(LRS)):
        torch.manual_seed(seed)
        net = LeNet(C, widths=(8, 8, 4), grid=(H, W), embedding=2) if arch == "lenet" else UNet(C, base=4)
        for p in net.parameters():  # leave the zero start: every parameter moves from step one
            torch.nn.init.normal_(p, std=0.3)
        out.append(net)
    return out


def loss_of(a: torch.Tensor, b: torch.Tensor, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """The mean CRPS of (mu, sigma) = (m + s a, s exp b) over the batch's trailing (B, H, W) axes."""
    return crps_gaussian(d["m"] + d["s"] * a, d["s"] * torch.exp(b), d["y"]).mean(dim=(-3, -2, -1))


def sequential(nets: list[torch.nn.Module], steps: int, stop_after: list[int]) -> float:
    t0 = time.perf_counter()
    for net, lr, stop in zip(nets, LRS, stop_after, strict=True):
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        for i in range(min(steps, stop)):
            opt.zero_grad()
            loss_of(*net(data(i)), data(i)).backward()
            opt.step()
    return time.perf_counter() - t0


def fused(array: FusedArray, steps: int, stop_after: list[int]) -> float:
    opt = FusedAdam(array, LRS)
    t0 = time.perf_counter()
    for i in range(steps):
        array.active = torch.tensor([i < s for s in stop_after])  # each member's own early stopping
        opt.zero_grad()
        a, b = array(data(i))  # each (S, B, H, W)
        loss_of(a, b, data(i)).sum().backward()  # (S,) -> each member's gradient is its own loss's
        opt.step()
    return time.perf_counter() - t0


@pytest.fixture
def one_thread():
    """Tensors this small gain nothing from a second thread; on a busy 2-core machine two spin-waiting threads
    made the training 20x slower (54 s against 2.3 s for 20 steps)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("stop_after", [[6, 6, 6], [2, 6, 4]])
def test_a_fused_array_trains_each_member_as_sequential_training_does(stop_after, one_thread):
    """Every parameter and buffer (BatchNorm's running statistics, the embedding) of each member, with its own
    learning rate and its own early stopping (its last step), and its outputs in eval mode."""
    seq, together = members(), members()
    array = FusedArray(together).train()
    for net in seq:
        net.train()
    t_seq = sequential(seq, 6, stop_after)
    t_fused = fused(array, 6, stop_after)
    print(f"3 members x 6 steps: sequential {t_seq:.3f} s, fused {t_fused:.3f} s, speed-up {t_seq / t_fused:.2f}")
    for s, net in enumerate(seq):
        back = array.member(s, net)
        for (name, p), q in zip(net.state_dict().items(), back.state_dict().values(), strict=True):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=f"member {s} {name}")
    d = data(99)
    a, _ = array.eval()(d)
    torch.testing.assert_close(a[1], seq[1].eval()(d)[0], rtol=1e-4, atol=1e-5)


def test_a_fused_unet_array_gives_each_member_its_own_outputs_and_gradients(one_thread):
    """The U-Net (BatchNorm, Earth padding, pooling, bilinear up-sampling) fused: each member's training-mode
    outputs and the gradient of its own loss equal the member's alone. (Over several Adam steps its convolution
    biases before a BatchNorm, whose gradient is round-off alone, take steps of the learning rate in any two
    runs: the multi-step equality is the LeNet's, above.)"""
    seq, together = members("unet"), members("unet")
    array = FusedArray(together).train()
    d = data(0)
    a, b = array(d)  # (S, B, H, W) each
    loss_of(a, b, d).sum().backward()
    for s, net in enumerate(seq):
        own = net.train()(d)
        torch.testing.assert_close(torch.stack([a[s], b[s]]), torch.stack(own), rtol=1e-4, atol=1e-5)
        loss_of(*own, d).backward()
        for (name, p), stacked in zip(net.named_parameters(), array.stacked, strict=True):
            torch.testing.assert_close(stacked.grad[s], p.grad, rtol=1e-4, atol=1e-5, msg=f"member {s} {name}")


def test_a_fused_array_refuses_mixed_architectures_and_a_wrong_number_of_learning_rates():
    with pytest.raises(ConfigError, match="same architecture"):
        FusedArray([UNet(C, base=4), UNet(C, base=8)])
    with pytest.raises(ConfigError, match="2 learning rates for a fused array of 3"):
        FusedAdam(FusedArray(members()), [1e-3, 1e-3])
