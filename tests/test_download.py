"""`postcast download ens10` against a real HTTP server on loopback serving postcast's synthetic ENS-10
GRIB files: listing, concurrent transfers, resume with Range after a dropped connection, size checks."""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
import time
from pathlib import Path

import pytest

from postcast.datasets import download
from postcast.datasets.core.errors import BadInputError


class Server:
    """A threaded HTTP server on 127.0.0.1 with Range support (416 for a range past the end, as S3) and
    MD5 ETags; ``mode`` "drop" cuts the first GET of each file half way (then closes the connection),
    "wrong_size" announces 100 bytes more in HEAD, "cut" cuts every GET half way, "busy" answers every
    GET with 503. ``etag`` "md5" sends single-part S3 ETags (the MD5), "multipart" S3's multipart form
    (not an MD5), "none" no ETag. ``times`` holds when each GET arrived (time.monotonic)."""

    def __init__(self, root: Path, mode: str = "ok", etag: str = "md5"):
        self.root, self.mode, self.etag = root, mode, etag
        self.requests: list[tuple[str, str, str | None]] = []
        self.dropped: set[str] = set()
        self.times: list[float] = []
        handler = self._handler()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/maelstrom-ap4/"

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _file(self) -> Path | None:
                name = self.path.rsplit("/", 1)[-1]
                p = server.root / name
                return p if p.is_file() else None

            def do_HEAD(self) -> None:
                server.requests.append(("HEAD", self.path, None))
                p = self._file()
                if p is None:
                    self.send_error(404)
                    return
                extra = 100 if server.mode == "wrong_size" else 0
                self.send_response(200)
                self.send_header("Content-Length", str(p.stat().st_size + extra))
                self._etag(p.read_bytes())
                self.end_headers()

            def _etag(self, data: bytes) -> None:
                md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
                if server.etag != "none":
                    self.send_header("ETag", f'"{md5}"' if server.etag == "md5" else f'"{md5}-3"')

            def do_GET(self) -> None:
                rng = self.headers.get("Range")
                server.requests.append(("GET", self.path, rng))
                server.times.append(time.monotonic())
                p = self._file()
                if p is None or server.mode == "busy":
                    self.send_error(404 if p is None else 503)
                    return
                data = p.read_bytes()
                start = int(re.match(r"bytes=(\d+)-", rng).group(1)) if rng else 0
                if start >= len(data):  # S3: nothing to send from there
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = data[start:]
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(body)))
                self._etag(data)
                self.end_headers()
                if server.mode == "cut" or (server.mode == "drop" and p.name not in server.dropped):
                    server.dropped.add(p.name)
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the connection drops half way
                    return
                self.wfile.write(body)

        return Handler


def _dates(src: Path) -> tuple[str, str]:
    """The first synthetic month-day as a one-day range (its pl and sfc files)."""
    label = sorted(p.name.rsplit(".", 1)[-1] for p in src.glob("output.pl.*"))[0]
    return f"2018-{label[4:6]}-{label[6:]}", f"2018-{label[4:6]}-{label[6:]}"


def _remotes(src: Path, url: str) -> list[download.Remote]:
    return [download.Remote(p.name, url + p.name) for p in sorted(src.glob("output.*"))]


def test_dry_run_lists_the_ens10_files_and_addresses_offline():
    files = download.ens10_files("2018-01-01", "2018-01-08")
    assert [f.name for f in files] == [f"output.{g}.201801{d}" for d in ("01", "04", "08") for g in ("pl", "sfc")]
    assert files[0].url == "https://object-store.os-api.cci1.ecmwf.int/maelstrom-ap4/output.pl.20180101"
    assert [f.name for f in download.ens10_files("2015-01-02", "2015-01-05", ("sfc",))] == ["output.sfc.20180104"]


def test_dry_run_cli_gives_sizes_where_the_server_answers(synth_grib, capsys):
    from postcast.cli import main

    start, end = _dates(synth_grib)
    with Server(synth_grib) as srv:
        rc = main(["download", "ens10", "--start", start, "--end", end, "--dry-run", "--base-url", srv.url])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0 and out[-1] == "2 files"
    name, url, size = out[0].split("\t")
    assert url == srv.url + name and size == f"{(synth_grib / name).stat().st_size} B"
    assert not any(m == "GET" for m, _, _ in srv.requests)  # a dry run fetches nothing


