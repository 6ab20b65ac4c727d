"""scripts/setup.sh with a broken ./.venv: a link to an environment that is gone (with and without an
activated environment) and a virtual environment whose interpreter is gone. Each is repaired (the link
removed or remade, the environment recreated) before the install; the script runs on a copy of itself in
a folder without the project, so its install step fails fast on the missing lock, after the repair."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _setup(tmp: Path, active: Path | None = None) -> subprocess.CompletedProcess[str]:
    (tmp / "scripts").mkdir(exist_ok=True)
    shutil.copy(ROOT / "scripts/setup.sh", tmp / "scripts/setup.sh")
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    if active is not None:
        env |= {"VIRTUAL_ENV": str(active), "PATH": f"{active}/bin:{env['PATH']}"}
    return subprocess.run(
        ["bash", str(tmp / "scripts/setup.sh")], capture_output=True, text=True, env=env, timeout=600, check=False
    )


def _bare_venv(path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)


def _runs(python: Path) -> bool:
    return subprocess.run([str(python), "-c", "pass"], check=False).returncode == 0


@pytest.mark.slow  # creates a virtual environment with pip (~10-30 s)
def test_dangling_venv_link_is_replaced_by_a_new_environment(tmp_path):
    (tmp_path / ".venv").symlink_to(tmp_path / "gone")
    proc = _setup(tmp_path)
    assert "removing the link" in proc.stdout and "python3-venv" not in proc.stderr, proc.stderr
    assert not (tmp_path / ".venv").is_symlink() and _runs(tmp_path / ".venv/bin/python")
    assert "lock-py311-linux.txt" in proc.stderr + proc.stdout  # it went on to the install (no lock in the copy)


@pytest.mark.slow  # recreates the environment with pip
def test_venv_whose_interpreter_is_gone_is_recreated(tmp_path):
    venv = tmp_path / ".venv"
    _bare_venv(venv)
    for exe in (venv / "bin").glob("python*"):
        exe.unlink()
        exe.symlink_to(tmp_path / "no-such-python")
    proc = _setup(tmp_path)
    assert proc.returncode != 127 and "recreating ./.venv" in proc.stdout, proc.stdout + proc.stderr
    assert _runs(venv / "bin/python")


def test_active_environment_with_a_dangling_venv_link(tmp_path):
    active = tmp_path / "env"
    _bare_venv(active)
    (tmp_path / ".venv").symlink_to(tmp_path / "gone")
    proc = _setup(tmp_path, active)
    assert "File exists" not in proc.stderr and "installing into the active environment" in proc.stdout, proc.stderr
    assert (tmp_path / ".venv").resolve() == active.resolve()
