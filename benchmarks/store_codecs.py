"""Store encodings, measured per array kind: write cost, read cost and size on disk.

What the training store holds at 0.5 deg (361 x 720), float32, NaN fill (docs/store.md):

* ``member``: member fields, one (init date, step, level) slot = 10 members x 361 x 720 (10.4 MB);
* ``ens``: ensemble mean / std, one slot = 361 x 720 (1 MB);
* ``truth``: truth (and oracle), one init date = 3 steps x 361 x 720 (3.1 MB).

The values are the synthetic ENS-10 world's (``datasets/synth/synthetic.py``: z500, t850, q850, u850,
msl, tcc, ...) packed and unpacked through eccodes with the ENS-10 16-bit simple packing, as an
ingest from GRIB writes them (not random noise, which compresses like nothing real).

Each case writes the array into a fresh zarr 3 ``LocalStore`` (``arr[...] = data``: whole chunks
or whole shards, as ingest's region writes), then reads it back the way training does, one unit a
call (``member``: one slot with all members; ``ens``: one slot; ``truth``: one date at one step).
Grid of cases per kind: chunk layouts (the store's today, finer chunks, zarr 3 sharding with
``ShardingCodec``) x codecs (blosc-zstd levels 1/3/5 and blosc-lz4, both byte-shuffled; plain
zstd level 1; none) x codec pipeline (zarr-python's ``BatchedCodecPipeline``; the ``zarrs`` Rust
``ZarrsCodecPipeline`` when installed). Every case runs with ``threading.max_workers=1`` (one
core per ingest worker, as ``postcast ingest`` runs one single-threaded task per core), best of
``--repeat`` runs; all cases of a kind in the same run on the same data.

    python benchmarks/store_codecs.py            # all kinds and cases (~4 min on 2 cores)
    python benchmarks/store_codecs.py --quick    # 2 slots per kind, today's layouts only

Writes ``benchmarks/results/store_codecs.json``; last line
``RESULT member_write_speedup=<x> ens_write_speedup=<x> member_read_speedup=<x> member_size_ratio=<x>``:
the chosen encoding (``postcast.datasets.io``) against the previous one (blosc-zstd level 1,
zarr-python pipeline) for member fields and ensemble statistics.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# isort: off
import pyproj  # noqa: F401  (before eccodes: see datasets/sources/messages.py)
import eccodes

# isort: on
import numpy as np
import pandas as pd
import zarr
from zarr.codecs import BloscCodec, ZstdCodec
from zarr.storage import LocalStore

from postcast.datasets import io, schema
from postcast.datasets.sources import messages as grib
from postcast.datasets.synth.synthetic import World

ROOT = Path(__file__).resolve().parents[1]
FIELDS = [("z", 500), ("t", 850), ("q", 850), ("u", 850), ("msl", 0), ("tcc", 0), ("t2m", 0), ("w", 500)]
ZARRS = "zarrs.ZarrsCodecPipeline"
DEFAULT_PIPELINE = "zarr.core.codec_pipeline.BatchedCodecPipeline"

CODECS: dict[str, Callable[[], list[Any]]] = {
    "blosc-zstd1": lambda: [BloscCodec(cname="zstd", clevel=1, shuffle="shuffle")],
    "blosc-zstd3": lambda: [BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")],
    "blosc-zstd5": lambda: [BloscCodec(cname="zstd", clevel=5, shuffle="shuffle")],
    "blosc-lz4": lambda: [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
    "zstd1": lambda: [ZstdCodec(level=1)],
    "none": lambda: [],
}


@dataclass(frozen=True)
class Layout:
    """A chunk layout: ``chunks`` and, when sharded, ``shards`` (the file holding several chunks)."""

    name: str
    chunks: tuple[int, ...]
    shards: tuple[int, ...] | None = None


def layouts(kind: str, n: int, ny: int, nx: int, nm: int) -> list[Layout]:
    """The candidate layouts of one kind; the first is the store's layout before this benchmark."""
    if kind == "member":  # (slot, member, lat, lon)
        return [
            Layout("slot (all members)", (1, nm, ny, nx)),
            Layout("per member", (1, 1, ny, nx)),
            Layout("shard slot / chunk member", (1, 1, ny, nx), (1, nm, ny, nx)),
            Layout(f"shard {n} slots / chunk slot", (1, nm, ny, nx), (n, nm, ny, nx)),
        ]
    if kind == "ens":  # (slot, lat, lon)
        return [
            Layout("slot", (1, ny, nx)),
            Layout(f"{n} slots", (n, ny, nx)),
            Layout(f"shard {n} slots / chunk slot", (1, ny, nx), (n, ny, nx)),
        ]
    return [
        Layout("date (3 steps)", (1, 3, ny, nx)),  # truth: (date, step, lat, lon)
        Layout("date, step", (1, 1, ny, nx)),
        Layout("shard date / chunk step", (1, 1, ny, nx), (1, 3, ny, nx)),
    ]


