"""Static checks run with the tests: ruff and mypy clean, imports go one way between layers."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# datasets <- models/compression <- pipeline <- serve; the CLI (folder cli/ = package postcast) on top
LAYERS = {"datasets": 0, "models": 1, "compression": 1, "pipeline": 2, "serve": 3}


def test_ruff_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: run scripts/setup.sh")
    proc = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_mypy_clean():
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_imports_go_one_way():
    bad = []
    for layer, rank in LAYERS.items():
        for path in (ROOT / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "postcast" and len(parts) > 1:
                        other = parts[1]
                        if other == "cli" or LAYERS.get(other, -1) > rank:
                            bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, bad
