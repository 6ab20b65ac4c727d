"""The wheel holds every module of the repository, and each imports from it.

The layers are installed under other names (``cli/`` is the package ``postcast``, ``datasets/`` is
``postcast.datasets``, ...: setup.py), so the editable install the tests run against cannot show a package
left out of the wheel. Here the wheel is built from a copy of the working tree, installed (not editable, no
dependencies) into a new virtual environment that sees the dependencies of this one but not the repository,
and every module is imported there: each must come from the installed wheel. A sub-package added later is
in the wheel with no other change, and a hand-kept package list that misses one fails the same check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = "cli"  # the folder of the package `postcast`
LAYERS = ("datasets", "models", "compression", "pipeline", "serve")  # `postcast.<layer>`

# imports each module named on stdin (a JSON list) and prints {module: its __file__ or the error}, plus
# where the `postcast` console script's function comes from
_IMPORTER = """
import importlib, importlib.metadata, json, sys
found = {}
for name in json.load(sys.stdin):
    try:
        found[name] = str(importlib.import_module(name).__file__)
    except BaseException as err:
        found[name] = f"error: {type(err).__name__}: {err}"
scripts = importlib.metadata.entry_points(group="console_scripts", name="postcast")
try:
    found["console script postcast"] = str(sys.modules[next(iter(scripts)).load().__module__].__file__)
except BaseException as err:
    found["console script postcast"] = f"error: {type(err).__name__}: {err}"
print(json.dumps(found))
"""


def module_name(rel: PurePosixPath) -> str | None:
    """The installed name of a module of the tree by its path (``cli/x.py`` -> ``postcast.x``,
    ``datasets/a/b.py`` -> ``postcast.datasets.a.b``, a package's ``__init__.py`` -> the package); None for a
    file that is not a module of the package (outside the layers, ``__main__``, not Python)."""
    if rel.suffix != ".py" or rel.parts[0] not in (CLI, *LAYERS) or rel.stem == "__main__":
        return None
    parts = list(rel.with_suffix("").parts)
    parts[0] = "postcast" if parts[0] == CLI else f"postcast.{parts[0]}"
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules(tree: Path) -> set[str]:
    """Every module of the package in a source tree."""
    names = set()
    for folder in (CLI, *LAYERS):
        for path in (tree / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                name = module_name(PurePosixPath(path.relative_to(tree).as_posix()))
                if name:
                    names.add(name)
    return names


def wheel_modules(wheel: Path) -> set[str]:
    """The modules a wheel holds, by their dotted names (``postcast/datasets/io.py`` -> ``postcast.datasets.io``)."""
    names = set()
    with zipfile.ZipFile(wheel) as zf:
        for entry in zf.namelist():
            path = PurePosixPath(entry)
            if path.suffix == ".py" and path.parts[0] == "postcast" and path.stem != "__main__":
                parts = list(path.with_suffix("").parts)
                names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def copy_tree(dest: Path) -> Path:
    """The working tree as git sees it (tracked and untracked files, not the ignored ones) copied to ``dest``:
    what the repository would build, without building in the tree others work in."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the working tree's files are unknown")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if not os.path.lexists(src):  # tracked but deleted in the working tree
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)
    return dest


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args, "--no-index", "--no-cache-dir", "--disable-pip-version-check"]


