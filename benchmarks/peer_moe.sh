#!/usr/bin/env bash
# Our native MoE decode kernels against the peer (ggml's CPU backend, as llama.cpp runs it),
# side by side in one run with interleaved repetitions, plus the read-bandwidth probe.
#
#   benchmarks/peer_moe.sh GGML_SRC [moe_decode.py options...]
#   GGML_SRC=/path/to/ggml benchmarks/peer_moe.sh [options...]
#
# GGML_SRC is a checkout of https://github.com/ggml-org/ggml (or llama.cpp's ggml/ folder)
# that you provide: nothing is downloaded here. It is built with CMake into
# $PEER_BUILD (default ~/.cache/kernelslot/peer/build), which must lie outside this
# repository, together with the small harness benchmarks/peer/ggml_moe_peer.c. Then
# benchmarks/moe_decode.py runs with --peer-lib (default options: --quick). Needs cmake and a
# C/C++ compiler; PYTHON selects the interpreter (default: python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
if [[ $# -gt 0 && -d "$1" ]]; then GGML_SRC="$1"; shift; fi
: "${GGML_SRC:?usage: benchmarks/peer_moe.sh GGML_SRC [moe_decode.py options] (or set GGML_SRC)}"
GGML_SRC="$(cd "$GGML_SRC" && pwd)"
[[ -f "$GGML_SRC/include/ggml.h" ]] || { echo "peer_moe.sh: $GGML_SRC has no include/ggml.h (not a ggml source tree)" >&2; exit 2; }
PEER_BUILD="${PEER_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/kernelslot/peer/build}"
mkdir -p "$PEER_BUILD"
PEER_BUILD="$(cd "$PEER_BUILD" && pwd)"
case "$PEER_BUILD/" in
  "$repo"/*) echo "peer_moe.sh: PEER_BUILD=$PEER_BUILD is inside the repository; choose a path outside it" >&2; exit 2 ;;
esac

cmake -S "$GGML_SRC" -B "$PEER_BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON \
      -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF >"$PEER_BUILD/cmake.log" 2>&1 \
  || { tail -20 "$PEER_BUILD/cmake.log" >&2; exit 1; }
cmake --build "$PEER_BUILD" -j "$(nproc)" --target ggml ggml-cpu ggml-base >"$PEER_BUILD/build.log" 2>&1 \
  || { tail -20 "$PEER_BUILD/build.log" >&2; exit 1; }
libdir="$(dirname "$(find "$PEER_BUILD" -name 'libggml-cpu.so' -print -quit)")"
"${CC:-cc}" -O2 -shared -fPIC "$here/peer/ggml_moe_peer.c" -I"$GGML_SRC/include" \
  -L"$libdir" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$libdir" -o "$PEER_BUILD/libks_peer.so"
echo "peer: $(git -C "$GGML_SRC" log -1 --format='%h %cs' 2>/dev/null || echo 'ggml (not a git checkout)') built in $PEER_BUILD"

[[ $# -gt 0 ]] || set -- --quick
exec "${PYTHON:-python3}" "$here/moe_decode.py" --peer-lib "$PEER_BUILD/libks_peer.so" "$@"
