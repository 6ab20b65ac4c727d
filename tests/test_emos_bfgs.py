"""The per-point BFGS polish (models/emos_bfgs.py) on problems whose minimum is known in closed form."""

from __future__ import annotations

import torch

from postcast.models import emos_bfgs


def rosenbrock(a: torch.Tensor, b: float) -> emos_bfgs.ValueGrad:
    """Independent 2-D Rosenbrock valleys, one per point: (a - x)^2 + b (y - x^2)^2, minimum 0 at (a, a^2)."""

    def value_grad(theta: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, at = theta[:, 0], theta[:, 1], a[idx]
        f = (at - x) ** 2 + b * (y - x**2) ** 2
        g = torch.stack([-2 * (at - x) - 4 * b * x * (y - x**2), 2 * b * (y - x**2)], dim=1)
        return f, g

    return value_grad


def test_polish_reaches_each_valleys_minimum():
    """Four points, each its own narrow curved valley (b = 1e4: 100 times Rosenbrock's), from (-1.2, 1) with the
    identity as inverse Hessian: every point ends at its own (a, a^2), its gradient below the tolerance."""
    a = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=torch.float64)
    start = torch.tensor([[-1.2, 1.0]], dtype=torch.float64).repeat(4, 1)
    eye = torch.eye(2, dtype=torch.float64).repeat(4, 1, 1)
    theta, f, g, done = emos_bfgs.polish(start, eye, rosenbrock(a, 1e4), 2000, torch.full((4,), 1e-9))
    assert bool(done.all()), (f, g)
    torch.testing.assert_close(theta, torch.stack([a, a**2], dim=1), rtol=0, atol=1e-7)


def test_polish_never_ends_above_its_start():
    """With too few iterations to get there, each point ends no higher than where it started, and a point
    already at its minimum does not move."""
    a = torch.tensor([1.0, 2.0], dtype=torch.float64)
    start = torch.tensor([[-1.2, 1.0], [2.0, 4.0]], dtype=torch.float64)
    value_grad = rosenbrock(a, 1e4)
    f0, _ = value_grad(start, torch.arange(2))
    theta, f, _, done = emos_bfgs.polish(start, torch.eye(2, dtype=torch.float64).repeat(2, 1, 1), value_grad, 3,
                                         torch.full((2,), 1e-9))  # fmt: skip
    assert bool((f <= f0).all()) and bool(done[1]) and torch.equal(theta[1], start[1])
    torch.testing.assert_close(f, value_grad(theta, torch.arange(2))[0], rtol=0, atol=0)


def test_the_line_search_trials_read_values_only():
    """Given a value function, the line searches' trials (up to HALVINGS per iteration) call it and not the
    gradient's: the gradient once per iteration and once at the start; the path is the same as without it. On
    the targets world's tp24 sh fit of 160 points the polish's trials had taken a backward pass each."""
    a = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=torch.float64)
    start = torch.tensor([[-1.2, 1.0]], dtype=torch.float64).repeat(4, 1)
    eye = torch.eye(2, dtype=torch.float64).repeat(4, 1, 1)
    value_grad, calls = rosenbrock(a, 1e4), {"value_grad": 0, "value": 0}

    def counted(theta: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls["value_grad"] += 1
        return value_grad(theta, idx)

    def value(theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        calls["value"] += 1
        return value_grad(theta, idx)[0]

    iterations = 60
    plain = emos_bfgs.polish(start, eye, value_grad, iterations, torch.full((4,), 1e-9))
    trials = emos_bfgs.polish(start, eye, counted, iterations, torch.full((4,), 1e-9), value)
    assert calls["value_grad"] <= iterations + 1 < calls["value"], calls
    for x, y in zip(plain, trials, strict=True):
        assert torch.equal(x, y)
