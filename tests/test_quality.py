"""Static checks run with the tests: ruff and mypy clean, imports go one way between layers, the data core
stays free of torch, no import cycle and each room (the service, the forecast products, verification) standing
on what it may only (scripts/check_imports.py), no module over 500 lines, a small top level
of datasets/, and the target table read through the schema's functions."""

import ast
import functools
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500  # per module of the package
MAX_DATASETS_TOP = 12  # modules directly in datasets/ (its __init__ aside): the rest lives in sub-packages
MAX_TARGET_LOOKUPS = 5  # lines indexing the target table outside datasets/schema.py (schema.target(name) instead)
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
    run.write_text(
        run.read_text() + "\n\ndef _planted() -> None:\n"
        "    io.chunk_shape('init_time', (1,), whole=(), grow=())  # a str where a tuple of dims goes\n"
    )
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stdout[-2000:]
    errors = [ln for ln in proc.stdout.splitlines() if ": error:" in ln]
    assert (
        len(errors) == 1 and "pipeline/run.py" in errors[0] and '"chunk_shape" has incompatible type "str"' in errors[0]
    ), proc.stdout[-2000:]


def test_imports_go_one_way():
    assert upward_imports(ROOT) == []


def test_data_core_is_torch_free():
    assert torch_in_core(ROOT) == []


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("pipeline/run.py", "from postcast.train import run"),  # the CLI package (cli/ = postcast)
        ("pipeline/run.py", "from postcast import cli"),
        ("datasets/io.py", "import postcast.models.module"),
        ("models/module.py", "from postcast.pipeline import forecast"),
        ("compression/loader.py", "from postcast.serve.app import app"),
    ],
)
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
    code = (
        "from postcast.datasets.sources import messages as grib, regrid\n"
        "import pyresample.geometry, eccodes\n"
        "print(eccodes.codes_get_api_version())"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])


