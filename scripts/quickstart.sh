#!/usr/bin/env bash
# The main job on the embedded default (same as the README's first command after setup):
# synthetic ENS-10 -> training store -> local EMOS and U-Net for T850 -> evaluation report.
set -euo pipefail
cd "$(dirname "$0")/.."
exec postcast run configs/quickstart.yaml "$@"