def _env() -> dict[str, str]:
    """The environment of the child processes: no index, no pip config, nothing on the path from outside."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1"}


def build_wheel(tree: Path, out: Path) -> Path:
    """The wheel of a source tree (pip, with this environment's setuptools: no download)."""
    proc = subprocess.run(
        _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(tree)),
        cwd=out.parent,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("postcast-*.whl")
    return wheel


def _dependency_links(where: Path) -> Path:
    """A folder of links to every entry of this environment's site-packages except the editable install of
    postcast (its finder, its .pth files, its dist-info): the dependencies, importable without installing."""
    where.mkdir()
    site_dirs = dict.fromkeys(Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib"))
    for site in site_dirs:
        for entry in sorted(site.iterdir()):
            name, target = entry.name.lower(), entry.resolve()
            into_repo = target.is_relative_to(ROOT) and not target.is_relative_to(site.resolve())  # a link out
            own = name.startswith(("__editable__", "postcast")) or into_repo
            if own or name.endswith(".pth") or name == "__pycache__" or (where / entry.name).exists():
                continue
            (where / entry.name).symlink_to(entry)
    return where


def install_in_new_venv(wheel: Path, where: Path) -> Path:
    """A new virtual environment with ``wheel`` installed (not editable, no dependencies, no index) and this
    environment's dependencies on its path (a .pth file); returns its python."""
    venv.EnvBuilder(with_pip=False).create(where / "venv")
    python = where / "venv" / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "_postcast_test_dependencies.pth").write_text(f"{_dependency_links(where / 'deps')}\n")
    proc = subprocess.run(
        _pip("--python", str(python), "install", "--no-deps", "-q", str(wheel)),
        cwd=where,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return python


def check_wheel(wheel: Path, tree: Path, work: Path, modules: Iterable[str] | None = None) -> list[str]:
    """Problems of ``wheel`` built from ``tree``, as ``"<module>: <what>"``: every module of the tree missing
    from the wheel's listing; then, the wheel installed into a new virtual environment (under ``work``),
    every one of ``modules`` (default: all the tree's) and the ``postcast`` console script that does not
    import, or imports from anywhere but the installed wheel. Imported in one process whose working directory
    is ``work``, so the repository's folders cannot be picked up by accident."""
    expected = source_modules(tree)
    problems = [f"{name}: not in the wheel" for name in sorted(expected - wheel_modules(wheel))]
    python = install_in_new_venv(wheel, work)
    installed = os.path.realpath(python.parent.parent)
    names = sorted(expected if modules is None else modules)
    proc = subprocess.run(
        [str(python), "-c", _IMPORTER],
        input=json.dumps(names),
        cwd=work,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, where in json.loads(proc.stdout.splitlines()[-1]).items():
        if where.startswith("error: "):
            problems.append(f"{name}: {where}")
        elif not os.path.realpath(where).startswith(installed + os.sep):
            problems.append(f"{name}: imported from {where}, not from the installed wheel")
    return problems


def test_every_module_imports_from_the_installed_wheel(tmp_path):
    tree = copy_tree(tmp_path / "src")
    wheel = build_wheel(tree, tmp_path / "dist")
    modules = source_modules(tree)
    assert {"postcast", "postcast.cli", "postcast.datasets.ingest.run", "postcast.serve"} <= modules
    with zipfile.ZipFile(wheel) as zf:
        assert "postcast/py.typed" in zf.namelist()  # package data: the package is typed
    assert check_wheel(wheel, tree, tmp_path) == []


def test_a_new_sub_package_is_in_the_wheel(tmp_path):
    """setup.py finds the packages from the folders: one planted in a copy of the tree is built in."""
    tree = copy_tree(tmp_path / "src")
    (tree / "datasets" / "newsub" / "deeper").mkdir(parents=True)
    (tree / "datasets" / "newsub" / "__init__.py").write_text('"""A planted sub-package."""\n')
    (tree / "datasets" / "newsub" / "mod.py").write_text("VALUE = 1\n")
    (tree / "datasets" / "newsub" / "deeper" / "__init__.py").write_text("")
    (tree / "datasets" / "newsub" / "deeper" / "leaf.py").write_text("VALUE = 2\n")
    wheel = build_wheel(tree, tmp_path / "dist")
    planted = {
        "postcast.datasets.newsub",
        "postcast.datasets.newsub.mod",
        "postcast.datasets.newsub.deeper",
        "postcast.datasets.newsub.deeper.leaf",
    }
    assert planted <= source_modules(tree)
    assert planted <= wheel_modules(wheel)
    assert source_modules(tree) == wheel_modules(wheel)


def test_the_check_fails_for_a_package_left_out(tmp_path):
    """The failure mode the first test guards against: a hand-kept package list (what setup.py had) that
    misses a sub-package builds a wheel without it, and :func:`check_wheel` names each of its modules."""
    tree = copy_tree(tmp_path / "src")
    folders = {p.parent.relative_to(tree) for layer in LAYERS for p in (tree / layer).rglob("*.py")}
    packages = sorted("postcast." + ".".join(f.parts) for f in folders if "__pycache__" not in f.parts)
    packages.remove("postcast.datasets.ingest")
    (tree / "setup.py").write_text(
        "from setuptools import setup\n\n"
        f"setup(packages={['postcast', *packages]!r},\n"
        f"      package_dir={ {'postcast': CLI, **{f'postcast.{layer}': layer for layer in LAYERS}}!r},\n"
        "      package_data={'postcast': ['py.typed']})\n"
    )
    wheel = build_wheel(tree, tmp_path / "dist")
    left_out = {m for m in source_modules(tree) if m.startswith("postcast.datasets.ingest")}
    assert "postcast.datasets.ingest.run" in left_out
    control = {"postcast.datasets.schema", "postcast.datasets.core.version"}  # still in the wheel: they import
    problems = check_wheel(wheel, tree, tmp_path, modules=left_out | control)
    named = {p.split(":")[0] for p in problems} - {"console script postcast"}  # it may import ingest
    assert named == left_out, problems
    imports = [p for p in problems if ": error: " in p]
    assert {p.split(":")[0] for p in imports} == left_out, problems
    assert all("No module named 'postcast.datasets.ingest'" in p for p in imports), imports
