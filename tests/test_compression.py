"""Neural-field compression: round trip within the stated error, the error-bounded mode never
exceeds its bound, the artefact alone decodes, the compressed dataloader yields what decoding yields,
bad artefacts give clean errors; the CLI verbs end to end; the classical baselines."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import xarray as xr

from postcast.compression import baselines, report
from postcast.compression.artefact import Artefact
from postcast.compression.container import ArtefactError
from postcast.compression.field import FieldConfig, to_fields
from postcast.compression.loader import CompressedDataModule, CompressedDataset, compress_split, split_fields
from postcast.compression.metrics import relative_wrmse, weighted_std
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec

FAST = FieldConfig(width=32, depth=2, steps=300, batch_points=4096, sigma=1.0)


def smooth_fields(noise: float = 0.0, seed: int = 0) -> xr.Dataset:
    """Two smooth global fields on a 6 deg grid over 4 dates (+ optional white noise)."""
    lat, lon = np.linspace(-90, 90, 31), np.arange(60) * 6.0
    phi, lam = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon), indexing="ij")
    rng = np.random.default_rng(seed)
    a = np.stack([280 + 20 * np.cos(phi) + 3 * np.cos(phi) * np.cos(lam - 0.3 * t) for t in range(4)])
    b = np.stack([5e4 + 800 * np.sin(phi) ** 2 + 150 * np.cos(phi) * np.sin(2 * lam + t) for t in range(4)])
    a, b = a + noise * rng.standard_normal(a.shape), b + noise * 40 * rng.standard_normal(b.shape)
    dims = ("time", "latitude", "longitude")
    return xr.Dataset(
        {"t": (dims, a.astype(np.float32), {"units": "K"}), "z": (dims, b.astype(np.float32), {"units": "m2 s-2"})},
        coords={"time": np.arange(4), "latitude": lat, "longitude": lon},
    )


@pytest.fixture(scope="module")
def fitted() -> tuple[xr.Dataset, Artefact]:
    ds = smooth_fields()
    return ds, Artefact.build(to_fields(ds), FAST, progress=False)


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_round_trip_within_the_stated_error(fitted, tmp_path):
    ds, art = fitted
    path = tmp_path / "f.pcnf"
    size = art.save(path)
    assert size == path.stat().st_size == art.nbytes  # the ratio counts every byte of the file
    assert art.ratio == pytest.approx(ds["t"].size * 2 * 4 / size)
    back = Artefact.load(path).decode()
    for name, key in (("t", "var0"), ("z", "var1")):
        err = back[name].values - ds[name].values
        stated = art.header["errors"][key]
        assert np.abs(err).max() == pytest.approx(stated["max_abs"], rel=1e-5)  # measured after the fp16 cast
        assert stated["wrmse"] < 0.1 * float(ds[name].std())  # 300 steps of a small net: within 10% of the std
        assert back[name].attrs["units"] == ds[name].attrs["units"]
    assert all(a.dtype == np.float16 for k, a in art.arrays.items() if k.startswith("w.") and a.ndim == 2)


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_the_artefact_alone_reproduces_the_decode(fitted, tmp_path):
    _, art = fitted
    first = art.decode_array()
    path = tmp_path / "a" / "f.pcnf"
    art.save(path)
    moved = tmp_path / "elsewhere.pcnf"
    shutil.move(path, moved)
    shutil.rmtree(tmp_path / "a")
    np.testing.assert_array_equal(Artefact.load(moved).decode_array(), first)


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_points_and_regridding_agree_with_the_grid_decode(fitted):
    _, art = fitted
    grid = art.decode_array()  # (V, T, L, H, W)
    lat, lon = art.lat_lon()
    pts = art.decode_points(np.array([1, 3]), np.array([0, 0]), lat[[4, 20]], lon[[7, 59]])
    np.testing.assert_allclose(pts, grid[:, [1, 3], 0, [4, 20], [7, 59]], rtol=1e-6, atol=1e-3)
    fine = art.regrid(3.0)
    assert fine.sizes["latitude"] == 61 and fine.sizes["longitude"] == 120
    np.testing.assert_allclose(fine["t"].values[:, ::2, ::2], grid[0, :, 0], rtol=1e-6, atol=1e-3)


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_int8_weights_are_smaller_and_still_decode(fitted):
    ds, _ = fitted
    art = Artefact.build(
        to_fields(ds), FieldConfig(**{**FAST.to_dict(), "weights": "int8", "steps": 50}), progress=False
    )
    mats = [a for k, a in art.arrays.items() if k.startswith("w.") and a.ndim == 2]
    assert mats and all(a.dtype == np.int8 for a in mats)
    assert np.isfinite(Artefact.from_bytes(art.to_bytes()).decode_array()).all()


@pytest.mark.system  # trains its own compressors: minutes of CPU (tests/tiers.py)
@pytest.mark.parametrize("bound", [0.05, 0.5])
def test_error_bounded_mode_never_exceeds_its_bound(bound, tmp_path):
    ds = smooth_fields(noise=0.3, seed=1)  # white noise the network cannot fit: the residual layer works
    cfg = FieldConfig(**{**FAST.to_dict(), "steps": 80, "error_bound": bound})
    art = Artefact.build(to_fields(ds), cfg, progress=False)
    art.save(tmp_path / "b.pcnf")
    back = Artefact.load(tmp_path / "b.pcnf").decode()
    for name in ("t", "z"):
        assert float(np.abs(back[name].values - ds[name].values).max()) <= bound
    assert art.header["residual"]["bound"] == bound
    assert max(e["max_abs"] for e in art.header["errors"].values()) <= bound


@pytest.mark.system  # trains its own compressors: minutes of CPU (tests/tiers.py)
def test_per_variable_bounds_leave_unbounded_variables_to_the_network(tmp_path):
    ds = smooth_fields(noise=0.3, seed=2)
    fields = to_fields(ds)
    plain = Artefact.build(fields, FieldConfig(**{**FAST.to_dict(), "steps": 80}), progress=False)
    bounded = plain.with_error_bounds(fields, {"t": 0.05})  # same network, residual layer on t only
    bounded.save(tmp_path / "t.pcnf")
    back = Artefact.load(tmp_path / "t.pcnf")
    assert back.config.error_bounds == {"t": 0.05} and back.header["residual"]["bounds"] == [0.05, None]
    got, net_only = back.decode_array(), plain.decode_array()
    assert float(np.abs(got[0] - fields.data[0]).max()) <= 0.05 < float(np.abs(net_only[0] - fields.data[0]).max())
    np.testing.assert_array_equal(got[1], net_only[1])  # z: the network's decode, untouched
    assert plain.nbytes < bounded.nbytes
    with pytest.raises(ValueError, match=r"not among the compressed variables \['t', 'z'\]"):
        plain.with_error_bounds(fields, {"q": 1.0})
    with pytest.raises(ValueError, match="positive absolute bounds"):
        FieldConfig(error_bounds={"t": -1.0})


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_bad_artefacts_give_clean_errors(fitted, tmp_path, cli):
    _, art = fitted
    good = art.to_bytes()
    with pytest.raises(ArtefactError, match="bad magic"):
        Artefact.from_bytes(b"GRIB" + good[4:])
    with pytest.raises(ArtefactError, match="corrupt or truncated"):
        Artefact.from_bytes(good[:-100])
    flipped = bytearray(good)
    flipped[-10] ^= 0xFF
    with pytest.raises(ArtefactError, match="checksum"):
        Artefact.from_bytes(bytes(flipped))
    with pytest.raises(ArtefactError, match="format version 9"):
        Artefact.from_bytes(good[:4] + (9).to_bytes(2, "little") + good[6:])
    with pytest.raises(FileNotFoundError, match="postcast compress"):
        Artefact.load(tmp_path / "none.pcnf")
    bad = tmp_path / "bad.pcnf"
    bad.write_bytes(good[:-100])
    proc = cli("decompress", str(bad), "--out", str(tmp_path / "x.nc"))
    assert proc.returncode == 65 and "corrupt" in proc.stderr
    assert cli("decompress", str(tmp_path / "none.pcnf"), "--out", str(tmp_path / "x.nc")).returncode == 66
    assert not (tmp_path / "x.nc").exists()


def test_bad_fields_are_refused():
    ds = smooth_fields()
    with pytest.raises(ValueError, match="NaN"):
        to_fields(ds.where(ds.latitude < 80))
    with pytest.raises(ValueError, match="not in the dataset"):
        to_fields(ds, ["q"])
    with pytest.raises(ValueError, match="weights='fp8'"):
        FieldConfig(weights="fp8")


@pytest.fixture(scope="module")
def compressed_store(store):
    cfg = DataConfig(store=str(store), sample=SampleSpec(target="t850", variables=("t", "z", "u@850")), batch_size=2)
    art = compress_split(cfg, FieldConfig(width=16, depth=1, steps=40, batch_points=2048), progress=False)
    return cfg, art


def test_compressed_dataloader_yields_exactly_the_decoded_fields(compressed_store):
    cfg, art = compressed_store
    plain = StoreDataset(cfg, "train")
    ds = CompressedDataset(cfg, art)
    assert len(ds) == len(plain)
    decoded = art.decode_array()[:, :, 0]  # (V, T, H, W)
    names = art.header["variables"]
    for i in (0, len(ds) - 1):
        got, ref = ds[i], plain[i]
        assert set(got) == {k for k in ref if not k.startswith("oracle_")}  # the oracle is synthetic-only
        assert all(got[k].shape == ref[k].shape and got[k].dtype == ref[k].dtype for k in got)
        for c, key in enumerate(cfg.sample.field_keys()):  # physical units: the model normalises
            np.testing.assert_array_equal(got["fields"][c].numpy(), decoded[names.index(key), i])
        np.testing.assert_array_equal(got["y"].numpy(), decoded[names.index("truth_t850"), i])
        np.testing.assert_array_equal(got["m"].numpy(), decoded[names.index("ens_mean_t"), i])
        np.testing.assert_array_equal(got["features"].numpy(), ref["features"].numpy())  # location + season
    # the stated errors are those of these decoded fields against the store's
    orig = split_fields(cfg)
    k = names.index("truth_t850")
    err = np.abs(decoded[k] - orig["truth_t850"].values).max()
    assert err == pytest.approx(art.header["errors"][f"var{k}"]["max_abs"], rel=1e-5)


def test_training_from_the_compressed_datamodule(compressed_store, tmp_path):
    import lightning as L

    from postcast.models.module import PostProcessor

    cfg, art = compressed_store
    art.save(tmp_path / "train.pcnf")
    dm = CompressedDataModule(cfg, str(tmp_path / "train.pcnf"))
    model = PostProcessor("mlp", net={"hidden": 16}, sample=cfg.sample.to_dict(), grid=dm.grid)
    trainer = L.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, default_root_dir=tmp_path
    )
    trainer.fit(model, dm)
    res = trainer.test(model, dm, verbose=False)[0]
    assert np.isfinite(res["test_crps"]) and torch.isfinite(model.norm_std).all()


def test_cli_compress_decompress_report(store, tmp_path, cli):
    art = tmp_path / "t850.pcnf"
    proc = cli(
        "compress",
        str(store),
        "--var",
        "truth_t850",
        "--out",
        str(art),
        "--width",
        "16",
        "--depth",
        "1",
        "--steps",
        "30",
        check=True,
    )
    assert "ratio" in proc.stdout and art.exists()
    cli("decompress", str(art), "--out", str(tmp_path / "t850.nc"), check=True)
    back = xr.open_dataset(tmp_path / "t850.nc")
    src = xr.open_zarr(store)["truth_t850"].sel(step=np.timedelta64(48, "h"))
    assert back["truth_t850"].shape == src.shape
    proc = cli(
        "compress-report",
        str(art),
        "--sz3",
        "0.5,2",
        "--zfp-tolerance",
        "1",
        "--zfp-rate",
        "4",
        "--plot",
        str(tmp_path / "p.png"),
        "--json",
        str(tmp_path / "rows.json"),
        check=True,
    )
    for codec in ("neural", "sz3", "zfp"):
        assert codec in proc.stdout
    assert (tmp_path / "p.png").stat().st_size > 1000
    bad = cli("compress", str(store), "--var", "nope", "--out", str(tmp_path / "n.pcnf"))
    assert bad.returncode == 66 and "nope" in bad.stderr  # a variable the source lacks: missing input
    for spec, says in (("truth_t850", "give VAR=BOUND"), ("t850=0.1", "not among the compressed variables")):
        bad = cli(
            "compress", str(store), "--var", "truth_t850", "--error-bound-var", spec, "--out", str(tmp_path / "n")
        )
        assert bad.returncode == 2 and says in bad.stderr and not (tmp_path / "n").exists()


def test_baselines_meet_their_bounds_and_refuse_two_modes():
    x = smooth_fields(noise=0.5)["t"].values
    for bound in (0.01, 0.3):
        r = baselines.sz3(x, bound)
        assert np.abs(r.decoded - x).max() <= bound * (1 + 1e-6) and r.nbytes < x.nbytes
    r = baselines.zfp(x, tolerance=0.1)
    assert np.abs(r.decoded - x).max() <= 0.1
    with pytest.raises(ValueError, match="exactly one"):
        baselines.zfp(x, tolerance=0.1, rate=4)
    rows = report.baseline_rows(to_fields(smooth_fields()), [0.1, 1.0], [], [2.0])
    assert [r["codec"] for r in rows] == ["sz3", "sz3", "zfp"]
    assert rows[0]["wrmse"] < rows[1]["wrmse"] and rows[0]["ratio"] < rows[1]["ratio"]
    assert report.ratio_at_equal_error(rows, "sz3", rows[0]["wrmse"]) == pytest.approx(rows[0]["ratio"])


@pytest.mark.system  # trains its own compressors: minutes of CPU (tests/tiers.py)
def test_two_fits_with_the_same_seed_give_identical_artefacts():
    """Same fields, seed and settings on one machine -> the same weights and the same bytes (no wall
    clock in the header, no non-deterministic scatter-add in the embedding's backward)."""
    from postcast.compression.field import train_network

    fields = to_fields(smooth_fields())
    cfg = FieldConfig(**{**FAST.to_dict(), "steps": 25, "batch_points": 4096})
    nets = [train_network(fields, cfg, progress=False)[0].state_dict() for _ in range(2)]
    for name, tensor in nets[0].items():
        assert torch.equal(tensor, nets[1][name]), f"{name} differs between two fits with seed {cfg.seed}"
    first, second = (Artefact.build(fields, cfg, progress=False).to_bytes() for _ in range(2))
    assert first == second


@pytest.mark.parametrize("bound", ["0", "nan", "inf", "-inf", "-1"])
def test_cli_refuses_error_bounds_that_are_not_positive_finite_numbers(bound, tmp_path, capsys):
    from postcast.cli import main

    src = tmp_path / "f.nc"
    smooth_fields().to_netcdf(src)
    out = tmp_path / "f.pcnf"
    for flag in (f"--error-bound={bound}", f"--error-bound-var=t={bound}"):  # '=': argparse reads -inf as an option
        code = main(["--no-progress", "compress", str(src), "--var", "t", "--steps", "1", flag, "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and bound in err.lower(), (flag, code, err)
        assert not out.exists()
    with pytest.raises(ValueError, match="positive"):
        FieldConfig(error_bound=float(bound))


@pytest.fixture(scope="module")
def trained():
    """One fp32 network on the smooth fields (the levers store it in other ways: no refit)."""
    from postcast.compression.field import train_network

    fields = to_fields(smooth_fields())
    cfg = FieldConfig(**{**FAST.to_dict(), "steps": 60, "weights": "fp32"})
    return (fields, cfg, *train_network(fields, cfg, progress=False))


def test_per_row_quantisation_and_lzma_shrink_the_artefact_and_errors_are_measured_after(trained, tmp_path):
    from postcast.compression.field import quantise

    fields, cfg, net, mean, std = trained
    sizes = {}
    for weights, entropy in (("fp16", "none"), ("fp16", "lzma"), ("q8", "lzma"), ("q4", "lzma")):
        art = Artefact.from_network(
            fields, FieldConfig(**{**cfg.to_dict(), "weights": weights, "entropy": entropy}), net, mean, std
        )
        path = tmp_path / f"{weights}_{entropy}.pcnf"
        sizes[weights, entropy] = art.save(path)
        back = Artefact.load(path)
        assert back.config.weights == weights and back.config.entropy == entropy
        assert all(np.array_equal(back.arrays[k], v) for k, v in art.arrays.items())  # lossless coding
        decoded = back.decode_array()
        for v in range(2):  # the stated errors are those of the decode, i.e. after quantisation
            err = np.abs(decoded[v] - fields.data[v]).max()
            assert err == pytest.approx(art.header["errors"][f"var{v}"]["max_abs"], rel=1e-6)
    assert sizes["fp16", "none"] > sizes["fp16", "lzma"] > sizes["q8", "lzma"] > sizes["q4", "lzma"]
    w = net.blocks[0].lin1.weight.detach()  # (out, in): per-row scale max|row| / 7, error <= half a step
    stored, seen = quantise(w, "q4")
    assert stored[""].dtype == np.int8 and np.abs(stored[""]).max() <= 7
    step = w.abs().amax(dim=1, keepdim=True).numpy() / 7
    assert np.all(np.abs(seen.numpy() - w.numpy()) <= 0.5 * step * 1.002 + 1e-7)  # fp16 scale rounding


def test_a_damaged_lzma_payload_is_a_clean_error(trained):
    import struct
    import zlib

    fields, cfg, net, mean, std = trained
    art = Artefact.from_network(
        fields, FieldConfig(**{**cfg.to_dict(), "weights": "q8", "entropy": "lzma"}), net, mean, std
    )
    good = art.to_bytes()
    head = struct.Struct("<4sHII")
    magic, version, head_len, _ = head.unpack_from(good)
    body = bytearray(good[head.size :])
    body[len(body) // 2] ^= 0xFF  # damaged, with a checksum that matches the damage
    forged = head.pack(magic, version, head_len, zlib.crc32(bytes(body))) + bytes(body)
    with pytest.raises(ArtefactError, match="corrupt artefact"):
        Artefact.from_bytes(forged)
    unknown = bytes([7]) + bytes(body[1:])
    with pytest.raises(ArtefactError, match="unknown payload codec 7"):
        Artefact.from_bytes(head.pack(magic, version, head_len, zlib.crc32(unknown)) + unknown)
    with pytest.raises(ValueError, match="entropy='zip'"):
        FieldConfig(entropy="zip")


def test_the_sz3_loader_yields_the_sz3_decoded_fields(compressed_store):
    from postcast.compression import sz3
    from postcast.compression.loader import SZ3Split

    cfg, _ = compressed_store
    fields = to_fields(split_fields(cfg))
    bounds = {v: 0.05 * float(fields.data[i].std()) for i, v in enumerate(fields.variables)}
    split = SZ3Split.build(fields, bounds)
    ds = CompressedDataset(cfg, split)
    k = fields.variables.index("truth_t850")
    ref = sz3.decode(sz3.encode(fields.data[k], bounds["truth_t850"]), fields.data[k].shape)  # (T, L, H, W)
    for i in (0, len(ds) - 1):
        np.testing.assert_array_equal(ds[i]["y"].numpy(), ref[i, 0])
    decoded = split.decode_array()
    for i, v in enumerate(fields.variables):
        assert np.abs(decoded[i] - fields.data[i]).max() <= bounds[v] * (1 + 1e-6)
    assert split.nbytes == sum(
        int(sz3.encode(fields.data[i], bounds[v]).nbytes) + 16 for i, v in enumerate(fields.variables)
    )
    assert split.ratio == pytest.approx(fields.data.nbytes / split.nbytes)
    with pytest.raises(ValueError, match="no bound for"):
        SZ3Split.build(fields, {"truth_t850": 1.0})


@pytest.mark.slow
def test_ebcc_baseline_decodes_near_its_bound():
    x = smooth_fields(noise=0.2)["t"].values  # (4, 31, 60): below EBCC's smallest side
    with pytest.raises(ValueError, match=">= 32 per side"):
        baselines.ebcc(x, 0.5)
    x = np.repeat(np.repeat(x, 2, axis=1), 2, axis=2)  # (4, 62, 120)
    r = baselines.ebcc(x, 0.5)
    assert r.decoded.shape == x.shape and r.nbytes < x.nbytes
    assert np.abs(r.decoded - x).max() <= 2 * 0.5  # EBCC's bound is not exact in this build: measured, not assumed


def test_cli_compress_stores_quantised_lzma_artefacts(tmp_path, capsys):
    from postcast.cli import main

    src = tmp_path / "f.nc"
    smooth_fields().rename(t="a", z="b").to_netcdf(src)  # not ENS-10 names: the fields as they are
    out = tmp_path / "f.pcnf"
    code = main(
        [
            "--no-progress",
            "compress",
            str(src),
            "--var",
            "a",
            "--var",
            "b",
            "--steps",
            "5",
            "--width",
            "16",
            "--weights",
            "q4",
            "--entropy",
            "lzma",
            "--out",
            str(out),
        ]
    )
    assert code == 0 and "ratio" in capsys.readouterr().out
    art = Artefact.load(out)
    assert (art.config.weights, art.config.entropy) == ("q4", "lzma")
    assert out.read_bytes()[14] == 1  # the codec byte after the 14-byte prefix: lzma
    assert np.isfinite(art.decode_array()).all()


def test_compress_report_works_on_a_split_artefact(compressed_store, tmp_path, cli):
    """The pipeline's compress stage writes split artefacts; compress-report refused them ("records no
    source selection"). It now reopens the store's split, and its neural row equals the artefact's own."""
    _, art = compressed_store
    path = tmp_path / "split.pcnf"
    art.save(path)
    proc = cli(
        "compress-report",
        str(path),
        "--sz3",
        "0.5",
        "--zfp-tolerance",
        "1",
        "--zfp-rate",
        "4",
        "--json",
        str(tmp_path / "rows.json"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    neural = next(r for r in rows if r["codec"] == "neural")
    stated = art.header["errors"]
    assert neural["max_abs"] == pytest.approx(max(e["max_abs"] for e in stated.values()), rel=1e-5)


def test_relative_error_bound_keeps_every_field_within_a_tenth_of_its_spread(compressed_store):
    """error_bound_std=0.1: max |error| <= 0.1 x the field's weighted std, so weighted RMSE / std <= 0.1;
    without it, this short fit leaves at least one field far above that."""
    cfg, plain = compressed_store
    fields = to_fields(split_fields(cfg))
    bounded = Artefact.build(
        fields, FieldConfig(width=16, depth=1, steps=40, batch_points=2048, error_bound_std=0.1), progress=False
    )
    decoded = bounded.decode_array()
    for v, name in enumerate(fields.variables):
        data = fields.data[v]
        spread = weighted_std(data[:, 0], fields.lat)
        assert np.abs(decoded[v] - data).max() <= 0.1 * spread * (1 + 1e-6), name
        assert bounded.header["errors"][f"var{v}"]["wrmse_over_std"] <= 0.1
    assert max(e["wrmse_over_std"] for e in plain.header["errors"].values()) > 0.1


def test_relative_wrmse_is_one_for_the_mean_field_and_matches_a_hand_computation():
    lat = np.array([-60.0, 0.0, 60.0])
    rng = np.random.default_rng(0)
    data = rng.normal(280, 5, size=(4, 2, 3, 5))  # (T, L, H, W)
    w = np.cos(np.deg2rad(lat))[None, :, None] * np.ones((4, 3, 5))
    means = [np.average(data[:, lv], weights=w) for lv in range(2)]
    flat = np.stack([np.full((4, 3, 5), m) for m in means], axis=1)
    assert relative_wrmse(data, flat, lat) == pytest.approx(1.0, rel=1e-12)
    noisy = data + rng.normal(0, 0.5, size=data.shape)
    by_hand = max(
        np.sqrt(np.average((noisy[:, lv] - data[:, lv]) ** 2, weights=w))
        / np.sqrt(np.average((data[:, lv] - means[lv]) ** 2, weights=w))
        for lv in range(2)
    )
    assert relative_wrmse(data, noisy, lat) == pytest.approx(by_hand, rel=1e-12)
