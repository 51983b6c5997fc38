#!/usr/bin/env bash
# Our native MoE decode kernels against one or two peers (upstream ggml's CPU backend as
# llama.cpp runs it; ik_llama.cpp's as `llama-server -rtr` runs it), side by side in one run with
# interleaved repetitions, plus this machine's read limit (kernelslot.kernels.native.probe).
#
#   benchmarks/peer_moe.sh SRC [SRC2] [moe_decode.py options...]
#   GGML_SRC=/path/to/ggml benchmarks/peer_moe.sh [options...]
#
# Each SRC is a source tree you provide, outside this repository (nothing is downloaded here):
# a checkout of https://github.com/ggml-org/ggml (or llama.cpp's ggml/ folder), or of
# https://github.com/ikawrakow/ik_llama.cpp (its root or its ggml/ folder; recognised by
# ggml_moe_up_gate in include/ggml.h). Each is built with CMake into $PEER_BUILD/ggml or
# $PEER_BUILD/ik (default PEER_BUILD ~/.cache/kernelslot/peer), which must lie outside the
# repository, with its harness (benchmarks/peer/ggml_moe_peer.c or ik_moe_peer.c). ik's ggml is
# configured through a two-line wrapper project in $PEER_BUILD/ik-wrap (so its missing ggml.pc.in
# does not matter) with -DCMAKE_CXX_STANDARD=20 (std::barrier) and OpenMP. Then
# benchmarks/moe_decode.py runs with one --peer-lib per tree (default options: --quick).
# Needs cmake, a C/C++ compiler and (ik) OpenMP; PYTHON selects the interpreter (default:
# python3); PEER_JOBS the build parallelism (default: nproc); builds run under `nice -n 10`.
set -euo pipefail
shopt -s inherit_errexit

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
srcs=()
while [[ $# -gt 0 && -d "$1" ]]; do srcs+=("$1"); shift; done
[[ ${#srcs[@]} -gt 0 || -z "${GGML_SRC:-}" ]] || srcs=("$GGML_SRC")
[[ ${#srcs[@]} -gt 0 ]] || { echo "usage: benchmarks/peer_moe.sh SRC [SRC2] [moe_decode.py options] (or set GGML_SRC)" >&2; exit 2; }
PEER_BUILD="${PEER_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/kernelslot/peer}"
mkdir -p "$PEER_BUILD"
PEER_BUILD="$(cd "$PEER_BUILD" && pwd)"
case "$PEER_BUILD/" in
  "$repo"/*) echo "peer_moe.sh: PEER_BUILD=$PEER_BUILD is inside the repository; choose a path outside it" >&2; exit 2 ;;
esac
jobs="${PEER_JOBS:-$(nproc)}"

build_one() {  # SRC -> prints the harness library path
  local src kind out libdir
  src="$(cd "$1" && pwd)"
  [[ -f "$src/include/ggml.h" || ! -f "$src/ggml/include/ggml.h" ]] || src="$src/ggml"
  case "$src/" in "$repo"/*) echo "peer_moe.sh: $src is inside the repository; keep peer sources outside it" >&2; return 2 ;; esac
  [[ -f "$src/include/ggml.h" ]] || { echo "peer_moe.sh: $src has no include/ggml.h (not a ggml source tree)" >&2; return 2; }
  if grep -q ggml_moe_up_gate "$src/include/ggml.h"; then kind=ik; else kind=ggml; fi
  out="$PEER_BUILD/$kind"
  mkdir -p "$out"
  if [[ $kind == ik ]]; then
    mkdir -p "$PEER_BUILD/ik-wrap"
    printf 'cmake_minimum_required(VERSION 3.14)\nproject(ks_ik_peer C CXX)\nadd_subdirectory("%s" ggml)\n' "$src" \
      >"$PEER_BUILD/ik-wrap/CMakeLists.txt"
    cmake -S "$PEER_BUILD/ik-wrap" -B "$out" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON \
          -DCMAKE_CXX_STANDARD=20 -DGGML_OPENMP=ON -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF >"$out/cmake.log" 2>&1 \
      || { tail -20 "$out/cmake.log" >&2; return 1; }
    nice -n 10 cmake --build "$out" -j "$jobs" --target ggml >"$out/build.log" 2>&1 || { tail -20 "$out/build.log" >&2; return 1; }
    libdir="$(dirname "$(find -L "$out" -name 'libggml.so' -print -quit)")"
    "${CC:-cc}" -O2 -shared -fPIC -fopenmp "$here/peer/ik_moe_peer.c" -I"$src/include" \
      -L"$libdir" -lggml -lm -Wl,-rpath,"$libdir" -o "$out/libks_peer.so" || return 1
  else
    cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON \
          -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF >"$out/cmake.log" 2>&1 \
      || { tail -20 "$out/cmake.log" >&2; return 1; }
    nice -n 10 cmake --build "$out" -j "$jobs" --target ggml ggml-cpu ggml-base >"$out/build.log" 2>&1 \
      || { tail -20 "$out/build.log" >&2; return 1; }
    libdir="$(dirname "$(find -L "$out" -name 'libggml-cpu.so' -print -quit)")"
    "${CC:-cc}" -O2 -shared -fPIC "$here/peer/ggml_moe_peer.c" -I"$src/include" \
      -L"$libdir" -lggml -lggml-base -lggml-cpu -lm -Wl,-rpath,"$libdir" -o "$out/libks_peer.so" || return 1
  fi
  echo "peer $kind: $(git -C "$src" log -1 --format='%h %cs' 2>/dev/null || echo '(not a git checkout)') built in $out" >&2
  echo "$out/libks_peer.so"
}

libs=()
for s in "${srcs[@]}"; do lib="$(build_one "$s")" || exit 1; libs+=(--peer-lib "$lib"); done
[[ $# -gt 0 ]] || set -- --quick
exec "${PYTHON:-python3}" "$here/moe_decode.py" "${libs[@]}" "$@"
