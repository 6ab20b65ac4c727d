"""ENS-10 GRIB edition 1: write look-alike files with eccodes, index and decode them.

File form (ENS-10, docs/ens10.md "Files"): one file per month-day and level type,
``output.pl.2018MMDD`` / ``output.sfc.2018MMDD``, each holding every reforecast year of that
month-day; ECMWF centre, local definition 1 (``dataType=pf``, ``number`` 1..10, ``totalNumber`` 11),
16-bit simple packing, 00 UTC, grid scanned north to south, SST missing over land (bitmap).

Reading is two-phase so it scales to 48 GB files: :func:`index_file` scans message headers only
(byte offset, length and identity of each message), then :func:`decode` reads just the messages
a work unit needs. Both raise :class:`BadInputError` naming the file and message on corrupt data.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

# pyproj (behind pyresample, see regrid.py) must load its bundled native libraries before eccodes does:
# in the other order the process aborts at exit ("free(): invalid size", exit 134) even though all work
# succeeded. Measured with the wheels pyproj 3.7.2 / eccodeslib 2.50.0.33; tests/test_quality.py checks it.
# isort: off
import pyproj  # noqa: F401  (before eccodes)
import eccodes

# isort: on
import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import schema
from postcast.datasets.core.errors import BadInputError
from postcast.datasets.io import atomic_path
from postcast.datasets.sources.gribgrids import SCAN_BITS, in_grid_order, scan_flags
from postcast.datasets.sources.gribgrids import grid_of as grid_of  # (read here by ingest and inspect)

# eccodes writes its own ERROR/WARNING lines to stderr (e.g. "Cannot unpack key 'codedValues' as float" before
# the double-precision fallback of _values): every failure reaches the user as one BadInputError line instead
_ECCODES_LOG = open(os.devnull, "w")  # noqa: SIM115  (held open for eccodes' C logger, for the process)
eccodes.codes_context_set_logging(_ECCODES_LOG)

MISSING_VALUE = 9999.0  # what ENS-10 readers see for missing SST (the reference loader fills 9999)
BITS_PER_VALUE = 16
# the keys asked once per parameter (eccodes key -> index column), not once per message
PARAM_KEYS = {"paramId": "param_id", "cfVarName": "cf_var", "units": "units", "name": "long_name", "cfName": "cf_name"}
PARAM_COLUMNS = tuple(PARAM_KEYS.values())
INDEX_COLUMNS = [
    "var",
    "level",
    "member",
    "init_time",
    "step_h",
    "offset",
    "length",
    "ni",
    "nj",
    "lat_first",
    "lat_last",
    "lon_first",
    "lon_last",
    "grid_type",
    "n_values",
    "scan",
    "data_type",
    "short_name",
    "type_of_level",
    "step_type",
    "start_step",
    *PARAM_COLUMNS,
]


def file_name(kind: str, month: int, day: int) -> str:
    return f"output.{kind}.{schema.file_date_label(month, day)}"


# --- writing -------------------------------------------------------------------------------------
def _set_grid(h: int, grid: schema.Grid) -> None:
    eccodes.codes_set(h, "Ni", grid.n_lon)
    eccodes.codes_set(h, "Nj", grid.n_lat)
    eccodes.codes_set(h, "latitudeOfFirstGridPointInDegrees", 90.0)
    eccodes.codes_set(h, "latitudeOfLastGridPointInDegrees", -90.0)
    eccodes.codes_set(h, "longitudeOfFirstGridPointInDegrees", 0.0)
    eccodes.codes_set(h, "longitudeOfLastGridPointInDegrees", 360.0 - grid.resolution)
    eccodes.codes_set(h, "iDirectionIncrementInDegrees", grid.resolution)
    eccodes.codes_set(h, "jDirectionIncrementInDegrees", grid.resolution)
    eccodes.codes_set(h, "jScansPositively", 0)


def _template(var: schema.Variable, grid: schema.Grid) -> int:
    """A GRIB1 handle with everything set except date, step, member, level and values."""
    pl = var.on_levels
    h = eccodes.codes_grib_new_from_samples("regular_ll_pl_grib1" if pl else "regular_ll_sfc_grib1")
    eccodes.codes_set(h, "centre", "ecmf")
    eccodes.codes_set(h, "setLocalDefinition", 1)
    eccodes.codes_set(h, "localDefinitionNumber", 1)
    eccodes.codes_set(h, "marsClass", "od")
    eccodes.codes_set(h, "marsStream", "enfh")  # ensemble forecast hindcasts (reforecasts)
    eccodes.codes_set(h, "marsType", "pf")
    eccodes.codes_set(h, "numberOfForecastsInEnsemble", 11)
    eccodes.codes_set(h, "dataTime", 0)
    eccodes.codes_set(h, "paramId", var.param_id)
    if var.accumulated:
        eccodes.codes_set(h, "stepType", "accum")
    _set_grid(h, grid)
    eccodes.codes_set(h, "bitsPerValue", BITS_PER_VALUE)
    if var.missing_over_land:
        eccodes.codes_set(h, "bitmapPresent", 1)
        eccodes.codes_set(h, "missingValue", MISSING_VALUE)
    return h


def write_file(ds: xr.Dataset, path: str | os.PathLike[str], kind: str) -> int:
    """Write the ``kind`` ("pl" or "sfc") variables of a canonical forecast dataset as one ENS-10
    GRIB1 file, atomically. Data may be dask-backed; one (init, step) is loaded at a time.
    Returns the number of messages written."""
    grid = schema.Grid.from_coords(ds[schema.LAT].values, ds[schema.LON].values)
    want = schema.LevelType.PRESSURE if kind == "pl" else schema.LevelType.SURFACE
    names = [n for n in ds.data_vars if schema.VARIABLES[str(n)].level_type is want]
    templates = {n: _template(schema.VARIABLES[str(n)], grid) for n in names}
    count = 0
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            for t in ds[schema.INIT_TIME].values:
                stamp = pd.Timestamp(t)
                for step in ds[schema.STEP].values:
                    step_h = int(pd.Timedelta(step).total_seconds() // 3600)
                    block = ds[names].sel({schema.INIT_TIME: t, schema.STEP: step}).load()
                    for name in names:
                        count += _write_messages(f, templates[name], block[name], stamp, step_h)
    finally:
        for h in templates.values():
            eccodes.codes_release(h)
    return count


def _write_messages(f: object, template: int, da: xr.DataArray, init: pd.Timestamp, step_h: int) -> int:
    var = schema.VARIABLES[str(da.name)]
    levels = da[schema.LEVEL].values if schema.LEVEL in da.dims else [None]
    n = 0
    for member in da[schema.MEMBER].values:
        for level in levels:
            sel = {schema.MEMBER: member} | ({schema.LEVEL: level} if level is not None else {})
            values = np.asarray(da.sel(sel).values, dtype=np.float64)[::-1]  # GRIB: north -> south
            h = eccodes.codes_clone(template)
            try:
                eccodes.codes_set(h, "dataDate", int(init.strftime("%Y%m%d")))
                eccodes.codes_set(h, "number", int(member))
                if level is not None:
                    eccodes.codes_set(h, "level", int(level))
                if var.accumulated:
                    eccodes.codes_set(h, "startStep", 0)
                    eccodes.codes_set(h, "endStep", step_h)
                else:
                    eccodes.codes_set(h, "step", step_h)
                if var.missing_over_land:
                    values = np.where(np.isnan(values), MISSING_VALUE, values)
                eccodes.codes_set_values(h, values.ravel())
                eccodes.codes_write(h, f)
                n += 1
            finally:
                eccodes.codes_release(h)
    return n


# --- reading -------------------------------------------------------------------------------------
def index_file(path: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per GRIB message (headers only): identity (``var`` is the postcast name of a schema
    parameter, else eccodes' cfVarName), time processing (stepType, startStep), byte offset, length and
    grid, and the keys of its parameter (:data:`PARAM_KEYS`). Every parameter is indexed, known to the
    schema or not: what to take is decided from the index (sources.GribSource.plan)."""
    rows = []
    grids: dict[str, list[object]] = {}
    params: dict[str, dict[str, object]] = {}
    path = Path(path)
    with open(path, "rb") as f:
        i = 0
        while True:
            try:
                h = eccodes.codes_grib_new_from_file(f, headers_only=True)
            except Exception as err:  # eccodes raises several types for truncated / corrupt data
                msg = f"{path}: corrupt or truncated GRIB after message {i}: {err}"
                raise BadInputError(msg) from err
            if h is None:
                break
            try:
                rows.append(_header_row(h, path, i, grids, params))
            finally:
                eccodes.codes_release(h)
            i += 1
    if not rows:
        msg = f"{path}: no GRIB messages found (empty or not a GRIB file)"
        raise BadInputError(msg)
    df = pd.DataFrame(rows, columns=INDEX_COLUMNS)
    end = int((df["offset"] + df["length"]).max())
    if end > path.stat().st_size:
        msg = f"{path}: truncated: last message ends at byte {end} but the file has {path.stat().st_size} bytes"
        raise BadInputError(msg)
    _check_no_stray_bytes(path, df)
    return df


