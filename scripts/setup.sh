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

if [[ -n "${VIRTUAL_ENV:-}" ]]; then
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
    echo "setup: creating the virtual environment ./.venv ($(python3 --version))"
    python3 -m venv .venv || { echo "setup: python3 -m venv failed: install your system's venv package (Debian: apt-get install python3-venv)" >&2; exit 69; }
else
    echo "setup: reusing the virtual environment ./.venv"
fi

.venv/bin/python -m pip install --quiet --constraint "$LOCK" --editable ".[dev]"
echo "setup: done ($(.venv/bin/python -c 'import torch, postcast; print(f"postcast {postcast.__version__}, torch {torch.__version__}")'))"