def test_concurrent_download_is_byte_identical_and_reruns_skip(synth_grib, tmp_path, capsys):
    from postcast.cli import main

    with Server(synth_grib) as srv:
        files = _remotes(synth_grib, srv.url)
        res = download.download(files, tmp_path / "d", jobs=3, progress=False)
        assert len(res["fetched"]) == len(files) == 6
        for p in synth_grib.glob("output.*"):
            assert (tmp_path / "d" / p.name).read_bytes() == p.read_bytes()
        n_get = sum(m == "GET" for m, _, _ in srv.requests)
        start, end = _dates(synth_grib)
        args = [
            "--no-progress",
            "download",
            "ens10",
            "--start",
            start,
            "--end",
            end,
            "--out",
            str(tmp_path / "d"),
            "--base-url",
            srv.url,
            "--jobs",
            "3",
        ]
        assert main(args) == 0 and sum(m == "GET" for m, _, _ in srv.requests) == n_get  # nothing fetched again
    assert "fetched 0, kept 2" in capsys.readouterr().out
    assert not list((tmp_path / "d").glob("*.part"))


def test_dropped_connection_resumes_with_range_and_completes_byte_identical(synth_grib, tmp_path):
    with Server(synth_grib, "drop") as srv:
        files = _remotes(synth_grib, srv.url)
        res = download.download(files, tmp_path / "d", jobs=2, progress=False)
    assert sorted(res["fetched"]) == sorted(f.name for f in files)
    resumed = [r for m, _, r in srv.requests if m == "GET" and r]
    assert len(resumed) == len(files) and all(r != "bytes=0-" for r in resumed)  # resumed from the break
    for f in files:
        assert (tmp_path / "d" / f.name).read_bytes() == (synth_grib / f.name).read_bytes()


def test_an_interrupted_run_resumes_from_the_part_file(synth_grib, tmp_path):
    name = sorted(p.name for p in synth_grib.glob("output.sfc.*"))[0]
    data = (synth_grib / name).read_bytes()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / f"{name}.part").write_bytes(data[: len(data) // 3])  # what a killed run left
    with Server(synth_grib) as srv:
        download.fetch(download.Remote(name, srv.url + name), tmp_path / "d")
    assert (tmp_path / "d" / name).read_bytes() == data
    assert [r for m, _, r in srv.requests if m == "GET"] == [f"bytes={len(data) // 3}-"]


def test_a_wrong_size_is_refused_and_nothing_gets_the_final_name(synth_grib, tmp_path):
    name = sorted(p.name for p in synth_grib.glob("output.pl.*"))[0]
    with Server(synth_grib, "wrong_size") as srv, pytest.raises(BadInputError, match="the server announced"):
        download.download([download.Remote(name, srv.url + name)], tmp_path / "d", jobs=1, progress=False)
    assert not (tmp_path / "d" / name).exists() and not (tmp_path / "d" / f"{name}.part").exists()


def test_missing_file_and_bad_dates_are_one_line_errors(synth_grib, tmp_path, capsys):
    from postcast.cli import main

    with Server(synth_grib) as srv:
        rc = main(
            [
                "--no-progress",
                "download",
                "ens10",
                "--start",
                "2018-01-01",
                "--out",
                str(tmp_path / "d"),
                "--base-url",
                srv.url,
            ]
        )
    err = capsys.readouterr().err
    assert rc == 66 and "HTTP 404" in err and "Traceback" not in err
    assert main(["download", "ens10", "--start", "2018-01-02", "--end", "2018-01-03", "--dry-run"]) == 2
    assert main(["download", "ens10", "--start", "soon", "--dry-run"]) == 2


def test_ens10_pipeline_dry_run_lists_stages_files_and_expected_sizes(tmp_path, monkeypatch, capsys):
    """`postcast run configs/ens10.yaml --dry-run`: the download stage lists every ENS-10 file (two per
    init month-day of 2018: 105 month-days) and every ERA5 year with addresses and expected sizes, offline,
    before ingest, the 18 training stages, evaluate and forecast."""
    from postcast.cli import main

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(root / "configs")  # the config's paths are relative to the working dir
    assert main(["run", "configs/ens10.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    stages = [line.split()[0] for line in out if not line.startswith(" ")]
    assert stages[:2] == ["download", "ingest"] and stages[-2:] == ["evaluate", "forecast"]
    assert sum(s.startswith("train:") for s in stages) == 18
    files = [line.split() for line in out if line.startswith("    data/")]
    ens = [f for f in files if "/output." in f[0]]
    assert len(ens) == 2 * 105 and len(files) == len(ens) + 2 * 20
    pl = next(f for f in ens if f[0].endswith("output.pl.20180101"))
    assert pl[1:3] == ["~24.0", "GB"] and pl[3] == download.ENS10_URL + "output.pl.20180101"
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs" / "ens10" / "summary.json").exists()
