"""``postcast run``: the staged, resumable pipeline of a YAML config (:mod:`postcast.pipeline.run`)."""

from __future__ import annotations

import argparse

from postcast.common import Subparsers


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "run",
        help="run the staged pipeline of a YAML config (synth/ingest -> train -> evaluate -> forecast -> compress)",
        description="Run every stage of a pipeline config (kind: pipeline): download (optional), synthesise or "
        "ingest, train each preset, evaluate (metrics and report), batch-forecast the trained models "
        "(forecast_from..forecast_to, optional) and compress the fields a preset reads (optional). "
        "WORKDIR/manifest.json records each stage's config hash, inputs and outputs: "
        "a rerun skips finished stages, --force reruns one, a killed run resumes (training from its "
        "last.ckpt). Logs: WORKDIR/logs/pipeline.log; summary: WORKDIR/summary.json (each stage's "
        "time, kept across reruns; each compressed field's errors; the work directory's size).",
        epilog="examples:\n  postcast run configs/quickstart.yaml\n"
        "  postcast run configs/quickstart.yaml --force train:unet_t850\n"
        "  postcast run configs/quickstart.yaml --dry-run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", help="pipeline YAML (kind: pipeline)")
    p.add_argument(
        "--force",
        action="append",
        default=[],
        metavar="STAGE",
        help="rerun this stage even if finished (repeatable; 'all' for every stage)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list the stages, whether they would run, and the files a download stage would fetch",
    )


def run(a: argparse.Namespace) -> int:
    from postcast.datasets.core import config
    from postcast.pipeline.run import run as run_pipeline

    cfg = config.load(a.config, "pipeline")
    summary = run_pipeline(cfg, force=tuple(a.force), progress=a.progress, dry_run=a.dry_run)
    for name, st in summary["stages"].items():
        print(f"{name:24} {st['status']:10} {st.get('seconds', '')}")
        for f in st.get("files", ()):  # a dry run's download listing
            size = f"~{f['expected_bytes'] / 1e9:.1f} GB" if f["expected_bytes"] else "size unknown"
            print(f"    {f['file']:42} {size:>12}  {'present' if f['present'] else f['url']}")
        if st.get("files"):
            known = sum(f["expected_bytes"] or 0 for f in st["files"])
            print(f"    {len(st['files'])} files, ~{known / 1e12:.2f} TB expected where the size is known")
    if "report" in summary:
        print(f"report: {summary['report']}")
    if not a.dry_run:
        print(
            f"work directory {summary['workdir']}: {summary['disk_bytes'] / 1e9:.2f} GB in {summary['disk_files']} "
            f"files; the outputs took {summary['seconds']:.0f} s"
        )
    return 0
