#!/usr/bin/env bash
# Refresh scripts/lock-py311-linux.txt, the exact versions the test suite passes with (Python 3.11,
# Linux x86-64, CPU torch): pip-tools resolves pyproject.toml's `dev` extra (which pulls in every
# other extra but `gpu`) plus the pins in scripts/lock.in. Run it after changing a dependency, then
# `bash scripts/setup.sh && .venv/bin/python -m pytest` and commit the lock if the tests pass.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools"
"$tools/bin/pip" install --quiet "pip-tools>=7.4,<8"
"$tools/bin/pip-compile" --quiet --extra dev --strip-extras --no-emit-index-url --no-emit-find-links \
    --unsafe-package postcast --output-file scripts/lock-py311-linux.txt pyproject.toml scripts/lock.in
# the CPU wheel is torch 2.13.0+cpu; pin the release so that a CUDA build of it satisfies the lock too
sed -i -E 's/^torch==([0-9.]+)\+cpu$/torch==\1/' scripts/lock-py311-linux.txt
