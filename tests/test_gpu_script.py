"""benchmarks/gpu.py, the prepared GPU run (issues 41 and 59), in its dry mode: tiny sizes on the CPU, Triton in
its interpreter, each part in its own process with zarr, dask, netCDF4, eccodes and pysz marked absent
(as on the GPU machine). The run must write every part's figures and end with the RESULT line; a part
that raises is recorded and the others still run; the benchmark's training step is PostProcessor's."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
KEYS = (
    "min_bandwidth_fraction_streaming",
    "min_speedup_vs_eager",
    "unet_samples_per_s_bf16",
    "unet_mfu_bf16",
    "smoe_compiled_samples_per_s_bf16",
    "neural_over_sz3_at_ratio_500",
    "min_kernel_bandwidth_fraction_streaming",
)
RESULT = re.compile(r"^RESULT device=(cpu|cuda)" + "".join(rf" {k}=(\S+)" for k in KEYS) + "$")
PARTS = ("kernels", "training", "compression")
KERNELS = ("ensemble_standardise", "crps_gaussian", "crps_ensemble", "topk_route", "fourier_layer")


def dry_run(out: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict, float]:
    """The script in dry mode as a subprocess (waited for; no sleeps): its process, gpu.json, seconds."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("OUT", None)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((out / "gpu.json").read_text()), seconds


def result_line(stdout: str) -> dict[str, float]:
    match = RESULT.match(stdout.strip().splitlines()[-1])
    assert match, stdout[-2000:]
    return {"device": match.group(1), **{k: float(v) for k, v in zip(KEYS, match.groups()[1:], strict=True)}}


def test_dry_run_writes_every_figure_and_the_result_line(tmp_path):
    proc, summary, seconds = dry_run(tmp_path / "gpu")
    print(f"dry run: {seconds:.1f} s")
    assert set(summary["parts"]) == set(PARTS)
    for name, part in summary["parts"].items():
        assert part["status"] == "ok", (name, part.get("error"), part.get("errors"), part.get("stderr_tail"))
        assert not part["errors"] and not part.get("error"), (name, part["errors"])
        assert "/postcast-gpu-" in part["postcast_from"], "the part imported an installed postcast, not the links"
        assert (tmp_path / "gpu" / f"{name}.json").exists()
    kernels, training, compression = (summary["parts"][p] for p in PARTS)
    batches = gpu_sizes().kernel_batches
    assert {(r["kernel"], r["batch"]) for r in kernels["rows"]} == {
        *((k, b) for k in KERNELS[:4] for b in batches),
        ("fourier_layer", batches[0]),
    }
    for row in kernels["rows"]:
        for path in ("torch", "compile", "triton"):
            assert row[f"{path}_ms"] > 0, (row["kernel"], path)
            assert row[f"{path}_bw_fraction_same_bytes_copy"] > 0, (row["kernel"], path)
            assert row[f"{path}_kernel_ms"] > 0 and row[f"{path}_kernel_bw_fraction"] > 0, (row["kernel"], path)
        assert row["triton_max_abs_diff_fwd"] < 1e-4, row
        if row["kernel"] in ("crps_gaussian", "topk_route"):
            assert row["triton_max_abs_diff_bwd"] < 1e-4, row
    auto = kernels["figures"]["auto"]
    assert set(auto) == set(KERNELS)
    assert all(set(v) == {"triton_fastest_at_batches", "auto_uses_triton", "agrees"} for v in auto.values())
    assert not auto["fourier_layer"]["auto_uses_triton"]
    runs = training["runs"]
    assert len(runs) == 9 and all("samples_per_s" in r for r in runs.values()), runs
    assert all(r["flops_per_sample"] > 0 and r["mfu"] > 0 for r in runs.values())
    sweep = runs["unet bf16-mixed compiled sweep"]["sweep"]
    assert [r["batch"] for r in sweep] == [2, 4, 8] and not sweep[-1]["fits"]  # the simulated limit is 5
    assert runs["unet bf16-mixed compiled sweep"]["best"]["batch"] in (2, 4)
    targets = compression["targets"]
    assert set(targets) == {"200", "500", "2000"}
    assert all(t["ratio"] > 0 and t["wrmse"] > 0 for t in targets.values())
    assert targets["200"]["parameters"] > targets["500"]["parameters"] > targets["2000"]["parameters"]
    assert "definition" in compression["figures"]
    got = result_line(proc.stdout)
    assert got["device"] == "cpu"
    for key, value in got.items():
        if key != "device":
            assert math.isfinite(value) and value > 0, (key, value)
            assert value == pytest.approx(summary["result"][key], rel=1e-3)


