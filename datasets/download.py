"""``postcast download ens10``: the ENS-10 files (and the ERA5 truth its baselines use) over HTTP.

ENS-10 is one GRIB1 file per 2018 month-day and level type, ``output.{pl|sfc}.2018MMDD`` (each holds
the 20 reforecast years of that month-day), on ECMWF's public object store (docs/ens10.md, "Files").
A date range selects the ENS-10 month-days it contains (Mondays and Thursdays of 2018, whatever the
years asked); ``groups`` picks pl and/or sfc. The ERA5 analyses the ENS-10 baselines score against
are per year (``analysis_{pl|sfc}_YYYY`` on the SPCL mirror).

Transfers: several at once (a thread pool; HTTP is I/O-bound), each streamed to ``NAME.part`` and
resumed with an HTTP ``Range`` request after a dropped connection or an interrupted run; the size is
checked against what the server announced (``Content-Length`` / ``Content-Range``), the MD5 against a
single-part S3 ``ETag`` when the server sends one; only a checked file is renamed to ``NAME``
(atomic ``os.replace``), so a file under its final name is always complete and reruns skip it. Bytes a
transfer wrote are vouched for by a record beside the part (``NAME.part.sha256``: length and SHA-256);
where the server sends no MD5, a part that record does not vouch for (left by something else, or
damaged since) is fetched again from the start, never renamed into place unchecked.
``dry_run`` lists names and addresses (sizes where a ``HEAD`` answers; none offline). Standard
library only (urllib), no torch.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import email.message
import hashlib
import http.client
import json
import logging
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from postcast.datasets import schema
from postcast.datasets.core.errors import BadInputError, ConfigError, MissingInputError

log = logging.getLogger(__name__)

ENS10_URL = "https://object-store.os-api.cci1.ecmwf.int/maelstrom-ap4/"
ERA5_URL = "http://spclstorage.inf.ethz.ch/projects/deep-weather/ERA5/"
GROUPS = ("pl", "sfc")
CHUNK = 1 << 20  # bytes per read
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})  # a server's transient errors: retried like a broken transfer
BACKOFF_S = 1.0  # seconds before the first retry; doubled before each next one
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class Remote:
    """One file to fetch: its name under the output directory and its address."""

    name: str
    url: str
    size: int | None = None  # bytes, where a HEAD request answered
    md5: str | None = None  # the MD5 of a single-part S3 ETag, where a HEAD request answered with one


def check_url(url: str, option: str) -> str:
    """``url`` with a trailing slash, if it is an http(s) address; else a ConfigError naming ``option``."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        msg = f"{option} {url!r}: not an http:// or https:// address; give the folder of the files, e.g. https://HOST/PATH/"
        raise ConfigError(msg)
    return url if url.endswith("/") else url + "/"


def ens10_files(start: str, end: str, groups: tuple[str, ...] = GROUPS, base: str = ENS10_URL) -> list[Remote]:
    """The ENS-10 files holding the init dates between ``start`` and ``end`` (inclusive)."""
    bad = [g for g in groups if g not in GROUPS]
    if bad or not groups:
        msg = f"groups {list(groups)}: use pl and/or sfc"
        raise ConfigError(msg)
    try:
        days = pd.date_range(pd.Timestamp(start), pd.Timestamp(end), freq="D")
    except ValueError as err:
        msg = f"--start {start!r} / --end {end!r}: not dates (use e.g. 2018-01-01)"
        raise ConfigError(msg) from err
    if len(days) == 0:
        msg = f"--end {end} is before --start {start}"
        raise ConfigError(msg)
    wanted = {(int(d.month), int(d.day)) for d in days}
    month_days = [md for md in schema.ens10_month_days() if md in wanted]
    if not month_days:
        msg = f"no ENS-10 init date (Mondays and Thursdays of 2018, by month-day) between {start} and {end}"
        raise ConfigError(msg)
    base = check_url(base, "--base-url")
    names = [f"output.{g}.{schema.file_date_label(m, d)}" for m, d in month_days for g in groups]
    return [Remote(n, base + n) for n in names]


# Nominal sizes of one ENS-10 file per group, from the dataset's description (pl: 7 variables x 11 levels,
# sfc: 11 variables; 10 members x 20 years x 3 steps at 0.5 deg, GRIB1 16-bit packing): what a dry run
# announces when no server answers. The real sizes come from the server and are checked on arrival.
NOMINAL_BYTES = {"pl": 24_000_000_000, "sfc": 3_400_000_000}


def nominal_size(remote: Remote) -> int | None:
    """The expected size of an ENS-10 file (``output.pl.*`` / ``output.sfc.*``); None for others."""
    group = remote.name.split(".")[1] if remote.name.startswith("output.") else None
    return NOMINAL_BYTES.get(group or "")


