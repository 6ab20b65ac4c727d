"""Every import is declared, and the lock still resolves.

An import that only works because some other package happened to pull its distribution in breaks on
the next fresh machine (this happened: the tests imported ``jsonschema``, which nothing declared).
So every third-party module imported by the package, the tests and the benchmarks must come from a
distribution that ``pyproject.toml`` names itself, in ``dependencies`` or an extra. The lock
(``scripts/lock-py311-linux.txt``) pins the versions the suite passes with; ``scripts/setup.sh``
installs under it, so a fresh environment equals it.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "scripts" / "lock-py311-linux.txt"
SCANNED = ("cli", "datasets", "models", "compression", "pipeline", "serve", "tests", "benchmarks")
FIRST_PARTY = {"postcast"}  # the package (+ the modules in tests/ and benchmarks/, found beside their users)


def declared(pyproject: Path) -> set[str]:
    """Canonical names of every distribution ``pyproject`` declares (dependencies and all extras)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {canonicalize_name(Requirement(r).name) for r in reqs}


def imported_modules(root: Path) -> dict[str, str]:
    """Top-level third-party module -> the first file importing it, over the scanned folders."""
    found: dict[str, str] = {}
    # battery.py, conftest.py, test_x.py; benchmarks/common.py, emos_reference.py: scripts' sibling modules
    ours = FIRST_PARTY | {p.stem for folder in ("tests", "benchmarks") for p in (root / folder).glob("*.py")}
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ours:
                        found.setdefault(top, path.relative_to(root).as_posix())
    return found


def undeclared_imports(root: Path) -> list[str]:
    """Imports whose module no declared distribution provides, each with the file and the fix."""
    providers = md.packages_distributions()
    wanted = declared(root / "pyproject.toml")
    bad = []
    for module, where in sorted(imported_modules(root).items()):
        # an optional accelerator module that is not installed here (torchao) is declared under its own name
        dists = {canonicalize_name(d) for d in providers.get(module, [])} or {canonicalize_name(module)} & wanted
        if not dists & wanted:
            hint = (
                f"declare {' or '.join(sorted(dists))} in pyproject.toml"
                if dists
                else "no installed distribution provides it: install and declare one in pyproject.toml"
            )
            bad.append(f"{where} imports {module}: {hint}")
    return bad


def lock_pins(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", line)
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def test_every_import_is_declared():
    assert undeclared_imports(ROOT) == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("import pip", "tests/test_planted.py imports pip: declare pip in pyproject.toml"),
        (
            "from no_such_module_anywhere import x",
            "tests/test_planted.py imports no_such_module_anywhere: no installed distribution provides it: install and "
            "declare one in pyproject.toml",
        ),
    ],
)
def test_a_planted_undeclared_import_is_caught(tmp_path, line, expected):
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for folder in SCANNED:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "results"))
    assert undeclared_imports(tmp_path) == []
    (tmp_path / "tests" / "test_planted.py").write_text(f"{line}\n")
    assert undeclared_imports(tmp_path) == [expected]


def test_the_environment_is_the_lock():
    """What is installed is what the lock pins (setup.sh installs under it), for every declared distribution
    and everything they pull in."""
    pins = lock_pins(LOCK)
    assert pins, f"{LOCK} pins nothing"
    off = []
    for dist in md.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in {"postcast", "pip", "setuptools", "wheel"}:
            continue
        version = dist.version.split("+")[0]  # torch 2.13.0+cpu satisfies torch==2.13.0
        if name not in pins:
            off.append(f"{name} {dist.version} is installed but not in the lock")
        elif pins[name] != version:
            off.append(f"{name} {dist.version} is installed, the lock pins {pins[name]}")
    assert off == [], "refresh the lock (docs in scripts/lock.sh) or rerun scripts/setup.sh:\n" + "\n".join(off)


def unmet_requirements(pyproject: Path, pins: dict[str, str]) -> list[str]:
    """Every requirement reachable from pyproject's ``dev`` extra (through extras, markers evaluated here)
    that the lock's pins do not satisfy: a pin missing or outside the range. Dependencies of pinned
    distributions are read from their installed metadata."""
    project = tomllib.loads(pyproject.read_text())["project"]
    own = canonicalize_name(project["name"])
    todo = [(Requirement(f"{own}[dev]"), "pyproject.toml")]
    seen: set[tuple[str, str]] = set()
    bad = []
    while todo:
        req, parent = todo.pop()
        name = canonicalize_name(req.name)
        if name != own and name not in pins:
            bad.append(f"{req} (from {parent}): not in the lock")
            continue
        if name != own and not req.specifier.contains(pins[name], prereleases=True):
            bad.append(f"{req} (from {parent}): the lock pins {pins[name]}")
            continue
        for extra in ["", *sorted(req.extras)]:  # an extra adds to the base requirements
            if (name, extra) in seen:  # every requirement is checked; each distribution's are read once
                continue
            seen.add((name, extra))
            if name == own:  # the project itself: its dependencies, or one of its extras
                reqs = project["optional-dependencies"][extra] if extra else project["dependencies"]
                todo += [
                    (Requirement(r), f"{own}[{extra}]")
                    for r in reqs
                    if Requirement(r).marker is None or Requirement(r).marker.evaluate()
                ]
                continue
            for dep in md.requires(req.name) or []:
                r = Requirement(dep)
                if r.marker is None or r.marker.evaluate({"extra": extra}):
                    todo.append((r, f"{name}[{extra}]" if extra else name))
    return bad


def test_the_lock_satisfies_every_requirement():
    """Offline: the lock is a consistent resolution of pyproject's ranges, every requirement of the project
    and of each pinned distribution met by a pin (pip's own check, a registry round trip, is
    ``test_pip_still_resolves_the_lock`` in the slow tier)."""
    assert unmet_requirements(ROOT / "pyproject.toml", lock_pins(LOCK)) == []


def test_a_range_outside_the_lock_is_caught(tmp_path):
    pins = lock_pins(LOCK)
    text = (ROOT / "pyproject.toml").read_text().replace('"numpy>=1.26,<3"', '"numpy>=1.26,<2"')
    (tmp_path / "pyproject.toml").write_text(text)
    assert unmet_requirements(tmp_path / "pyproject.toml", pins) == [
        f"numpy<2,>=1.26 (from postcast[]): the lock pins {pins['numpy']}"
    ]
    del pins["scipy"]
    assert "scipy<2,>=1.11 (from postcast[]): not in the lock" in unmet_requirements(ROOT / "pyproject.toml", pins)


@pytest.mark.slow  # ~40 s of resolving against the package indexes
def test_pip_still_resolves_the_lock(tmp_path):
    """pip resolves pyproject's declared ranges under the lock, without installing anything: a range
    edited out of the lock's reach, or a pin that a registry no longer serves, fails here."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--report",
            str(report),
            "-c",
            str(LOCK),
            f"{ROOT}[dev]",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    chosen = {
        canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    pins = lock_pins(LOCK)
    assert {n: v.split("+")[0] for n, v in chosen.items() if n != "postcast"} == {
        n: v for n, v in pins.items() if n in chosen
    }