def grib_packed(x: np.ndarray, handle: int) -> np.ndarray:
    """``x`` (n_lat, n_lon) through ENS-10's 16-bit simple packing and back, float32."""
    eccodes.codes_set_values(handle, x.ravel().astype(np.float64))
    return np.asarray(eccodes.codes_get_values(handle), dtype=np.float32).reshape(x.shape)


def synthetic_data(res: float, n: int) -> dict[str, np.ndarray]:
    """Arrays of each kind from the synthetic world, GRIB-packed: member (n, 10, ny, nx), ens
    (2n, ny, nx: mean and std of the same slots), truth (max(1, n // 2), 3, ny, nx)."""
    grid = schema.Grid(res)
    world = World(0, grid)
    handle = grib._template(schema.VARIABLES["t2m"], grid)  # the writer's packing, ENS-10's 16 bits
    try:
        init = pd.Timestamp("2013-01-03")
        slots = []
        for i in range(n):
            name, level = FIELDS[i % len(FIELDS)]
            raw = world.members_field(name, level, init, (24, 48, 0)[i // len(FIELDS) % 3])
            slots.append(np.stack([grib_packed(m, handle) for m in raw]))
    finally:
        eccodes.codes_release(handle)
    member = np.stack(slots)  # (n, member, lat, lon) float32
    mean, std = member.mean(axis=1), member.std(axis=1)  # (n, lat, lon) each
    ens = np.concatenate([mean, std]).astype(np.float32)
    truth = member[: max(1, n // 2), :3]  # (date, step, lat, lon): 3 members stand in for 3 steps
    return {"member": member, "ens": ens, "truth": np.ascontiguousarray(truth)}


def read_units(kind: str, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """What one training read asks for: a slot (member, ens) or one date at one step (truth)."""
    if kind == "truth":
        return [(i, j) for i in range(shape[0]) for j in range(shape[1])]
    return [(i,) for i in range(shape[0])]


@contextlib.contextmanager
def pipeline(path: str) -> Iterator[None]:
    with zarr.config.set({"codec_pipeline.path": path, "threading.max_workers": 1}):
        yield


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_case(
    data: np.ndarray, kind: str, layout: Layout, codec: str, pipe: str, work: Path, repeat: int
) -> dict[str, Any]:
    """Write and read one case ``repeat`` times; best times, size, and a value check."""
    best_w = best_r = float("inf")
    size = 0
    for r in range(repeat):
        path = work / f"case{r}.zarr"
        shutil.rmtree(path, ignore_errors=True)
        with pipeline(pipe):
            arr = zarr.create_array(
                LocalStore(path),
                shape=data.shape,
                dtype="float32",
                chunks=layout.chunks,
                shards=layout.shards,
                compressors=CODECS[codec](),
                fill_value=np.nan,
                zarr_format=3,
            )
            t0 = time.perf_counter()
            arr[...] = data
            best_w = min(best_w, time.perf_counter() - t0)
            size = du(path)
            arr = zarr.open_array(LocalStore(path, read_only=True), mode="r")
            units = read_units(kind, data.shape)
            t0 = time.perf_counter()
            got = [arr[u] for u in units]
            best_r = min(best_r, time.perf_counter() - t0)
        if not all(np.array_equal(g, data[u], equal_nan=True) for g, u in zip(got, units, strict=True)):
            raise SystemExit(f"{kind} {layout.name} {codec} {pipe}: values differ after a round trip")
        shutil.rmtree(path, ignore_errors=True)
    mb = data.nbytes / 2**20
    return {
        "kind": kind,
        "layout": layout.name,
        "codec": codec,
        "pipeline": "zarrs" if pipe == ZARRS else "zarr",
        "write_s": round(best_w, 4),
        "read_s": round(best_r, 4),
        "write_MB_per_s": round(mb / best_w, 1),
        "read_MB_per_s": round(mb / best_r, 1),
        "ratio": round(data.nbytes / size, 2),
        "size_MB": round(size / 2**20, 2),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = ["kind", "layout", "codec", "pipeline", "write_MB_per_s", "read_MB_per_s", "ratio", "size_MB"]
    widths = [7, 28, 12, 9, 15, 14, 7, 9]
    print("".join(f"{c:<{w}}" if i < 4 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(cols, widths, strict=True))))
    for row in rows:
        print(
            "".join(
                f"{row[c]!s:<{w}}" if i < 4 else f"{row[c]!s:>{w}}"
                for i, (c, w) in enumerate(zip(cols, widths, strict=True))
            )
        )


def chosen(kind: str) -> tuple[str, str]:
    """(codec, pipeline) of the encoding ``postcast.datasets.io`` writes for ``kind`` now."""
    codec = io.codec_name(io.compressors_for("member" if kind == "member" else "field"))
    return codec, "zarrs" if io.ZARRS_IN_USE else "zarr"


def speedup(rows: list[dict[str, Any]], kind: str, key: str) -> float:
    """``key`` of the chosen encoding over the previous one (blosc-zstd1, zarr pipeline), today's layout."""
    first = [r for r in rows if r["kind"] == kind and r["layout"] == rows_layout(rows, kind)]
    old = next(r for r in first if r["codec"] == "blosc-zstd1" and r["pipeline"] == "zarr")
    codec, pipe = chosen(kind)
    new = next((r for r in first if r["codec"] == codec and r["pipeline"] == pipe), old)
    if key == "ratio":
        return round(new["ratio"] / old["ratio"], 2)
    return round(old[key] / new[key], 2)


def rows_layout(rows: list[dict[str, Any]], kind: str) -> str:
    return next(r["layout"] for r in rows if r["kind"] == kind)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 slots per kind, today's layouts only")
    ap.add_argument("--slots", type=int, default=4, help="member slots (10.4 MB each at 0.5 deg)")
    ap.add_argument("--resolution", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "store_codecs.json"))
    args = ap.parse_args()
    n = 2 if args.quick else args.slots
    data = synthetic_data(args.resolution, n)
    pipes = [DEFAULT_PIPELINE] + ([ZARRS] if importlib.util.find_spec("zarrs") else [])
    work = Path(tempfile.mkdtemp(prefix="postcast-codecs-"))
    rows = []
    try:
        for kind, arr in data.items():
            ny, nx = arr.shape[-2:]
            lays = layouts(kind, arr.shape[0], ny, nx, data["member"].shape[1])
            for layout in lays[:1] if args.quick else lays:
                for codec in CODECS:
                    for pipe in pipes:
                        rows.append(run_case(arr, kind, layout, codec, pipe, work, args.repeat))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{args.resolution} deg, float32, {n} member slots; 1 codec thread; best of {args.repeat}; "
        "MB/s of decoded bytes; ratio = decoded / stored bytes"
    )
    print_table(rows)
    summary = {
        "member_write_speedup": speedup(rows, "member", "write_s"),
        "ens_write_speedup": speedup(rows, "ens", "write_s"),
        "member_read_speedup": speedup(rows, "member", "read_s"),
        "member_size_ratio": speedup(rows, "member", "ratio"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    io.write_json(
        out,
        {
            "resolution": args.resolution,
            "slots": n,
            "repeat": args.repeat,
            "codec_threads": 1,
            "chosen": {k: chosen(k) for k in data},
            "rows": rows,
            "summary": summary,
        },
    )
    print("RESULT " + " ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
