"""The regime world (``SynthConfig.regimes``, issue 55): the Gaussian targets' forecast error follows four
regimes, land or ocean by blocked or zonal flow, with the oracle computed as for the default world."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from postcast.datasets.core.config import read_yaml
from postcast.datasets.schema import Grid
from postcast.datasets.synth import truth
from postcast.datasets.synth.config import SynthConfig
from postcast.datasets.synth.truth import REGIMES, World

ROOT = Path(__file__).resolve().parents[1]

DATES = pd.date_range("2016-01-02", periods=24, freq="15D")


def crps(mu: np.ndarray, sigma: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Closed-form Gaussian CRPS, from scipy's normal (not postcast's)."""
    z = (y - mu) / sigma
    return sigma * (z * (2 * stats.norm.cdf(z) - 1) + 2 * stats.norm.pdf(z) - 1 / np.sqrt(np.pi))


@pytest.fixture(scope="module")
def draws() -> dict[str, np.ndarray]:
    """T850 at +48 h on the 10 deg grid over 24 dates: oracle, truth, raw ensemble and the regime, stacked."""
    w = World(0, Grid(10.0), regimes=True)
    rows = [(w.oracle("t850", t, 48), w.regime(t + pd.Timedelta(hours=48))) for t in DATES]
    out = {k: np.stack([o[k] for o, _ in rows]) for k in ("truth", "mean", "std", "ens_mean", "ens_std")}
    return {**out, "regime": np.stack([r for _, r in rows])}


def test_the_oracle_beats_the_raw_ensemble_in_the_regime_world(draws):
    oracle = crps(draws["mean"], draws["std"], draws["truth"]).mean()
    raw = crps(draws["ens_mean"], draws["ens_std"], draws["truth"]).mean()
    assert oracle < 0.8 * raw


def test_every_regime_occurs_and_their_errors_differ(draws):
    """The oracle's std relative to the members' spread (the under-dispersion, floored) has its own level in each
    regime, and the oracle's bias relative to its std has its own mean."""
    regime = draws["regime"]
    shares = np.bincount(regime.ravel(), minlength=len(REGIMES)) / regime.size
    assert (shares > 0.05).all(), shares
    ratio = draws["std"] / draws["ens_std"]
    spread = np.array([np.median(ratio[regime == r]) for r in range(len(REGIMES))])
    assert spread.max() / spread.min() > 1.5, spread
    bias = (draws["mean"] - draws["ens_mean"]) / draws["std"]
    means = np.array([bias[regime == r].mean() for r in range(len(REGIMES))])
    assert np.ptp(means) > 0.3, means


def test_the_default_world_has_no_regimes_and_its_config_is_unchanged():
    """Off by default: the truth does not depend on the regime map, and the default config's attributes (so its
    stores' checksums) carry no regimes key."""
    assert "regimes" not in SynthConfig().to_dict()
    assert SynthConfig(regimes=True).to_dict()["regimes"] is True
    t = DATES[0]
    plain, regimes = World(0, Grid(10.0)), World(0, Grid(10.0), regimes=True)
    np.testing.assert_array_equal(plain.target_members("t850", t, 48), regimes.target_members("t850", t, 48))
    assert not np.array_equal(plain.oracle("t850", t, 48)["std"], regimes.oracle("t850", t, 48)["std"])
    assert truth.world(0, 10.0, regimes=True).regimes


def test_the_regimes_preset_is_a_small_regime_world():
    cfg = SynthConfig(**{k: v for k, v in read_yaml(ROOT / "configs/synth/regimes.yaml").items() if k != "kind"})
    assert cfg.regimes and cfg.resolution >= 10.0
