"""How a local EMOS fit ended, per fit and merged over the bands of one: the convergence criterion's values and
the training CRPS before and after, recorded in the checkpoint and ``summary.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class FitReport:
    """How the fit ended: the convergence criterion's values, recorded in the checkpoint."""

    method: str
    iterations: int
    points: int
    converged_points: int  # gradient or Newton decrement below tolerance
    stalled_points: int  # no step lowers the CRPS in float64 (at the optimum to machine precision)
    limit_points: int  # the csg's at its censored-normal limit: the CRPS still falling along the shift, the
    # remaining fall to the limit (``limit_gap_max``) below ``tol_limit`` (1 + CRPS)
    limit_gap_max: float
    grad_norm_max: float  # max over points of max |gradient|
    newton_decrement_max: float  # max over points of the last predicted decrease
    tol_grad: float
    tol_decrease: float
    crps_raw: float  # mean training CRPS at theta = 0 (the raw ensemble in this family)
    crps_start: float
    crps_fit: float
    seconds: float
    kept_points: int = 0  # left at their local fit by a shrinkage (emos_select: the sh form's far basin), settled there

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)

    @classmethod
    def merged(cls, reports: list[FitReport]) -> FitReport:
        """One report for fits of disjoint sets of points (the bands of :func:`fit_bands`): counts summed,
        worst criteria kept, mean CRPS weighted by points."""

        def mean(key: str) -> float:
            return sum(getattr(r, key) * r.points for r in reports) / max(1, sum(r.points for r in reports))

        first = reports[0]
        return cls(
            method=first.method,
            iterations=max(r.iterations for r in reports),
            points=sum(r.points for r in reports),
            converged_points=sum(r.converged_points for r in reports),
            stalled_points=sum(r.stalled_points for r in reports),
            limit_points=sum(r.limit_points for r in reports),
            limit_gap_max=max(r.limit_gap_max for r in reports),
            grad_norm_max=max(r.grad_norm_max for r in reports),
            newton_decrement_max=max(r.newton_decrement_max for r in reports),
            tol_grad=first.tol_grad,
            tol_decrease=first.tol_decrease,
            crps_raw=mean("crps_raw"),
            crps_start=mean("crps_start"),
            crps_fit=mean("crps_fit"),
            seconds=sum(r.seconds for r in reports),
            kept_points=sum(r.kept_points for r in reports),
        )
