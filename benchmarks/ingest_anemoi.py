"""anemoi-datasets as a peer of ``postcast ingest`` on the same GRIB files (``ingest.py --anemoi``).

For the 0.5 deg case of :mod:`ingest` (2 init dates, 1,500 GRIB1 messages) this module

* installs anemoi-datasets in its own virtual environment when missing (``--anemoi-venv``, default
  ``.venv-anemoi`` at the repository root; ``python -m venv`` + ``pip install -r benchmarks/requirements-anemoi.txt``):
  it needs zarr 2 while postcast uses zarr 3, and it is no dependency of postcast;
* writes anemoi recipes for the same files: anemoi's ``gridded`` layout holds one row per *valid*
  time (fields picked by ``valid_datetime``), with the ensemble members (GRIB ``number``) as its
  ensemble dimension, so each (init time, step) of the files is one row. One dataset per init date
  (its 3 valid times are consecutive days): one recipe for init dates a year apart spans 368 daily
  rows, 362 of them ``missing``, and anemoi 0.5.47's statistics pass in ``finalise`` reads every row
  (58.6 s of an 84 s ``create`` at 0.5 deg), a cost of the gap, not of the files. ``allow_nans``: SST
  is missing over land;
* times ``postcast ingest`` (a fresh dask LocalCluster of ``--workers`` single-threaded processes, its
  start included, as in :mod:`ingest`) and ``anemoi-datasets create`` of each dataset, ``--workers``
  processes at a time (anemoi's own parallel modes fail in 0.5.47: ``create --processes 2`` with
  ``TypeError: 'NoneType' object cannot be interpreted as an integer``, the step-by-step ``init`` /
  ``load --parts i/2`` / ``finalise`` in ``finalise`` with ``Statistics end 6 does not match dataset
  length 368``) in interleaved rounds (postcast, anemoi, eccodes' bare decode of the same files in one
  process, postcast, ...), each ingest from removed stores, and reports the min and the median of each;
  all three read the files from the page cache;
* compares the two stores field by field: every (init time, step, variable, level, member) field of
  anemoi's store (read with zarr 3, which reads zarr 2 stores) against postcast's, bit for bit (NaN
  where the other has NaN), and reports the largest absolute difference and the fields that differ;
* measures the bytes on disk per init date: anemoi's ``data`` arrays are all per date (their
  statistics, dates and coordinates are fixed); postcast's per-date arrays (those along ``init_time``) are split
  into members, ensemble mean/std and truth/oracle, its fixed part (the per-point and per-variable
  training statistics, the coordinates, the metadata) is reported apart.

Not the default: the first run installs ~600 MB of packages (~1 min from a warm pip cache) and each
round adds the time of both ingests (~1.5 min at 0.5 deg on the shared 2 cores).

    python benchmarks/ingest.py --case ens10_0.5deg --anemoi --anemoi-rounds 2
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
import zarr

from postcast.datasets import schema

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements-anemoi.txt"
DEFAULT_VENV = (
    HERE.parent / ".venv-anemoi"
)  # beside .venv: not under benchmarks/, which tests/test_dependencies.py scans
SHORT_NAMES = {"10u": "u10", "10v": "v10", "2t": "t2m"}  # ECMWF shortName -> postcast name, where they differ
Rows = dict[pd.Timestamp, tuple[pd.Timestamp, int]]  # valid time -> (init time, step in h)
FREQUENCY_H = 24  # anemoi row spacing (h): the steps and init times of the cases are whole days


# --- installation --------------------------------------------------------------------------------
def anemoi_cli(venv: Path) -> Path:
    """The ``anemoi-datasets`` executable of ``venv``, made with the pinned requirements when missing."""
    exe = venv / "bin" / "anemoi-datasets"
    if exe.exists():
        return exe
    print(f"installing anemoi-datasets into {venv} (pip install -r {REQUIREMENTS.name}) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)]
    subprocess.run(pip, check=True)
    if not exe.exists():
        msg = f"{exe} is missing after pip install -r {REQUIREMENTS}"
        raise RuntimeError(msg)
    return exe


def anemoi_version(exe: Path) -> str:
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip() or out.stderr.strip()


# --- recipe --------------------------------------------------------------------------------------
def valid_rows(init_times: Sequence[pd.Timestamp], steps_h: Sequence[int]) -> Rows:
    """Valid time -> (init time, step in h): the rows of anemoi's store, one per valid time."""
    rows: Rows = {}
    for init in map(pd.Timestamp, init_times):
        for step in steps_h:
            valid = init + pd.Timedelta(hours=step)
            if valid in rows:
                msg = f"valid time {valid} is both {rows[valid]} and {(init, step)}: anemoi's rows are valid times"
                raise ValueError(msg)
            rows[valid] = (init, step)
    return rows