def test_a_failing_part_is_recorded_and_the_rest_still_runs(tmp_path):
    proc, summary, _ = dry_run(tmp_path / "gpu", "--fail-part", "kernels", "--parts", "kernels,compression")
    failed, after = summary["parts"]["kernels"], summary["parts"]["compression"]
    assert failed["status"] == "error" and "deliberate failure" in failed["error"]
    assert "Traceback" in failed["traceback"] and "RuntimeError" in failed["traceback"]
    assert after["status"] == "ok" and after["figures"]["neural_over_sz3_at_ratio_500"] > 0
    got = result_line(proc.stdout)
    assert math.isnan(got["min_bandwidth_fraction_streaming"]) and math.isnan(got["min_speedup_vs_eager"])
    assert math.isnan(got["unet_samples_per_s_bf16"]) and math.isnan(got["unet_mfu_bf16"])  # not run
    assert got["neural_over_sz3_at_ratio_500"] > 0


def gpu_sizes():  # type: ignore[no-untyped-def]
    return _gpu_module().DRY


def _gpu_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("family", ["unet", "unet_smoe"])
def test_the_benchmark_step_is_the_postprocessor_training_step(family):
    """Same network, same batch: the benchmark's loss equals PostProcessor.training_step's (models/module.py),
    so the GPU throughput times the step that training runs."""
    from postcast.models.module import PostProcessor

    gpu = _gpu_module()
    preset = gpu.read_preset(gpu.PRESETS[family], {"base_filters": 8})
    grid = (16, 32)
    model = PostProcessor(
        family=family, net=preset.net, grid=grid, sample={"target": "t850", "variables": list(preset.variables)}
    )
    assert model.spec.n_channels == preset.in_channels
    batch = gpu.random_batch(preset, 2, grid, torch.device("cpu"))
    model.set_normalisation(batch["norm_mean"], batch["norm_std"])
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.net.parameters():  # zero-initialised heads would hide a wrong input or head
            p.add_(0.01 * torch.randn_like(p))
    with pytest.warns(UserWarning):  # self.log without a trainer
        want = model.training_step(batch, 0)
    got = gpu.train_loss(model.net, batch)
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    assert type(gpu.build_net(preset, grid)) is type(model.net)


@pytest.mark.parametrize("family", ["unet", "unet_smoe"])
def test_the_compiled_step_equals_eager(family):
    """The compiled networks' training step (AOT autograd, as inductor runs it) gives eager's loss and
    gradients; for the U-Net + SMoE this runs the routing operator in the graph and the RC loss through the
    network's outputs (differentiating the SMoE's kept output failed under AOT autograd)."""
    gpu = _gpu_module()
    preset = gpu.read_preset(gpu.PRESETS[family], {"base_filters": 8})
    torch.manual_seed(0)
    net = gpu.build_net(preset, (16, 32)).train()
    with torch.no_grad():
        for p in net.parameters():  # leave the zero-initialised heads so every path carries gradient
            p.add_(0.05 * torch.randn_like(p))
    batch = gpu.random_batch(preset, 2, (16, 32), torch.device("cpu"))
    results = []
    for model in (net, torch.compile(net, backend="aot_eager")):
        net.zero_grad()
        loss = gpu.train_loss(model, batch)
        loss.backward()
        results.append((float(loss.detach()), [p.grad.clone() for p in net.parameters()]))
    torch._dynamo.reset()
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-5)
    for a, b in zip(results[1][1], results[0][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_the_ratio_and_errors_are_the_artefacts(tmp_path):
    """The GPU run cannot import compression/artefact.py (it needs zarr): its byte count and decode errors
    must equal an Artefact's built from the same network (here, where it imports)."""
    import numpy as np

    from postcast.compression.artefact import Artefact
    from postcast.compression.field import Fields

    gpu = _gpu_module()
    part = gpu.Part("compression", tmp_path, gpu.DRY, time.time() + 60)
    part.dev = torch.device("cpu")
    data, lat, lon = gpu.synthetic_field(gpu.DRY.field)
    ref = gpu.load_reference(gpu.DRY.field, data)  # the carried table is of this very field
    fit = gpu.FieldFit(part, data, lat, lon, 8)
    net, _ = gpu.fit_field(fit, 0.5)
    fields = Fields(
        data[None, :, None],
        ["t850"],
        ["K"],
        np.arange(data.shape[0], dtype=float),
        "time",
        np.array([np.nan]),
        lat,
        lon,
    )
    for weights, entropy in (("q6", "lzma"), ("fp16", "none")):
        got = gpu.lever(fit, net, weights, entropy, ref)
        cfg = gpu.dataclasses.replace(fit.cfg, weights=weights, entropy=entropy)
        art = Artefact.from_network(
            fields, cfg, net, np.array([[fit.mean]], np.float32), np.array([[fit.std]], np.float32)
        )
        assert abs(got["bytes"] - art.nbytes) <= 16  # the header's error floats may print a digit longer
        want = art.header["errors"]["var0"]
        for key in ("wrmse", "rmse", "mae", "max_abs", "wrmse_over_std"):
            assert got[key] == pytest.approx(want[key], rel=1e-6), key
