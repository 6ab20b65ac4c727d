#!/usr/bin/env bash
# The main job on the embedded default, i.e. the README's first command:
# synthetic ENS-10 -> training store -> local EMOS and U-Net for T850 -> evaluation report
# -> CF forecasts -> an error-bounded compressed artefact of the U-Net's training fields.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/postcast run configs/quickstart.yaml "$@"
