"""Store integrity: chunk checksums recorded at ingest, ``postcast inspect --verify``, and training that
stops on non-finite inputs instead of finishing with ``val_crps=nan``."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from postcast.cli import main
from postcast.datasets import contract, integrity

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def copy(store, tmp_path):
    out = tmp_path / "store.zarr"
    shutil.copytree(store, out)
    return out


def _rows(path: Path, split: str) -> np.ndarray:
    ds = contract.open_store(path)
    return np.flatnonzero(ds[contract.SPLIT].values == contract.split_code(split))


def _chunks_of(path: Path, array: str, row: int) -> list[Path]:
    return sorted(p for p in (path / array / "c" / str(row)).rglob("*") if p.is_file())


def _lines(text: str) -> list[str]:
    return [ln for ln in text.strip().splitlines() if ln.strip()]


def test_verify_reports_a_deleted_and_a_truncated_chunk(copy, capsys):
    """A deleted chunk (zarr reads it as NaN, silently) and a truncated one (a blosc error when read)
    are both named by `inspect --verify`, which exits 65 with one line; plain inspect stays quick."""
    assert (copy / integrity.MANIFEST).is_file()  # recorded by ingest
    assert main(["inspect", str(copy), "--verify"]) == 0
    assert "verify     ok" in capsys.readouterr().out
    deleted = _chunks_of(copy, "ens_mean_t", int(_rows(copy, "val")[0]))[0]
    deleted.unlink()
    truncated = _chunks_of(copy, "truth_t850", int(_rows(copy, "train")[0]))[0]
    truncated.write_bytes(truncated.read_bytes()[:7])
    assert main(["inspect", str(copy), "--verify"]) == 65
    out, err = capsys.readouterr()
    assert "complete   NO" in out and "verify     FAILED" in out
    key = deleted.relative_to(copy).as_posix()
    assert f"missing     {key}" in out and f"damaged     {truncated.relative_to(copy).as_posix()}" in out
    assert len(_lines(err)) == 1 and "1 missing, 1 damaged" in err and key in err and "Traceback" not in err


def test_verify_without_checksums_still_finds_an_undecodable_chunk(copy, capsys):
    """A store written before checksums existed is decoded chunk by chunk: a truncated chunk is named."""
    (copy / integrity.MANIFEST).unlink()
    truncated = _chunks_of(copy, "ens_std_t", 0)[0]
    truncated.write_bytes(truncated.read_bytes()[:5])
    assert main(["inspect", str(copy), "--verify"]) == 65
    out, err = capsys.readouterr()
    assert "no checksums recorded" in out and "undecodable" in err and len(_lines(err)) == 1


def test_training_stops_on_a_missing_chunk_instead_of_nan(copy, tmp_path, capsys):
    """One validation date's ens_mean_t2m chunk deleted: training stops with one line naming the chunk and
    exit 66, before it starts (the chunk manifest; it used to finish with exit 0 and val_crps=nan)."""
    for chunk in _chunks_of(copy, "ens_mean_t2m", int(_rows(copy, "val")[0])):
        chunk.unlink()
    code = main(
        [
            "train",
            "fit",
            "-c",
            str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
            "--data.cfg.store",
            str(copy),
            "--trainer.default_root_dir",
            str(tmp_path / "runs"),
            "--trainer.max_epochs",
            "1",
            "--trainer.enable_progress_bar",
            "false",
            "--data.cfg.batch_size",
            "2",
        ]
    )
    err = capsys.readouterr().err
    errors = [ln for ln in _lines(err) if ln.startswith("postcast: error:")]
    assert code == 66, err[-2000:]
    assert len(errors) == 1 and "chunk ens_mean_t2m/c/" in errors[0] and "inspect STORE --verify" in errors[0]
    assert "Traceback" not in err
