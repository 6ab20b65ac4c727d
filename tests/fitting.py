"""Options shared by the tests that run ``postcast train fit``."""

from __future__ import annotations

from pathlib import Path


def quiet_fit(store: Path, root: Path) -> list[str]:
    """The options of a test's ``train fit`` on ``store``: its log folder, no progress bar, no model summary."""
    options = {"--data.cfg.store": store, "--trainer.default_root_dir": root}
    quiet = {"--trainer.enable_progress_bar": "false", "--trainer.enable_model_summary": "false"}
    return [str(x) for kv in {**options, **quiet}.items() for x in kv]
