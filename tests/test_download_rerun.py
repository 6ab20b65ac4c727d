"""Reruns of `postcast download` over what an earlier run left, and its retries, against the real HTTP
server on loopback of tests/test_download.py: a damaged ``.part`` is checked (size and MD5 ETag) and
fetched again, never renamed into place; broken transfers are retried after a growing delay."""

from __future__ import annotations

import logging

import pytest
from test_download import Server, _dates

from postcast.cli import main
from postcast.datasets import download
from postcast.datasets.core.errors import MissingInputError


def _sfc(src):
    name = sorted(p.name for p in src.glob("output.sfc.*"))[0]
    return name, (src / name).read_bytes()


def test_a_full_size_part_of_zeros_is_fetched_again_not_kept(synth_grib, tmp_path, capsys):
    """A ``.part`` as long as the file but all zeros: the server answers the resume with 416 (nothing
    left to send); its MD5 ETag differs, so the part is discarded and the whole file fetched again."""
    name, data = _sfc(synth_grib)
    out = tmp_path / "d"
    out.mkdir()
    (out / f"{name}.part").write_bytes(bytes(len(data)))
    start, end = _dates(synth_grib)
    with Server(synth_grib) as srv:
        rc = main(
            [
                "--no-progress",
                "download",
                "ens10",
                "--start",
                start,
                "--end",
                end,
                "--group",
                "sfc",
                "--out",
                str(out),
                "--base-url",
                srv.url,
            ]
        )
        gets = [r for m, _, r in srv.requests if m == "GET"]
    assert rc == 0 and "fetched 1, kept 0 complete files" in capsys.readouterr().out
    assert (out / name).read_bytes() == data and not (out / f"{name}.part").exists()
    assert gets == [f"bytes={len(data)}-", None]  # the resume (416), then the whole file


@pytest.mark.parametrize("etag", ["none", "multipart"])
def test_a_part_no_checksum_can_vouch_for_is_fetched_again(synth_grib, tmp_path, etag):
    """A full-size ``.part`` of zeros that this postcast did not write, from a server that sends no MD5
    (no ETag, or a multipart one): nothing can check those bytes, so they are not renamed into place."""
    name, data = _sfc(synth_grib)
    (tmp_path / f"{name}.part").write_bytes(bytes(len(data)))
    with Server(synth_grib, etag=etag) as srv:
        assert download.fetch(download.Remote(name, srv.url + name), tmp_path) == "fetched"
    assert (tmp_path / name).read_bytes() == data and not (tmp_path / f"{name}.part").exists()


@pytest.mark.parametrize("etag", ["none", "multipart"])
def test_a_dropped_transfer_without_checksums_still_resumes(synth_grib, tmp_path, etag):
    """The bytes postcast wrote itself are vouched for by its own record beside the part, so a dropped
    connection resumes with a Range request even where the server sends no MD5."""
    name, data = _sfc(synth_grib)
    with Server(synth_grib, mode="drop", etag=etag) as srv:
        assert download.fetch(download.Remote(name, srv.url + name), tmp_path, backoff=0.0) == "fetched"
        gets = [r for m, _, r in srv.requests if m == "GET"]
    assert (tmp_path / name).read_bytes() == data and len(gets) == 2 and gets[1] is not None
    assert not list(tmp_path.glob("*.part*"))


def test_a_416_without_a_prior_head_checks_the_etag_by_head(synth_grib, tmp_path):
    """:func:`download.fetch` called alone (no HEAD before): the 416 answer has no ETag, so fetch asks
    for it with a HEAD and still refuses to keep the damaged part."""
    name, data = _sfc(synth_grib)
    (tmp_path / f"{name}.part").write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # the last byte flipped
    with Server(synth_grib) as srv:
        assert download.fetch(download.Remote(name, srv.url + name), tmp_path) == "fetched"
        assert ("HEAD", f"/maelstrom-ap4/{name}", None) in srv.requests
    assert (tmp_path / name).read_bytes() == data


def test_broken_transfers_are_retried_after_a_growing_delay(synth_grib, tmp_path, caplog):
    """Every GET is cut half way: 1 + 2 retries, 0.1 s then 0.2 s apart, counted against the retries
    (never "(3/2)"), then one error that says how to resume."""
    name, _ = _sfc(synth_grib)
    with (
        Server(synth_grib, "cut") as srv,
        caplog.at_level(logging.WARNING, "postcast.datasets.download"),
        pytest.raises(MissingInputError, match="failed 3 times"),
    ):
        download.fetch(download.Remote(name, srv.url + name), tmp_path, retries=2, backoff=0.1)
    gaps = [b - a for a, b in zip(srv.times, srv.times[1:], strict=False)]
    assert len(srv.times) == 3 and 0.1 <= gaps[0] < 0.1 + 1.0 and 0.2 <= gaps[1] < 0.2 + 1.0, gaps
    retries = [r.getMessage() for r in caplog.records]
    assert [m.split("; ")[-1] for m in retries] == ["retry 1 of 2 in 0.1 s", "retry 2 of 2 in 0.2 s"], retries


def test_a_busy_server_is_retried_then_reported(synth_grib, tmp_path):
    """HTTP 503 (a transient server error) is retried like a broken transfer, not reported at once."""
    name, _ = _sfc(synth_grib)
    with Server(synth_grib, "busy") as srv, pytest.raises(MissingInputError, match="HTTP 503"):
        download.fetch(download.Remote(name, srv.url + name), tmp_path, retries=2, backoff=0.01)
    assert len(srv.times) == 3
