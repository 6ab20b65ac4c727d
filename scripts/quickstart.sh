#!/usr/bin/env bash
# The main job on the embedded default: synthetic ENS-10 -> training store -> summary.
# (The staged `postcast run configs/quickstart.yaml` pipeline replaces this once it lands.)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${POSTCAST_DATA:-data}
postcast synth -c configs/synth/quickstart.yaml --out "$DATA/synth"
postcast ingest "$DATA/synth" --out "$DATA/store.zarr"
postcast inspect "$DATA/store.zarr"