def era5_files(years: tuple[int, ...], groups: tuple[str, ...] = GROUPS, base: str = ERA5_URL) -> list[Remote]:
    """The yearly ERA5 analysis files the ENS-10 baselines use as truth."""
    base = check_url(base, "--era5-url")
    return [Remote(f"era5/analysis_{g}_{y}", f"{base}analysis_{g}_{y}") for y in years for g in groups]


def head(url: str, timeout: float = 5.0) -> tuple[int | None, str | None]:
    """The size and MD5 ETag a server announces for ``url`` (None for what it does not say, or offline)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout) as r:
            length = r.headers.get("Content-Length")
            return (int(length) if length is not None else None), _md5_etag(r.headers)
    except (OSError, ValueError, http.client.HTTPException):
        return None, None


def with_sizes(files: list[Remote], jobs: int = 8, timeout: float = 5.0) -> list[Remote]:
    """``files`` with the size and MD5 ETag their servers announce (HEAD requests, ``jobs`` at once)."""
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        heads = list(pool.map(lambda f: head(f.url, timeout), files))
    return [Remote(f.name, f.url, size, md5) for f, (size, md5) in zip(files, heads, strict=True)]


def _total_size(resp: http.client.HTTPResponse, offset: int) -> int | None:
    rng = resp.headers.get("Content-Range")
    if rng:
        m = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", rng)
        if m and m.group(3) != "*":
            return int(m.group(3))
    length = resp.headers.get("Content-Length")
    return int(length) + offset if length is not None else None


def _md5_etag(headers: email.message.Message) -> str | None:
    """A single-part S3 ETag is the MD5 of the object; multipart ones (with '-') are not."""
    etag = (headers.get("ETag") or "").strip('"')
    return etag.lower() if re.fullmatch(r"[0-9a-fA-F]{32}", etag) else None


@contextlib.contextmanager
def _request(url: str, offset: int, timeout: float) -> Iterator[http.client.HTTPResponse]:
    req = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        yield resp


def _attempt(remote: Remote, part: Path, timeout: float, bar: object | None) -> tuple[int | None, str | None]:
    """One GET from where ``part`` ends; returns (announced total size, MD5 ETag)."""
    offset = part.stat().st_size if part.exists() else 0
    with _request(remote.url, offset, timeout) as resp:
        if offset and resp.status != 206:  # the server ignored the Range: start again
            offset = 0
        total = _total_size(resp, offset) if resp.status in (200, 206) else None
        try:
            with open(part, "r+b" if offset else "wb") as f:
                f.seek(offset)
                f.truncate()
                while block := resp.read(CHUNK):
                    f.write(block)
                    if bar is not None:
                        bar.update(len(block))  # type: ignore[attr-defined]
                have = f.tell()
        finally:
            _vouch(part)
        if total is not None and have < total:  # a dropped connection reads as a short body, not an error
            msg = f"connection closed at byte {have} of {total}"
            raise ConnectionError(msg)
        return total, _md5_etag(resp.headers)


def fetch(
    remote: Remote,
    out: Path,
    *,
    retries: int = 5,
    timeout: float = 60.0,
    bar: object | None = None,
    backoff: float = BACKOFF_S,
) -> str:
    """Download one file (resuming ``NAME.part``), check it and rename it into place; returns
    "skipped" or "fetched". A ``NAME.part`` left by an earlier run that fails the checks is discarded
    and the whole file fetched again. Raises MissingInputError (66) when the server cannot give it,
    BadInputError (65) when what arrived has the wrong size or checksum."""
    final = out / remote.name
    if final.exists():
        return "skipped"
    final.parent.mkdir(parents=True, exist_ok=True)
    part = final.with_name(final.name + ".part")
    earlier = part.exists() and part.stat().st_size > 0  # bytes of an earlier run, resumed, not checked yet
    vouched = _vouched(part)
    size, md5 = _transfer(remote, part, retries, timeout, bar, backoff)
    problem = _problem(remote, part, size, md5)
    if problem is None and earlier and not vouched and (md5 or remote.md5) is None:
        problem = "the server sends no MD5 to check the bytes an earlier run left in the part file"
    if problem is not None and earlier:  # the earlier bytes may be the damaged ones: once more from the start
        log.warning("%s: %s; discarding %s and fetching the whole file again", remote.name, problem, part.name)
        part.unlink()
        problem = _problem(remote, part, *_transfer(remote, part, retries, timeout, bar, backoff))
    if problem is not None:
        part.unlink()
        _record(part).unlink(missing_ok=True)
        msg = f"{remote.url}: {problem}; the partial file was removed, rerun to fetch it again"
        raise BadInputError(msg)
    os.replace(part, final)
    _record(part).unlink(missing_ok=True)
    return "fetched"


def _record(part: Path) -> Path:
    return part.with_name(part.name + ".sha256")


def _digest(part: Path, nbytes: int) -> str:
    h = hashlib.sha256()
    with open(part, "rb") as f:
        while nbytes > 0 and (block := f.read(min(CHUNK, nbytes))):
            h.update(block)
            nbytes -= len(block)
    return h.hexdigest()


def _vouch(part: Path) -> None:
    """Record the part's length and SHA-256: these bytes came from the server through this code."""
    if part.exists():
        n = part.stat().st_size
        tmp = _record(part).with_suffix(".tmp")
        tmp.write_text(json.dumps({"bytes": n, "sha256": _digest(part, n)}))
        os.replace(tmp, _record(part))