def _ranges(days: list[pd.Timestamp]) -> list[dict[str, str]]:
    """Consecutive days (every FREQUENCY_H) as ``{start, end}`` ranges for the recipe's ``missing``."""
    out: list[dict[str, str]] = []
    step = pd.Timedelta(hours=FREQUENCY_H)
    for day in days:
        if out and pd.Timestamp(out[-1]["end"]) + step == day:
            out[-1]["end"] = day.isoformat()
        else:
            out.append({"start": day.isoformat(), "end": day.isoformat()})
    return out


def recipe(files: Sequence[Path], rows: Rows) -> dict[str, Any]:
    """anemoi-datasets recipe reading every message of ``files`` (all variables, levels, members)."""
    valid = sorted(rows)
    every = list(pd.date_range(valid[0], valid[-1], freq=f"{FREQUENCY_H}h"))
    if off := sorted(set(valid) - set(every)):
        msg = f"valid times {off[:3]} are not on the {FREQUENCY_H} h grid from {valid[0]}"
        raise ValueError(msg)
    dates: dict[str, Any] = {
        "start": valid[0].isoformat(),
        "end": valid[-1].isoformat(),
        "frequency": f"{FREQUENCY_H}h",
    }
    if missing := [d for d in every if d not in rows]:
        dates["missing"] = _ranges(missing)
    return {
        "dates": dates,
        "build": {"allow_nans": True},  # SST: missing over land
        "input": {"grib": {"path": [str(f) for f in files]}},
    }


# --- timing --------------------------------------------------------------------------------------
def remove_store(path: Path) -> None:
    """A store and anemoi's work directory beside it (``<store>.work_dir``)."""
    for p in (path, path.with_name(path.name + ".work_dir")):
        shutil.rmtree(p, ignore_errors=True)


def timed_creates(exe: Path, jobs: Sequence[tuple[Path, Path]], processes: int, logs: Path) -> float:
    """Seconds of ``anemoi-datasets create`` of each (recipe, store) of ``jobs``, ``processes`` at a time
    (one process each), from removed stores; each one's output goes to ``logs/<store name>.log``."""
    for _, store in jobs:
        remove_store(store)
    start = time.perf_counter()
    for k in range(0, len(jobs), processes):
        running = []
        for recipe_path, store in jobs[k : k + processes]:
            log = logs / f"{store.name}.log"
            cmd = [str(exe), "create", str(recipe_path), str(store), "--overwrite"]
            with open(log, "w") as f:
                running.append((subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT), log))
        for proc, log in running:
            if proc.wait():
                tail = log.read_text().strip().splitlines()[-1:]
                msg = f"anemoi-datasets create exited {proc.returncode} (log {log}): {tail}"
                raise RuntimeError(msg)
    return time.perf_counter() - start