def _check_no_stray_bytes(path: Path, df: pd.DataFrame) -> None:
    """eccodes skips bytes that do not start with "GRIB", so a message whose magic is damaged silently
    disappears (and would be reported as missing, i.e. retryable). Every byte outside the messages must
    be zero padding; anything else is a damaged message."""
    starts = df["offset"].to_numpy(np.int64)
    ends = starts + df["length"].to_numpy(np.int64)
    order = np.argsort(starts)
    gaps = list(
        zip(np.concatenate([[0], ends[order]]), np.concatenate([starts[order], [path.stat().st_size]]), strict=True)
    )
    with open(path, "rb") as f:
        for i, (lo, hi) in enumerate(gaps):
            if hi <= lo:
                continue
            f.seek(int(lo))
            if f.read(int(hi - lo)).strip(b"\0"):
                where = f"before message {i}" if i < len(gaps) - 1 else "after the last message"
                msg = (
                    f"{path}: {hi - lo} bytes {where} (at byte {lo}) are not GRIB: a damaged message header "
                    "(e.g. a corrupted 'GRIB' magic); re-fetch the file"
                )
                raise BadInputError(msg)


# parameters other centres name differently: NCEP's prmsl (paramId 260074) is ECMWF's msl (151)
SAME_AS = {"prmsl": "msl"}
_LONG_KEYS = ("level", "dataDate", "dataTime", "offset", "totalLength")
_GRID_KEYS = (
    "latitudeOfFirstGridPointInDegrees",
    "latitudeOfLastGridPointInDegrees",
    "longitudeOfFirstGridPointInDegrees",
    "longitudeOfLastGridPointInDegrees",
)


