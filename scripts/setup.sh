#!/usr/bin/env bash
# Install postcast (editable, with its `dev` extra) at the locked versions into a virtual environment:
# the active one when a virtual environment is activated, else ./.venv, created here. Either way
# ./.venv names the environment afterwards (a link to the active one), so the README's commands
# (.venv/bin/postcast, .venv/bin/python -m pytest) work with or without an activated environment,
# and the system Python is never installed into (it may refuse, PEP 668).
# The lock (scripts/lock-py311-linux.txt: Python 3.11, Linux x86-64, CPU torch 2.13.0) is used as
# pip constraints; pyproject.toml keeps ranges for library users. Refresh it with scripts/lock.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=scripts/lock-py311-linux.txt

if [[ -L .venv && ! -e .venv ]]; then  # a link to an environment that is gone (this script makes such links)
    echo "setup: ./.venv linked to $(readlink .venv), which no longer exists: removing the link"
    rm .venv
fi
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
    if [[ ! -x "$VIRTUAL_ENV/bin/python" ]]; then
        echo "setup: the active environment $VIRTUAL_ENV has no working bin/python: deactivate, then rerun" >&2
        exit 2
    fi
    active=$(cd "$VIRTUAL_ENV" && pwd -P)
    if [[ -e .venv && "$(cd .venv && pwd -P)" != "$active" ]]; then
        if [[ ! -L .venv ]]; then
            echo "setup: ./.venv is another environment than the active $VIRTUAL_ENV: remove ./.venv or deactivate" >&2
            exit 2
        fi
        rm .venv
    fi
    [[ -e .venv ]] || ln -s "$active" .venv
    echo "setup: installing into the active environment $VIRTUAL_ENV (./.venv links to it)"
elif [[ ! -x .venv/bin/python ]]; then
    fresh=()
    if [[ -f .venv/pyvenv.cfg ]]; then  # a virtual environment whose interpreter is gone (its Python was removed)
        echo "setup: ./.venv/bin/python does not run (its Python is gone): recreating ./.venv"
        fresh=(--clear)
    elif [[ -e .venv || -L .venv ]]; then
        echo "setup: ./.venv exists but is not a virtual environment: move it away and rerun" >&2
        exit 2
    fi
    echo "setup: creating the virtual environment ./.venv ($(python3 --version))"
    python3 -m venv "${fresh[@]}" .venv || { echo "setup: python3 -m venv failed: install your system's venv package (Debian: apt-get install python3-venv)" >&2; exit 69; }
else
    echo "setup: reusing the virtual environment ./.venv"
fi

.venv/bin/python -m pip install --quiet --constraint "$LOCK" --editable ".[dev]"
echo "setup: done ($(.venv/bin/python -c 'import torch, postcast; print(f"postcast {postcast.__version__}, torch {torch.__version__}")'))"