# --- the import graph (scripts/check_imports.py), module sizes, the target table, formatting ---------------
@functools.cache
def _check_imports():
    """scripts/check_imports.py as a module."""
    spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_imports"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _copy_package(dest: Path) -> Path:
    for layer in ("cli", *LAYERS):
        shutil.copytree(ROOT / layer, dest / layer, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _run_import_check(root: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """scripts/check_imports.py on the package copy ``root``, as a process."""
    cmd = [sys.executable, str(ROOT / "scripts" / "check_imports.py"), str(root)]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


def test_no_import_cycle_and_no_import_of_the_cli_below_it():
    """The command that checks it: ``python scripts/check_imports.py`` (exit 1 and the cycles otherwise)."""
    proc = subprocess.run(
        [sys.executable, "scripts/check_imports.py"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.startswith("no import cycle"), proc.stdout


def test_import_graph_resolution(tmp_path):
    """``from X import Y`` is an edge to the module X.Y when there is one, else to X (a name from its
    ``__init__``); relative and TYPE_CHECKING imports count; ``import a.b`` is no edge to ``a``."""
    ci = _check_imports()
    files = {
        "cli/__init__.py": "from postcast.datasets.core import version\n",
        "datasets/__init__.py": "from postcast.datasets import a\nNAME = 1\n",
        "datasets/a.py": "import postcast.datasets.sub.b\nfrom postcast.datasets.sub.b import thing\n",
        "datasets/core/__init__.py": "",
        "datasets/core/version.py": "",
        "datasets/sub/__init__.py": "",
        "datasets/sub/b.py": (
            "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
            "    from postcast.datasets import NAME\n"
            "def f():\n    from ..core import version\n    from . import c\n"
        ),
        "datasets/sub/c.py": "from .. import NAME, a\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for layer in LAYERS:
        (tmp_path / layer).mkdir(exist_ok=True)
    _, edges = ci.graph(tmp_path)
    assert {(e.source, e.target) for e in edges} == {
        ("postcast", "postcast.datasets.core.version"),
        ("postcast.datasets", "postcast.datasets.a"),
        ("postcast.datasets.a", "postcast.datasets.sub.b"),
        ("postcast.datasets.sub.b", "postcast.datasets"),  # a name from the package's __init__
        ("postcast.datasets.sub.b", "postcast.datasets.core.version"),
        ("postcast.datasets.sub.b", "postcast.datasets.sub.c"),
        ("postcast.datasets.sub.c", "postcast.datasets"),
        ("postcast.datasets.sub.c", "postcast.datasets.a"),
    }
    (cycle,) = ci.cycles(edges)  # one per strongly connected component: its shortest from its first module
    assert [(e.source, e.target) for e in cycle] == [
        ("postcast.datasets", "postcast.datasets.a"),
        ("postcast.datasets.a", "postcast.datasets.sub.b"),
        ("postcast.datasets.sub.b", "postcast.datasets"),
    ]


def test_import_check_finds_a_planted_cycle(tmp_path):
    """An import back along an existing edge, hidden under TYPE_CHECKING, is a cycle the command reports."""
    ci = _check_imports()
    root = _copy_package(tmp_path)
    known, edges = ci.graph(root)
    assert ci.cycles(edges) == []
    edge = next(
        e
        for e in edges
        if e.source.startswith("postcast.datasets.")
        and not known[e.target].is_package
        and e.target.startswith("postcast.datasets.")
    )
    path = known[edge.target].path
    path.write_text(
        path.read_text() + f"\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import {edge.source}\n"
    )
    proc = _run_import_check(root, tmp_path)
    assert proc.returncode == 1, proc.stdout
    (line,) = proc.stdout.splitlines()
    assert line.startswith("import cycle: ") and edge.source in line and edge.target in line, line


@pytest.mark.parametrize(
    "line",
    [
        "import postcast",
        "from postcast import __version__",  # now postcast.datasets.core.version.__version__
        "from ... import cli",  # relative, from datasets/sources/registry.py: postcast.cli
        "from postcast.cli import main",
    ],
)
def test_import_check_finds_the_cli_imported_below_it(tmp_path, line):
    ci = _check_imports()
    root = _copy_package(tmp_path)
    target = root / "datasets" / "sources" / "registry.py"
    target.write_text(target.read_text() + f"\n{line}\n")
    problems, _, _ = ci.report(root)  # (and a cycle where the CLI imports the importer)
    found = [p for p in problems if p.startswith("the CLI package imported below it: ")]
    assert len(found) == 1 and found[0].startswith(
        "the CLI package imported below it: datasets/sources/registry.py:"
    ), problems


@pytest.mark.parametrize(
    ("where", "line", "room"),
    [
        ("serve/law.py", "from postcast.pipeline import forecast", "postcast.serve"),  # the whole pipeline again
        ("serve/catalog.py", "from postcast.pipeline.verify import summary", "postcast.serve"),
        ("pipeline/products/archive.py", "import postcast.models.module", "postcast.pipeline.products"),  # torch
        (
            "pipeline/products/maps.py",
            "from postcast.pipeline.verify.report import palette",
            "postcast.pipeline.products",
        ),
        ("pipeline/verify/tasks.py", "from postcast.pipeline.forecast import forecast", "postcast.pipeline.verify"),
    ],
)
def test_import_check_finds_a_room_standing_on_more_than_it_may(tmp_path, where, line, room):
    """The service stands on the forecast products and the data layer only, the products on the data layer only,
    the verification stage on what it needs (not the forecast or training): the command exits 1 naming the line."""
    root = _copy_package(tmp_path)
    target = root / where
    target.write_text(target.read_text() + f"\n{line}\n")
    proc = _run_import_check(root, tmp_path)
    assert proc.returncode == 1, proc.stdout
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{where}:")]
    assert len(found) == 1 and f"{room} stands on " in found[0], proc.stdout


def test_no_module_over_500_lines():
    over = {
        m.path.relative_to(ROOT).as_posix(): n
        for m in _check_imports().modules(ROOT).values()
        if (n := len(m.path.read_text().splitlines())) > MAX_LINES
    }
    assert over == {}, f"modules over {MAX_LINES} lines: {over}"


def test_datasets_has_a_small_top_level():
    top = sorted(p.name for p in (ROOT / "datasets").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_DATASETS_TOP, f"{len(top)} modules directly in datasets/: {top}"


def test_the_target_table_is_read_through_the_schema():
    """Lines indexing the target table by name outside datasets/schema.py, over the tracked and untracked
    files (``git grep``): a name is resolved once where it comes in (``schema.target``), then passed on."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(
        ["git", "grep", "--untracked", "-c", "TARGETS\\[", "--", ".", ":(exclude)datasets/schema.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: no match
    counts = {path: int(n) for path, _, n in (ln.rpartition(":") for ln in proc.stdout.splitlines())}
    assert sum(counts.values()) <= MAX_TARGET_LOOKUPS, counts


def test_ruff_format_clean():
    ruff = shutil.which("ruff", path=Path(sys.executable).parent)
    if ruff is None:
        pytest.fail("ruff is not installed: run scripts/setup.sh")
    proc = subprocess.run(
        [ruff, "format", "--check", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]  # the files `ruff format` would change