def interleaved(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each run in ``rounds`` rounds, the runs taking turns within each round."""
    if rounds < 1:
        msg = f"rounds must be >= 1, got {rounds}"
        raise ValueError(msg)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(rounds):
        for name, run in runs.items():
            times[name].append(round(run(), 2))
            print(f"  round {i + 1}/{rounds}: {name} {times[name][-1]} s", flush=True)
    return times


# --- comparison ----------------------------------------------------------------------------------
def _postcast_name(anemoi_name: str) -> tuple[str, int | None]:
    """``t_850`` -> (``t``, 850); ``2t`` -> (``t2m``, None)."""
    short, _, level = anemoi_name.partition("_")
    name = SHORT_NAMES.get(short, short)
    if name not in schema.VARIABLES:
        msg = f"anemoi variable {anemoi_name!r} maps to {name!r}, not a postcast variable"
        raise ValueError(msg)
    return name, int(level) if level else None


def _array(group: zarr.Group, name: str) -> zarr.Array:
    node = group[name]
    if not isinstance(node, zarr.Array):
        msg = f"{name!r} of {group.store} is a {type(node).__name__}, not an array"
        raise TypeError(msg)
    return node


def _attrs(group: zarr.Group) -> dict[str, Any]:
    """The group's attributes as plain JSON (anemoi's metadata)."""
    out: dict[str, Any] = group.attrs.asdict()
    return out


def _members(group: zarr.Group, names: list[str]) -> list[int]:
    """GRIB ``number`` of each of anemoi's ensemble slots (the same for every variable)."""
    meta: dict[str, Any] = _attrs(group)["variables_metadata"]
    numbers = {tuple(meta[n]["mars"]["number"]) for n in names}
    if len(numbers) != 1:
        msg = f"anemoi variables hold different members: {sorted(numbers)}"
        raise ValueError(msg)
    return list(numbers.pop())


def _check_grid(group: zarr.Group, ds: xr.Dataset) -> tuple[int, int]:
    """(n_lat, n_lon); anemoi's points run north to south, row by row, postcast's latitudes south to north."""
    n_lat, n_lon = ds.sizes[schema.LAT], ds.sizes[schema.LON]
    lat = np.asarray(_array(group, "latitudes")[:]).reshape(n_lat, n_lon)[::-1, 0]
    lon = np.asarray(_array(group, "longitudes")[:]).reshape(n_lat, n_lon)[0]
    if not (np.allclose(lat, ds[schema.LAT].values) and np.allclose(lon % 360, ds[schema.LON].values % 360)):
        msg = f"anemoi grid (lat {lat[[0, -1]]}, lon {lon[[0, -1]]}) is not postcast's"
        raise ValueError(msg)
    return n_lat, n_lon


@dataclass
class Diff:
    fields: int = 0
    identical: int = 0
    max_abs: float = 0.0
    differing: list[str] = field(default_factory=list)  # the first 10 fields that differ, named

    def add(self, ref: np.ndarray, got: np.ndarray, label: str) -> None:
        """One field (lat, lon) of each store, float32."""
        nan = np.isnan(ref)
        bits = ref[~nan].view(np.uint32), got[~nan].view(np.uint32)
        same = np.array_equal(nan, np.isnan(got)) and np.array_equal(*bits)
        self.fields += 1
        if same:
            self.identical += 1
            return
        both = ~nan & ~np.isnan(got)
        self.max_abs = max(self.max_abs, float(np.abs(ref[both] - got[both]).max(initial=0.0)))
        if len(self.differing) < 10:
            self.differing.append(label)


