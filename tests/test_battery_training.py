"""The battery's training and evaluation cases (issue 29): damaged, deleted and absent store data, checkpoints
that do not fit the store or are not checkpoints, and YAML that is too big, an alias bomb or not UTF-8. Each
case is one line on stderr with exit 2, 65 or 66 and no traceback (tests/battery.py); run in-process."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import zarr
from battery import assert_ok, in_process

from postcast.datasets.core import config
from postcast.datasets.ingest.run import IngestConfig, ingest

ROOT = Path(__file__).resolve().parents[1]
PRESET = str(ROOT / "configs/train/tiny_emos_t2m.yaml")


# --- inputs -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from postcast.pipeline import train

    root = tmp_path_factory.mktemp("battery_training") / "runs"
    cli = train.run(
        [
            "fit",
            "-c",
            PRESET,
            "--data.cfg.store",
            str(store),
            "--trainer.default_root_dir",
            str(root),
            "--trainer.max_epochs",
            "1",
            "--trainer.enable_model_summary",
            "false",
        ]
    )
    assert cli.trainer.checkpoint_callback is not None
    return Path(cli.trainer.checkpoint_callback.best_model_path)


def _copy(store: Path, out: Path) -> Path:
    shutil.copytree(store, out)
    return out


def _chunk(store: Path, row: int, name: str = "ens_mean_t2m") -> Path:
    return store / name / "c" / str(row) / "0" / "0" / "0"


def _train_row(store: Path) -> int:
    return int((zarr.open_group(store, mode="r")["split"][:] == 0).nonzero()[0][1])


def _overwrite_start(chunk: Path) -> None:
    """Same size (the manifest's size check passes), undecodable (the codec's header is gone)."""
    data = bytearray(chunk.read_bytes())
    data[:32] = bytes(32)
    chunk.write_bytes(bytes(data))


def _without(store: Path, out: Path, variable: str) -> Path:
    """A copy of ``store`` without ``variable``, its ensemble mean and std, and their statistics (the
    consolidated metadata edited to match, as a store ingested without the variable has none)."""
    _copy(store, out)
    drop = {variable, f"ens_mean_{variable}", f"ens_std_{variable}"}
    for root, gone in (
        (out, lambda k: k in drop),
        (out / "statistics", lambda k: any(k.startswith(f"{n}_") for n in drop)),
    ):
        meta = json.loads((root / "zarr.json").read_text())
        held = (meta.get("consolidated_metadata") or {}).get("metadata", {})
        for key in [k for k in held if gone(k.split("/")[-1])]:
            del held[key]
        (root / "zarr.json").write_text(json.dumps(meta))
        for p in [p for p in root.iterdir() if p.is_dir() and gone(p.name)]:
            shutil.rmtree(p)
    return out


@pytest.fixture(scope="module")
def no_sst(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _without(store, tmp_path_factory.mktemp("battery_training") / "no_sst.zarr", "sst")


@pytest.fixture(scope="module")
def coarse(synth_zarr: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same data on a 20 degree grid (10 x 18; the checkpoints are trained on 19 x 36)."""
    out = tmp_path_factory.mktemp("battery_training") / "coarse.zarr"
    ingest(IngestConfig(source=str(synth_zarr), out=str(out), grid=20.0, processes=False, progress=False))
    return out


