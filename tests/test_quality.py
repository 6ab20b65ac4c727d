"""Static checks run with the tests: ruff and mypy clean, imports go one way between layers, and the
data core stays free of torch."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# datasets <- models/compression <- pipeline <- serve; the CLI (folder cli/ = package postcast) on top
LAYERS = {"datasets": 0, "models": 1, "compression": 1, "pipeline": 2, "serve": 3}
CLI_RANK = 99  # anything under postcast.* that is not one of the layers above is the CLI package
# the torch-free data core: every module of datasets/ except the torch/Lightning adapters in datasets/loaders/
TORCH_EDGE = ("datasets/loaders",)
TORCH_MODULES = {"torch", "lightning", "pytorch_lightning", "triton"}


def _imports(path: Path) -> list[str]:
    """Absolute module names ``path`` imports (``from postcast import x`` counts as ``postcast.x``)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "postcast":
                names += [f"postcast.{a.name}" for a in node.names]
            else:
                names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def _rank(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "postcast" or len(parts) == 1 or parts[1] == "__version__":
        return None  # not postcast, or the package root's version string
    return LAYERS.get(parts[1], CLI_RANK)


def upward_imports(root: Path) -> list[str]:
    """Every import of a higher layer (or of the CLI) by a module of a layer below it."""
    bad = []
    for layer, rank in LAYERS.items():
        for path in sorted((root / layer).rglob("*.py")):
            for name in _imports(path):
                other = _rank(name)
                if other is not None and other > rank:
                    bad.append(f"{path.relative_to(root)} imports {name}")
    return bad


def torch_in_core(root: Path) -> list[str]:
    """Modules of the data core (datasets/ outside datasets/loaders/) that import torch or Lightning."""
    bad = []
    for path in sorted((root / "datasets").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(TORCH_EDGE):
            continue
        bad += [f"{rel} imports {n}" for n in _imports(path) if n.split(".")[0] in TORCH_MODULES]
    return bad


def test_ruff_clean():
    ruff = shutil.which("ruff", path=Path(sys.executable).parent)
    if ruff is None:
        pytest.fail("ruff is not installed: run scripts/setup.sh")
    proc = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_mypy_clean(mypy_result):
    """mypy over the package, started at collection (conftest) so that it runs beside the other tests."""
    code, out = mypy_result
    assert code == 0, out[-4000:]


def test_mypy_sees_across_modules(tmp_path):
    """mypy read every `postcast.*` import as Any (the folders are installed under other names), so a call
    with the wrong type into another module passed; through scripts/typecheck it is caught."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "scripts" / "typecheck", tmp_path / "scripts" / "typecheck", symlinks=True)
    for layer in ("cli", *LAYERS):
        shutil.copytree(ROOT / layer, tmp_path / layer, ignore=shutil.ignore_patterns("__pycache__"))
    cache = ROOT / ".mypy_cache"
    if cache.is_dir():  # incremental: only the planted file is checked again
        shutil.copytree(cache, tmp_path / ".mypy_cache")
    run = tmp_path / "pipeline" / "run.py"
    run.write_text(run.read_text() + "\n\ndef _planted() -> None:\n"
                   "    io.chunk_shape('init_time', (1,), whole=(), grow=())  # a str where a tuple of dims goes\n")
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stdout[-2000:]
    errors = [ln for ln in proc.stdout.splitlines() if ": error:" in ln]
    assert len(errors) == 1 and "pipeline/run.py" in errors[0] and '"chunk_shape" has incompatible type "str"' in \
        errors[0], proc.stdout[-2000:]


def test_imports_go_one_way():
    assert upward_imports(ROOT) == []


def test_data_core_is_torch_free():
    assert torch_in_core(ROOT) == []


@pytest.mark.parametrize(("where", "line"), [
    ("pipeline/run.py", "from postcast.train import run"),  # the CLI package (cli/ = postcast)
    ("pipeline/run.py", "from postcast import cli"),
    ("datasets/io.py", "import postcast.models.module"),
    ("models/module.py", "from postcast.pipeline import forecast"),
    ("compression/loader.py", "from postcast.serve.app import app"),
])
def test_layer_check_catches_a_planted_upward_import(tmp_path, where, line):
    for layer in LAYERS:
        shutil.copytree(ROOT / layer, tmp_path / layer, ignore=shutil.ignore_patterns("__pycache__"))
    assert upward_imports(tmp_path) == []
    target = tmp_path / where
    target.write_text(target.read_text() + f"\n{line}\n")
    assert upward_imports(tmp_path) == [f"{where} imports {_planted_name(line)}"]


def _planted_name(line: str) -> str:
    words = line.split()
    if words[0] == "import":
        return words[1]
    return f"postcast.{words[3]}" if words[1] == "postcast" else words[1]


def test_torch_check_catches_torch_in_the_core(tmp_path):
    shutil.copytree(ROOT / "datasets", tmp_path / "datasets", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "datasets" / "schema.py").write_text((ROOT / "datasets" / "schema.py").read_text() + "\nimport torch\n")
    assert torch_in_core(tmp_path) == ["datasets/schema.py imports torch"]


def test_a_process_using_grib_and_regridding_exits_cleanly():
    """eccodes' and pyproj's wheels bundle native libraries that abort the process at exit ("free():
    invalid size", exit 134) when eccodes loads first; postcast's GRIB module loads pyproj first, so any
    process that reads GRIB and regrids (pyresample -> pyproj) exits 0."""
    code = ("from postcast.datasets.sources import messages as grib, regrid\n"
            "import pyresample.geometry, eccodes\n"
            "print(eccodes.codes_get_api_version())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
