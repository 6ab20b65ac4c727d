#!/usr/bin/env bash
# mypy reads the package as installed through scripts/typecheck/postcast/ (pyproject.toml [tool.mypy]):
# relative links to every cli/*.py and cli/py.typed (the package root `postcast`) and to each layer folder
# (postcast.datasets, ...). This script makes the links for the files cli/ has now and drops those whose
# file is gone, then runs mypy with any arguments given; `--links` only refreshes the links.
# tests/test_typecheck_layout.py fails when a cli module has no link (run this script, commit the links).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tree=$root/scripts/typecheck/postcast
mkdir -p "$tree"
for link in "$tree"/*; do
  if [[ -L $link && ! -e $link ]]; then rm "$link"; fi  # its file was renamed or removed
done
for file in "$root"/cli/*.py "$root"/cli/py.typed; do
  ln -sfn "../../../cli/$(basename "$file")" "$tree/$(basename "$file")"
done
for layer in datasets models compression pipeline serve; do  # the layers of setup.py
  ln -sfn "../../../$layer" "$tree/$layer"
done
if [[ ${1:-} == --links ]]; then exit 0; fi
cd "$root"
exec "${PYTHON:-$root/.venv/bin/python}" -m mypy "$@"
