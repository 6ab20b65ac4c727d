#!/usr/bin/env bash
# Install postcast and its development tools into the current Python environment.
# torch: a CPU build (2.13.0) is installed first when no torch is present, so the open range in
# pyproject.toml (torch>=2.4) installs nothing more; GPU users install their CUDA build beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet -e ".[dev]"