def _get_long(h: int, key: str, default: int) -> int:
    """A key that some editions or local definitions lack (``number`` of an analysis, ``Ni`` of a
    reduced grid): ``default`` when absent or missing. One eccodes call when the key is there (the
    index asks ~10 keys of each of millions of messages: calls, not decoding, are its cost)."""
    try:
        value = int(eccodes.codes_get_long(h, key))
    except Exception:  # eccodes raises several types for absent keys
        return default
    return default if value == eccodes.CODES_MISSING_LONG else value


def _get_string(h: int, key: str) -> str:
    try:
        return str(eccodes.codes_get_string(h, key))
    except Exception:  # absent key
        return ""


def _get_double(h: int, key: str) -> float:
    """A key that some grids lack (a Lambert grid has no last grid point): NaN when absent."""
    try:
        return float(eccodes.codes_get_double(h, key))
    except eccodes.CodesInternalError:
        return float("nan")


def _grid_keys(h: int) -> list[object]:
    """ni, nj, first/last latitude and longitude, gridType, number of points and scanning flags of a
    message (NaN or 0 for what its grid type lacks: the type is refused or read in gribgrids.grid_of)."""
    ni, nj = _get_long(h, "Ni", 0), _get_long(h, "Nj", 0)
    grid = [_get_double(h, k) for k in _GRID_KEYS]
    gtype = eccodes.codes_get_string(h, "gridType")
    return [ni, nj, *grid, gtype, _get_long(h, "numberOfPoints", ni * nj), scan_flags(h)]


def _param(h: int, short: str, params: dict[str, dict[str, object]]) -> dict[str, object]:
    """The once-per-parameter keys of a message (:data:`PARAM_KEYS`), cached by shortName (by paramId
    for eccodes' 'unknown'), so a file of millions of messages asks them once per parameter."""
    key = short if short != "unknown" else f"unknown:{eccodes.codes_get_long(h, 'paramId')}"
    if key not in params:
        got: dict[str, object] = {col: _get_string(h, k) for k, col in PARAM_KEYS.items() if k != "paramId"}
        params[key] = {**got, "param_id": _get_long(h, "paramId", 0)}
    return params[key]


def _name(short: str, param: dict[str, object], type_of_level: str) -> str:
    """The postcast name of a parameter: the schema's when it knows the parameter on this kind of level,
    else eccodes' cfVarName (cfgrib's name), else the shortName, else ``p<paramId>``."""
    var = schema.BY_SHORT_NAME.get(SAME_AS.get(short, short)) or schema.BY_PARAM_ID.get(int(str(param["param_id"])))
    if var is not None and var.on_levels == (type_of_level == schema.LevelType.PRESSURE):
        return var.name
    name = next((str(n) for n in (param["cf_var"], short) if n and n != "unknown"), f"p{param['param_id']}")
    return name if var is None else f"{name}_{type_of_level}"  # e.g. schema t on model levels


