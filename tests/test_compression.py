"""Neural-field compression: round trip within the stated error, the error-bounded mode never
exceeds its bound, the artefact alone decodes, the compressed dataloader yields what decoding yields,
bad artefacts give clean errors; the CLI verbs end to end; the classical baselines."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import xarray as xr

from postcast.compression import baselines, report
from postcast.compression.artefact import Artefact, ArtefactError
from postcast.compression.field import FieldConfig, to_fields
from postcast.compression.loader import CompressedDataModule, CompressedDataset, compress_split, split_fields
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec

pytest.importorskip("pysz")
pytest.importorskip("zfpy")
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
    return xr.Dataset({"t": (dims, a.astype(np.float32), {"units": "K"}),
                       "z": (dims, b.astype(np.float32), {"units": "m2 s-2"})},
                      coords={"time": np.arange(4), "latitude": lat, "longitude": lon})


@pytest.fixture(scope="module")
def fitted() -> tuple[xr.Dataset, Artefact]:
    ds = smooth_fields()
    return ds, Artefact.build(to_fields(ds), FAST, progress=False)


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


def test_the_artefact_alone_reproduces_the_decode(fitted, tmp_path):
    _, art = fitted
    first = art.decode_array()
    path = tmp_path / "a" / "f.pcnf"
    art.save(path)
    moved = tmp_path / "elsewhere.pcnf"
    shutil.move(path, moved)
    shutil.rmtree(tmp_path / "a")
    np.testing.assert_array_equal(Artefact.load(moved).decode_array(), first)


def test_points_and_regridding_agree_with_the_grid_decode(fitted):
    _, art = fitted
    grid = art.decode_array()  # (V, T, L, H, W)
    lat, lon = art.lat_lon()
    pts = art.decode_points(np.array([1, 3]), np.array([0, 0]), lat[[4, 20]], lon[[7, 59]])
    np.testing.assert_allclose(pts, grid[:, [1, 3], 0, [4, 20], [7, 59]], rtol=1e-6, atol=1e-3)
    fine = art.regrid(3.0)
    assert fine.sizes["latitude"] == 61 and fine.sizes["longitude"] == 120
    np.testing.assert_allclose(fine["t"].values[:, ::2, ::2], grid[0, :, 0], rtol=1e-6, atol=1e-3)


def test_int8_weights_are_smaller_and_still_decode(fitted):
    ds, _ = fitted
    art = Artefact.build(to_fields(ds), FieldConfig(**{**FAST.to_dict(), "weights": "int8", "steps": 50}),
                         progress=False)
    mats = [a for k, a in art.arrays.items() if k.startswith("w.") and a.ndim == 2]
    assert mats and all(a.dtype == np.int8 for a in mats)
    assert np.isfinite(Artefact.from_bytes(art.to_bytes()).decode_array()).all()


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
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        default_root_dir=tmp_path)
    trainer.fit(model, dm)
    res = trainer.test(model, dm, verbose=False)[0]
    assert np.isfinite(res["test_crps"]) and torch.isfinite(model.norm_std).all()


def test_cli_compress_decompress_report(store, tmp_path, cli):
    art = tmp_path / "t850.pcnf"
    proc = cli("compress", str(store), "--var", "truth_t850", "--out", str(art), "--width", "16", "--depth", "1",
               "--steps", "30", check=True)
    assert "ratio" in proc.stdout and art.exists()
    cli("decompress", str(art), "--out", str(tmp_path / "t850.nc"), check=True)
    back = xr.open_dataset(tmp_path / "t850.nc")
    src = xr.open_zarr(store)["truth_t850"].sel(step=np.timedelta64(48, "h"))
    assert back["truth_t850"].shape == src.shape
    proc = cli("compress-report", str(art), "--sz3", "0.5,2", "--zfp-tolerance", "1", "--zfp-rate", "4",
               "--plot", str(tmp_path / "p.png"), "--json", str(tmp_path / "rows.json"), check=True)
    for codec in ("neural", "sz3", "zfp"):
        assert codec in proc.stdout
    assert (tmp_path / "p.png").stat().st_size > 1000
    bad = cli("compress", str(store), "--var", "nope", "--out", str(tmp_path / "n.pcnf"))
    assert bad.returncode == 65 and "nope" in bad.stderr
    for spec, says in (("truth_t850", "give VAR=BOUND"), ("t850=0.1", "not among the compressed variables")):
        bad = cli("compress", str(store), "--var", "truth_t850", "--error-bound-var", spec,
                  "--out", str(tmp_path / "n"))
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

