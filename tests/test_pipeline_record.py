"""The pipeline's record (WORKDIR/manifest.json) against a run killed inside a stage (issue 56 item 5):
``postcast run --force evaluate`` stopped after ``results.nc`` was rewritten left the old record on disk, so
the next run said "done before, skipped" over a report folder that mixed the new ``results.nc`` with the old
``metrics.json`` and ``report.html``. A stage's record is now dropped on disk before the stage starts, and a
stage is done only when its outputs are the files it recorded (size and modification time)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from postcast.pipeline.verify import report


def _config(tmp: Path) -> Path:
    """synth -> ingest -> evaluate (raw and oracle: no training), on a 10 deg world."""
    cfg = {
        "kind": "pipeline",
        "workdir": str(tmp / "work"),
        "workers": 1,
        "processes": False,
        "synth": {"seed": 3, "resolution": 10.0, "years": [2012, 2017], "dates_per_year": 3, "levels": [500, 850]},
        "bootstrap": 20,
    }
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _statuses(work: Path) -> dict[str, str]:
    return {k: v["status"] for k, v in json.loads((work / "summary.json").read_text())["stages"].items()}


def test_a_stage_is_done_only_over_the_outputs_it_recorded(cli, tmp_path, monkeypatch):
    """One finished run (synth, ingest, evaluate), then:

    * ``--dry-run --force evaluate`` lists evaluate as one that would run and leaves the record alone;
    * results.nc replaced by another file of the recorded modification time: evaluate runs again (the record
      checked only that the files exist), and a rerun after it skips every stage;
    * a forced evaluate killed after results.nc and metrics.json are rewritten, before the report: the record
      on disk no longer holds evaluate, and the next run evaluates again (it said "done before, skipped"),
      leaving one evaluation's outputs."""
    cfg, work = _config(tmp_path), tmp_path / "work"
    cli("run", str(cfg), check=True)
    assert set(_statuses(work).values()) == {"ran"}

    before = (work / "manifest.json").read_bytes()
    out = cli("run", str(cfg), "--force", "evaluate", "--dry-run", check=True)
    assert "would run" in next(ln for ln in out.stdout.splitlines() if ln.startswith("evaluate"))
    assert (work / "manifest.json").read_bytes() == before

    results = work / "report/results.nc"
    stat = results.stat()
    results.write_bytes(results.read_bytes() + b"\0")  # another file under the recorded name ...
    os.utime(results, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ... even with the recorded time
    cli("run", str(cfg), check=True)
    assert _statuses(work)["evaluate"] == "ran" and _statuses(work)["ingest"] == "skipped"
    cli("run", str(cfg), check=True)
    assert set(_statuses(work).values()) == {"skipped"}

    report_before = (work / "report/report.html").stat().st_mtime_ns

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # where a SIGKILL could land: results.nc and metrics.json new, the report old

    monkeypatch.setattr(report, "write_report", killed)
    assert cli("run", str(cfg), "--force", "evaluate").returncode == 130
    assert "evaluate" not in json.loads((work / "manifest.json").read_text())["stages"]
    monkeypatch.undo()
    cli("run", str(cfg), check=True)
    assert _statuses(work)["evaluate"] == "ran" and _statuses(work)["ingest"] == "skipped"
    assert (work / "report/report.html").stat().st_mtime_ns > report_before