def _header_row(
    h: int, path: Path, i: int, grids: dict[str, list[object]], params: dict[str, dict[str, object]]
) -> list[object]:
    """The index row of one message. ``grids`` caches the grid keys by the grid section's MD5 (one call
    instead of eight for every message on a grid already seen), ``params`` the keys of each parameter."""
    try:
        short = eccodes.codes_get_string(h, "shortName")
        param = _param(h, short, params)
        type_of_level = eccodes.codes_get_string(h, "typeOfLevel")
        name = _name(short, param, type_of_level)
        pl = type_of_level == schema.LevelType.PRESSURE
        level, date, hhmm, offset, length = (eccodes.codes_get_long(h, k) for k in _LONG_KEYS)
        number = _get_long(h, "number", 0)  # analyses and deterministic forecasts: member 0
        step = _get_long(h, "endStep", 0)
        init = pd.Timestamp(year=date // 10000, month=date // 100 % 100, day=date % 100, hour=hhmm // 100)
        md5 = _get_string(h, "md5GridSection")
        grid = grids.get(md5) if md5 else None
        if grid is None:
            grid = _grid_keys(h)
            if md5:
                grids[md5] = grid
        ni, nj, *corners, gtype, n_values, scan = grid
        dtype = _get_string(h, "dataType")
        step_type = _get_string(h, "stepType") or "instant"
        return [
            name,
            level if pl else 0,
            number,
            init,
            step,
            offset,
            length,
            ni,
            nj,
            *corners,
            gtype,
            n_values,
            scan,
            dtype,
            short,
            type_of_level,
            step_type,
            _get_long(h, "startStep", step),
            *(param[c] for c in PARAM_COLUMNS),
        ]
    except Exception as err:
        msg = f"{path}: cannot read the header of GRIB message {i}: {err}"
        raise BadInputError(msg) from err


def decode(path: str | os.PathLike[str], rows: Iterable[tuple[int, int]], shape: tuple[int, ...]) -> np.ndarray:
    """Decode messages at (offset, length) into (n, *shape) float32, NaN where the bitmap marks missing
    values; regular grids (shape (n_lat, n_lon)) come latitude ascending, point grids (shape (n,)) in
    storage order."""
    rows = list(rows)
    out = np.empty((len(rows), *shape), dtype=np.float32)
    decode_into(path, rows, out, range(len(rows)))
    return out


def _values(h: int) -> np.ndarray:
    """A message's values as float32 (eccodes >= 2.30 decodes to float directly: one copy less), in double
    precision where eccodes has no single-precision decoder for the packing (grid_jpeg, grid_ieee: "Function
    not yet implemented") or is older."""
    try:
        return np.asarray(eccodes.codes_get_float_array(h, "values"))
    except (AttributeError, eccodes.CodesInternalError):
        return np.asarray(eccodes.codes_get_values(h), dtype=np.float32)


def decode_into(
    path: str | os.PathLike[str], rows: Iterable[tuple[int, int]], out: np.ndarray, positions: Iterable[int]
) -> None:
    """Decode the messages at (offset, length) of ``rows`` into ``out[positions]`` (each (*shape) float32,
    as :func:`decode` lays them out), without an intermediate array per file."""
    shape = out.shape[1:]
    size = int(np.prod(shape))
    with open(path, "rb") as f:
        for (offset, length), k in zip(rows, positions, strict=True):
            f.seek(offset)
            buf = f.read(length)
            try:
                h = eccodes.codes_new_from_message(buf)
            except Exception as err:
                msg = f"{path}: corrupt GRIB message at byte {offset}: {err}"
                raise BadInputError(msg) from err
            try:
                values = _values(h)
                if eccodes.codes_get_long(h, "bitmapPresent"):
                    values[values == np.float32(eccodes.codes_get_double(h, "missingValue"))] = np.nan
                scan = scan_flags(h) if len(shape) == 2 else SCAN_BITS["jScansPositively"]
            except Exception as err:
                msg = f"{path}: cannot decode GRIB message at byte {offset}: {err}"
                raise BadInputError(msg) from err
            finally:
                eccodes.codes_release(h)
            if values.size != size:
                msg = f"{path}: message at byte {offset} has {values.size} values, expected {size}"
                raise BadInputError(msg)
            out[k] = in_grid_order(values, shape, scan)


def copy_messages(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], keep: Callable[[dict[str, object]], bool]
) -> int:
    """Copy the messages of ``src`` for which ``keep(keys)`` is true to ``dst`` (like ``grib_copy -w``);
    ``keys`` holds shortName, level, number, dataDate and endStep. Returns the messages copied."""
    n = 0
    with open(src, "rb") as fin, atomic_path(dst) as tmp, open(tmp, "wb") as fout:
        while (h := eccodes.codes_grib_new_from_file(fin)) is not None:
            try:
                keys = {k: eccodes.codes_get(h, k) for k in ("shortName", "level", "number", "dataDate", "endStep")}
                if keep(keys):
                    eccodes.codes_write(h, fout)
                    n += 1
            finally:
                eccodes.codes_release(h)
    return n