def compare(postcast_store: Path, anemoi_store: Path, rows: Rows, diff: Diff) -> None:
    """Every member field of anemoi's store (the valid times ``rows``) against postcast's, bit for bit."""
    # zarrs (postcast's codec pipeline) leaves anemoi's datetime64 ``dates`` to zarr-python, with a warning
    warnings.filterwarnings("ignore", "Array is unsupported by ZarrsCodecPipeline", UserWarning)
    group = zarr.open_group(str(anemoi_store), mode="r", zarr_format=2)
    data = _array(group, "data")  # (dates, variables, members, points) float32
    names: list[str] = list(_attrs(group)["variables"])
    members = _members(group, names)
    row_of = {pd.Timestamp(d): i for i, d in enumerate(np.asarray(_array(group, "dates")[:]))}
    ds = xr.open_zarr(postcast_store)
    n_lat, n_lon = _check_grid(group, ds)
    for init in sorted({init for init, _ in rows.values()}):
        steps = sorted(step for i, step in rows.values() if i == init)
        # (steps, variables, members, lat, lon) north -> south, flipped to postcast's south -> north
        got = np.stack([np.asarray(data[row_of[init + pd.Timedelta(hours=s)]]) for s in steps])
        got = got.reshape(*got.shape[:3], n_lat, n_lon)[..., ::-1, :]
        for v, anemoi_name in enumerate(names):
            name, level = _postcast_name(anemoi_name)
            sel: dict[str, Any] = {schema.INIT_TIME: init, schema.MEMBER: members}
            ref = ds[name].sel(sel | ({schema.LEVEL: level} if level else {}))
            ref_steps = ref.sel({schema.STEP: [pd.Timedelta(hours=s) for s in steps]})
            ref_values = ref_steps.transpose(schema.STEP, schema.MEMBER, schema.LAT, schema.LON).values
            for s, step in enumerate(steps):
                for m, member in enumerate(members):
                    label = f"{init:%Y-%m-%d}+{step}h {anemoi_name} member {member}"
                    diff.add(ref_values[s, m], np.ascontiguousarray(got[s, v, m]), label)


# --- sizes ---------------------------------------------------------------------------------------
def _bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (or of the file)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _postcast_part(path: Path) -> str:
    """Which part of postcast's store a top-level node is: members, ensemble, truth_oracle, other_per_date
    (arrays along init_time) or fixed (statistics group, coordinates, metadata)."""
    meta = path / "zarr.json"
    if not meta.is_file():
        return "fixed"
    node = json.loads(meta.read_text())
    if node.get("node_type") != "array" or schema.INIT_TIME not in (node.get("dimension_names") or []):
        return "fixed"
    if path.name in schema.VARIABLES:
        return "members"
    if path.name.startswith("ens_"):
        return "ensemble"
    if path.name.startswith(("truth_", "oracle_")):
        return "truth_oracle"
    return "other_per_date"


def store_sizes(postcast_store: Path, anemoi_stores: Sequence[Path], n_dates: int) -> dict[str, Any]:
    """Bytes on disk (MB) per init date of each store, and their fixed parts."""
    parts: dict[str, int] = {}
    for child in postcast_store.iterdir():
        key = _postcast_part(child)
        parts[key] = parts.get(key, 0) + _bytes(child)
    per_date = sum(v for k, v in parts.items() if k != "fixed")
    anemoi_data = sum(_bytes(a / "data") for a in anemoi_stores)  # (dates, variables, members, points): per date
    anemoi_all = sum(_bytes(a) for a in anemoi_stores)
    mb = 2**20
    return {
        "postcast_MB_per_date": round(per_date / n_dates / mb, 2),
        "postcast_parts_MB_per_date": {k: round(v / n_dates / mb, 2) for k, v in sorted(parts.items()) if k != "fixed"},
        "postcast_fixed_MB": round(parts.get("fixed", 0) / mb, 2),
        "anemoi_MB_per_date": round(anemoi_data / n_dates / mb, 2),
        "anemoi_fixed_MB": round((anemoi_all - anemoi_data) / mb, 2),  # over all its stores
        "store_per_date_over_anemoi": round(per_date / anemoi_data, 2),
        "members_per_date_over_anemoi": round(parts.get("members", 0) / anemoi_data, 2),
    }


# --- the peer run --------------------------------------------------------------------------------
@dataclass
class PeerConfig:
    rounds: int
    venv: Path
    processes: int = 1  # anemoi creates at a time: postcast's dask workers


def per_init(rows: Rows) -> dict[pd.Timestamp, Rows]:
    """The rows of each init date: one anemoi dataset each, its valid times consecutive."""
    out: dict[pd.Timestamp, Rows] = {}
    for valid, (init, step) in sorted(rows.items()):
        out.setdefault(init, {})[valid] = (init, step)
    return out


