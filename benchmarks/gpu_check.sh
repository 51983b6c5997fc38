#!/usr/bin/env bash
# The prepared CUDA check: run from the repository root on a machine with one CUDA GPU.
# It verifies every single-device slot's built-in kernels on CUDA (CUDA-graph replay included
# for graph_safe entries), an example bundle under the worker runner with CUDA IPC, and the
# CUDA-only tests. Results go to $OUT (default /tmp/gpu_check). Collective slots need two GPUs
# for NCCL: where two or more exist, the collective graph-replay tests run too.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD" PYTHONUNBUFFERED=1
ks() { python3 -m kernelslot.cli "$@"; }

nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, torch.cuda.get_device_name(), 'transformers', transformers.__version__)"

SLOTS=$(python3 -c "
from kernelslot.slots import CATALOG
from kernelslot.abi import SlotKind
print(' '.join('--slot ' + n for n, d in sorted(CATALOG.items()) if d.slot.kind is not SlotKind.COLLECTIVE))")
echo "== built-in kernels on CUDA"
ks verify $SLOTS --device cuda --quiet --json "$OUT/verify_cuda.json" > "$OUT/verify_cuda.txt" 2>&1
echo "rc=$?"; grep -E "=> |^PASS|^FAIL|! " "$OUT/verify_cuda.txt" | head -60

echo "== example bundle under the worker runner (CUDA IPC)"
timeout 300 python3 -m kernelslot.cli verify examples/honest_attention --device cuda --isolate --quiet 2>&1 | tail -4

echo "== sealed CUBIN direct artifact (cuda.cubin.v1: build, Driver API admission, launch; docs/direct-artifacts.md)"
timeout 300 python3 -m kernelslot.cli verify examples/direct_cuda_activation --device cuda --quiet 2>&1 | tail -8
echo "rc=$?"

echo "== CUDA-only tests"
timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/verify/test_graph_cuda.py 2>&1 | tail -15

if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  echo "== collective graph replay on NCCL (two GPUs)"
  timeout 600 python3 -m pytest -q -m cuda -p no:cacheprovider tests/verify/test_collective_cuda.py 2>&1 | tail -15
else
  echo "== collective graph replay on NCCL: not run (needs two GPUs)"
fi
