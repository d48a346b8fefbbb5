#!/usr/bin/env bash
# mypy over the installed namespace. The folders install as constrain, constrain.grammars,
# constrain.engine and constrain.kernels (a package-directory mapping mypy cannot follow), so the
# check runs on a tree of links laid out the way the package installs.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/constrain"
for f in "$root"/constrain/*.py "$root"/constrain/*.pyi; do ln -s "$f" "$tree/constrain/"; done
ln -s "$root/constrain/testing" "$tree/constrain/testing"
for sub in grammars engine kernels; do ln -s "$root/$sub" "$tree/constrain/$sub"; done
cd "$tree"
python3 -m mypy --config-file "$root/pyproject.toml" -p constrain