def peer(
    files: Sequence[Path],
    init_times: Sequence[pd.Timestamp],
    work: Path,
    postcast_round: Callable[[Path], float],
    decode: Callable[[], float],
    cfg: PeerConfig,
) -> dict[str, Any]:
    """Time ``postcast_round(store)`` (seconds of one ingest into ``store``), anemoi's ``create`` of the
    same files and ``decode()`` (seconds of eccodes' bare decode of them) in interleaved rounds, compare the
    stores and their sizes per init date."""
    exe = anemoi_cli(cfg.venv)
    groups = per_init(valid_rows(init_times, schema.STEPS_H))  # the synthetic files' steps
    jobs: list[tuple[Path, Path]] = []
    for init, rows in groups.items():
        recipe_path = work / f"anemoi_recipe_{init:%Y%m%d}.yaml"
        recipe_path.write_text(json.dumps(recipe(files, rows), indent=1))  # YAML is a superset of JSON
        jobs.append((recipe_path, work / f"peer_anemoi_{init:%Y%m%d}.zarr"))
    p_store = work / "peer_postcast.zarr"
    times = interleaved(
        {
            "postcast": lambda: postcast_round(p_store),
            "anemoi": lambda: timed_creates(exe, jobs, cfg.processes, work),
            "decode": decode,
        },
        cfg.rounds,
    )
    diff = Diff()
    for rows, (_, a_store) in zip(groups.values(), jobs, strict=True):
        compare(p_store, a_store, rows, diff)
    stats = {k: {"min_s": min(v), "median_s": round(statistics.median(v), 2), "rounds_s": v} for k, v in times.items()}
    return {
        "anemoi": anemoi_version(exe),
        "anemoi_processes": cfg.processes,
        "recipes": [recipe(files, rows) for rows in groups.values()],
        "times": stats,
        **ratios(times),
        "fields_compared": diff.fields,
        "fields_identical": diff.identical,
        "max_abs_diff": diff.max_abs,
        "fields_differing": diff.differing,
        **store_sizes(p_store, [a for _, a in jobs], len(init_times)),
    }


def ratios(times: dict[str, list[float]]) -> dict[str, float]:
    """The peer's ratios from the seconds of each run's rounds (``postcast``, ``anemoi``, ``decode``):
    throughput over anemoi's (same bytes: anemoi's time over postcast's) at the min and the median, and
    postcast's time over the bare decode's, both at their min over the same interleaved rounds (a decode
    timed once, before the rounds, moved the ratio with that one sample: 1.41 s in one run, 2.58 s in
    another, the same files on the same machine)."""
    p_min, a_min, d_min = (min(times[k]) for k in ("postcast", "anemoi", "decode"))
    p_med, a_med = statistics.median(times["postcast"]), statistics.median(times["anemoi"])
    return {
        "ingest_over_anemoi": round(a_min / p_min, 2),
        "ingest_over_anemoi_median": round(a_med / p_med, 2),
        "ingest_over_decode": round(p_min / d_min, 2),
    }


def print_peer(res: dict[str, Any]) -> None:
    t = res["times"]
    print(
        f"\npeer: anemoi-datasets {res['anemoi']} `create`, one dataset per init date, {res['anemoi_processes']} "
        "at a time, vs postcast ingest on as many workers; same GRIB files, interleaved rounds (postcast first)"
    )
    print(f"{'':<10}{'min_s':>10}{'median_s':>10}{'MB_per_date':>13}{'fixed_MB':>10}  rounds_s")
    for name in ("postcast", "anemoi"):
        print(
            f"{name:<10}{t[name]['min_s']:>10}{t[name]['median_s']:>10}{res[f'{name}_MB_per_date']:>13}"
            f"{res[f'{name}_fixed_MB']:>10}  {t[name]['rounds_s']}"
        )
    print(f"{'decode':<10}{t['decode']['min_s']:>10}{t['decode']['median_s']:>10}{'':>23}  {t['decode']['rounds_s']}")
    print(f"postcast per-date parts (MB per date): {res['postcast_parts_MB_per_date']}")
    same = res["fields_identical"] == res["fields_compared"]
    print(
        f"fields compared: {res['fields_compared']}, bit-identical: {res['fields_identical']}"
        + ("" if same else f"; max abs difference {res['max_abs_diff']}; first differing: {res['fields_differing']}")
    )
