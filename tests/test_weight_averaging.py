"""``ema_decay``: a training run validated, selected and checkpointed on an exponential moving average of its
weights, checked against the average worked by hand from the same run's weights without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from postcast.pipeline import train

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 3  # one training step each (limit_train_batches 1); the plateau schedule cannot halve the rate in 3


def _fit(store: Path, root: Path, *extra: str) -> Path:
    """A small U-Net (the T850 preset, narrowed) fitted for EPOCHS one-step epochs; its checkpoint directory."""
    train.run(
        [
            "fit",
            "-c",
            str(ROOT / "configs/train/unet_t850.yaml"),
            "--data.cfg.store",
            str(store),
            "--data.cfg.batch_size",
            "2",
            "--model.net.base_filters",
            "4",
            "--model.net.embedding",
            "2",
            "--model.net.head",
            "8",
            "--trainer.default_root_dir",
            str(root),
            "--trainer.max_epochs",
            str(EPOCHS),
            "--trainer.limit_train_batches",
            "1",
            "--trainer.limit_val_batches",
            "1",
            "--trainer.enable_model_summary",
            "false",
            *extra,
        ]
    )
    return root / "lightning_logs/version_0/checkpoints"


def _weights(path: Path, key: str = "state_dict") -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)[key]


@pytest.mark.system  # two small trainings (tests/tiers.py)
def test_the_checkpoint_holds_the_moving_average_of_the_steps_weights(store, tmp_path):
    """Without averaging, every epoch's checkpoint gives the weights w_k after step k. With ``--ema_decay d``
    the same seed takes the same steps, and its last checkpoint must hold a_1 = w_1,
    a_k = d a_(k-1) + (1 - d) w_k, with the current weights w_3 beside them (for a resumed fit)."""
    plain = _fit(store, tmp_path / "plain", "--checkpoint.save_top_k", "-1")
    steps = [_weights(next(plain.glob(f"best-epoch={k}-*.ckpt"))) for k in range(EPOCHS)]
    decay = 0.5
    averaged = _fit(store, tmp_path / "ema", "--ema_decay", str(decay)) / "last.ckpt"

    by_hand = dict(steps[0])
    for w in steps[1:]:
        by_hand = {n: decay * by_hand[n] + (1 - decay) * w[n] for n in w}
    got = _weights(averaged)
    assert got.keys() == by_hand.keys()
    moved = [n for n in got if not torch.equal(steps[0][n], steps[-1][n])]
    assert moved, "the steps changed no weight: the check would be empty"
    for name in got:
        torch.testing.assert_close(got[name], by_hand[name], rtol=0, atol=1e-6, msg=name)
    current = _weights(averaged, "current_model_state")
    for name in current:
        torch.testing.assert_close(current[name], steps[-1][name], rtol=0, atol=0, msg=name)


def test_a_decay_outside_zero_to_one_is_refused_naming_it():
    """``--ema_decay 1.5`` (or 0, or 1) is refused by the parser before anything runs, naming the option and the
    rule (``postcast train`` then exits 2; a pipeline's ``config validate`` reports the line)."""
    for bad in ("1.5", "0", "1"):
        with pytest.raises(ValueError, match=r'"ema_decay".*v>0 and v<1.*Given value: ' + bad.replace(".", r"\.")):
            train.resolve(["--config", str(ROOT / "configs/train/unet_t850.yaml"), "--ema_decay", bad])