def _bomb(levels: int) -> str:
    """A training preset whose ``model.net`` holds 10**levels strings through nested aliases."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    lines.append(f"model: {{family: emos, net: {{bomb: *l{levels - 1}}}}}")
    return "\n".join(lines) + "\n"


def _train(store: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "train",
        "fit",
        "-c",
        PRESET,
        "--data.cfg.store",
        str(store),
        "--trainer.default_root_dir",
        str(tmp_path / "runs"),
        "--trainer.max_epochs",
        "1",
        *extra,
    ]


def _no_checkpoint(tmp_path: Path) -> bool:
    return not list((tmp_path / "runs").rglob("*.ckpt"))


def _evaluate(store: Path, out: Path, *extra: str) -> list[str]:
    return ["evaluate", str(store), "--out", str(out), "--bootstrap", "5", *extra]


# --- train --------------------------------------------------------------------------------------------
@pytest.mark.battery
def test_train_store_without_a_variable_the_preset_reads(no_sst, tmp_path, capsys):
    """Before: internal error, KeyError: "No variable named 'ens_mean_sst_point_mean'"."""
    res = in_process(_train(no_sst, tmp_path), capsys)
    assert_ok("train fit: store without sst", res, _no_checkpoint(tmp_path))
    assert res.code == 66 and "ens_mean_sst" in res.error_lines[0] and "data.cfg.sample.variables" in res.error_lines[0]


@pytest.mark.battery
def test_train_truncated_and_undecodable_chunks(store, tmp_path, capsys):
    """Before: a traceback of RuntimeError: blosc encoded value is invalid (plain loader), or a hang."""
    row = _train_row(store)
    truncated = _copy(store, tmp_path / "truncated.zarr")
    _chunk(truncated, row).write_bytes(_chunk(truncated, row).read_bytes()[:20])
    res = in_process(_train(truncated, tmp_path), capsys)
    assert_ok("train fit: truncated chunk", res, _no_checkpoint(tmp_path))
    assert res.code == 65 and f"ens_mean_t2m/c/{row}/0/0/0" in res.error_lines[0]
    damaged = _copy(store, tmp_path / "damaged.zarr")
    for r in (zarr.open_group(damaged, mode="r")["split"][:] == 0).nonzero()[0]:
        _overwrite_start(_chunk(damaged, int(r)))
    res = in_process(_train(damaged, tmp_path, "--data.cfg.loader", "plain"), capsys)
    assert_ok("train fit: undecodable chunk (plain loader)", res, _no_checkpoint(tmp_path))
    assert res.code == 65 and "cannot be decoded" in res.error_lines[0] and "ens_mean_t2m/c/" in res.error_lines[0]


@pytest.mark.battery
def test_train_deleted_chunk_of_a_store_without_manifest(store, tmp_path, capsys):
    """Without ingest's chunk manifest a deleted chunk reads as NaN: the training step's finiteness check
    (models/module.py) still stops it, with one line and exit 65."""
    bare = _copy(store, tmp_path / "bare.zarr")
    (bare / "postcast-chunks.json").unlink()
    val = int((zarr.open_group(bare, mode="r")["split"][:] == 1).nonzero()[0][0])
    _chunk(bare, val).unlink()
    res = in_process(_train(bare, tmp_path), capsys)
    assert_ok("train fit: deleted chunk, store without chunk manifest", res)
    assert res.code == 65 and "non-finite m" in res.error_lines[0]


@pytest.mark.battery
def test_train_yaml_alias_bomb(store, tmp_path, capsys):
    """Before (5 levels: 10**5 strings): parsed, expanded and passed to the model (9 levels: a traceback)."""
    preset = tmp_path / "bomb.yaml"
    preset.write_text(_bomb(5))
    res = in_process(_train(store, tmp_path, "-c", str(preset)), capsys)
    assert_ok("train fit: YAML alias bomb", res, _no_checkpoint(tmp_path))
    line = res.error_lines[0]
    assert res.code == 2 and str(preset) in line and f"{config.MAX_YAML_NODES} nodes" in line


# --- evaluate -------------------------------------------------------------------------------------------
@pytest.mark.battery
def test_evaluate_deleted_damaged_and_undecodable_chunks(store, tmp_path, capsys):
    """Before: deleted: internal error "'list' argument must have no negative elements"; undecodable
    (--split train): internal error RuntimeError: blosc encoded value is invalid."""
    last = int(zarr.open_group(store, mode="r")["init_time"].shape[0]) - 1
    deleted = _copy(store, tmp_path / "deleted.zarr")
    _chunk(deleted, last).unlink()
    truncated = _copy(store, tmp_path / "truncated.zarr")
    _chunk(truncated, last).write_bytes(b"x")
    undecodable = _copy(store, tmp_path / "undecodable.zarr")
    _overwrite_start(_chunk(undecodable, _train_row(store)))
    for case, bad, code, says, extra in (
        ("evaluate: deleted chunk", deleted, 66, "is missing", ()),
        ("evaluate: truncated chunk", truncated, 65, "is damaged", ()),
        ("evaluate --split train: undecodable chunk", undecodable, 65, "cannot be decoded", ("--split", "train")),
    ):
        out = tmp_path / case.split(": ")[1].replace(" ", "_")
        res = in_process(_evaluate(bad, out, "--targets", "t2m", *extra), capsys)
        assert_ok(case, res, not (out / "metrics.json").exists())
        assert res.code == code and says in res.error_lines[0] and "ens_mean_t2m/c/" in res.error_lines[0]


@pytest.mark.battery
def test_evaluate_checkpoint_that_does_not_fit_the_store(ckpt, coarse, no_sst, tmp_path, capsys):
    """Before: internal errors, "The size of tensor a (18) must match ..." and KeyError 'ens_mean_sst'."""
    for case, bad, says in (
        ("evaluate: checkpoint of another grid", coarse, "grid (19, 36) (lat x lon), the store (10, 18)"),
        ("evaluate: checkpoint reads variables the store lacks", no_sst, "ens_mean_sst"),
    ):
        out = tmp_path / case.split(": ")[1].replace(" ", "_")
        res = in_process(_evaluate(bad, out, "--checkpoints", str(ckpt)), capsys)
        assert_ok(case, res, not (out / "metrics.json").exists())
        assert res.code == 65 and says in res.error_lines[0] and "does not fit the store" in res.error_lines[0]


class _Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("true",))


@pytest.mark.battery
def test_evaluate_crafted_pickle_gets_no_advice_to_unpickle(store, tmp_path, capsys):
    """Before: the refusal quoted torch: "Re-running `torch.load` with `weights_only` set to `False` will
    likely succeed"."""
    crafted = tmp_path / "crafted.ckpt"
    torch.save({"postcast": {}, "hook": _Payload()}, crafted)
    out = tmp_path / "out"
    res = in_process(_evaluate(store, out, "--checkpoints", str(crafted)), capsys)
    assert_ok("evaluate: crafted pickle checkpoint", res, not (out / "metrics.json").exists())
    line = res.error_lines[0]
    assert res.code == 65 and "not a postcast checkpoint" in line and "system" in line
    assert "weights_only" not in res.err and "False" not in res.err


# --- config validate ------------------------------------------------------------------------------------
@pytest.mark.battery
def test_config_validate_bomb_big_and_non_utf8(tmp_path, capsys):
    """Before: non-UTF-8: internal error UnicodeDecodeError; the bomb and the big file were read whole."""
    bomb, big, latin1 = tmp_path / "bomb.yaml", tmp_path / "big.yaml", tmp_path / "latin1.yaml"
    bomb.write_text(_bomb(6))
    big.write_text("model: {family: emos}\n" + "# padding\n" * (config.MAX_YAML_BYTES // 10 + 1))
    latin1.write_bytes("model: {family: emos}\n# température\n".encode("latin-1"))
    for case, path, says in (
        ("config validate: YAML alias bomb", bomb, f"{config.MAX_YAML_NODES} nodes"),
        ("config validate: file over the size limit", big, f"{config.MAX_YAML_BYTES} bytes"),
        ("config validate: non-UTF-8 file", latin1, "not UTF-8 text (byte 0xe9"),
    ):
        res = in_process(["config", "validate", str(path)], capsys)
        assert_ok(case, res)
        assert res.code == 2 and says in res.error_lines[0], res.err