def _vouched(part: Path) -> bool:
    """Whether the record beside ``part`` vouches for its bytes; bytes past the recorded length (a
    transfer killed before it could record them) are cut off, so a resume starts from vouched bytes."""
    try:
        rec = json.loads(_record(part).read_text())
        n, digest = int(rec["bytes"]), str(rec["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not part.exists() or part.stat().st_size < n or _digest(part, n) != digest:
        return False
    with open(part, "r+b") as f:
        f.truncate(n)
    return True


def _transfer(
    remote: Remote, part: Path, retries: int, timeout: float, bar: object | None, backoff: float
) -> tuple[int | None, str | None]:
    """GET ``remote`` into ``part`` (resuming it), retrying a broken transfer or a server's transient
    error ``retries`` times, ``backoff`` seconds after the first failure and twice as long after each
    next one (at most BACKOFF_MAX_S); returns the size and MD5 the server announced (None: not said)."""
    attempt = 0
    while True:
        try:
            return _attempt(remote, part, timeout, bar)
        except urllib.error.HTTPError as err:
            if err.code == 416 and part.exists():  # nothing left to send: the part is as long as the file
                return _after_416(remote, err)
            if err.code not in RETRY_STATUS:
                msg = f"{remote.url}: HTTP {err.code} {err.reason}; check the address (--base-url) or try later"
                raise MissingInputError(msg) from err
            failure = f"HTTP {err.code} {err.reason}"
        except (OSError, http.client.HTTPException) as err:
            failure = str(err)
        have = part.stat().st_size if part.exists() else 0
        if attempt == retries:
            msg = (
                f"{remote.url}: the transfer failed {retries + 1} times (last at byte {have}: {failure}); "
                f"rerun the same command to resume from {part.name}"
            )
            raise MissingInputError(msg)
        wait = min(backoff * 2**attempt, BACKOFF_MAX_S)
        log.warning(
            "%s: transfer broke at byte %d (%s); retry %d of %d in %.1f s",
            remote.name,
            have,
            failure,
            attempt + 1,
            retries,
            wait,
        )
        time.sleep(wait)
        attempt += 1


def _after_416(remote: Remote, err: urllib.error.HTTPError) -> tuple[int | None, str | None]:
    """Size and MD5 to check a part the server has nothing more for (HTTP 416): from the answer's
    ``Content-Range: bytes */SIZE`` and ETag, else from a HEAD request."""
    m = re.match(r"bytes \*/(\d+)", err.headers.get("Content-Range") or "")
    size, md5 = (int(m.group(1)) if m else None), _md5_etag(err.headers)
    if size is None or md5 is None:
        head_size, head_md5 = head(remote.url)
        size, md5 = size if size is not None else head_size, md5 or head_md5
    return size, md5


def _problem(remote: Remote, part: Path, size: int | None, md5: str | None) -> str | None:
    """What is wrong with ``part`` (its size against the announced one, its MD5 against the ETag), or None."""
    got = part.stat().st_size
    expected = remote.size if remote.size is not None else size
    if expected is not None and got != expected:
        return f"received {got} bytes, the server announced {expected}"
    md5 = md5 or remote.md5
    if md5 is None:
        return None
    h = hashlib.md5(usedforsecurity=False)
    with open(part, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return None if h.hexdigest() == md5 else f"MD5 {h.hexdigest()} differs from the server's ETag {md5}"


def download(
    files: list[Remote],
    out: str | Path,
    *,
    jobs: int = 4,
    retries: int = 5,
    timeout: float = 60.0,
    progress: bool = True,
    backoff: float = BACKOFF_S,
) -> dict[str, list[str]]:
    """Fetch ``files`` into ``out`` with ``jobs`` transfers at once; returns names per outcome."""
    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [f for f in files if not (out / f.name).exists()]
    sized = with_sizes(todo, jobs) if todo else []
    total = sum(f.size or 0 for f in sized) or None
    result: dict[str, list[str]] = {"fetched": [], "skipped": [f.name for f in files if f not in todo]}
    with (
        tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc="download",
            disable=not progress,
            mininterval=0.5,
        ) as bar,
        cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool,
    ):
        futures = {
            pool.submit(fetch, f, out, retries=retries, timeout=timeout, bar=bar, backoff=backoff): f for f in sized
        }
        for fut in cf.as_completed(futures):
            result[fut.result()].append(futures[fut].name)
    return result
