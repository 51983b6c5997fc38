#!/usr/bin/env bash
# The prepared CUDA check, for a machine with one CUDA GPU (sm_80 or later for the Triton variants).
#
# NOT RUN YET: no GPU has been lent to this project so far. Every step below is prepared and
# syntax-checked (`bash -n`) only; the first lent GPU runs it as is.
#
#   bash benchmarks/gpu_check.sh [RESULTS_FILE]      # from the repository root; default gpu_check_results.txt
#
# Unattended, each step under its own timeout (at most ~9 minutes in all, a few expected), everything
# it prints goes to RESULTS_FILE, which ends with one table. Steps:
#   1. the machine: GPU, torch, triton;
#   2. `kernelslot verify --device cuda --time` of the slots with Triton variants (docs/triton.md): on
#      sm_80+ the built-ins route every profile to the Triton variant (the torch twin is left out,
#      "served by triton..."), each timed against its torch twin, CUDA-graph capture/replay for the
#      graph-safe ones (activation, norm, fused_experts, decode);
#   3. the other single-device slots' built-ins on CUDA (graph replay included);
#   4. the CUDA test subset (`-m cuda`): the compiled Triton variants, graph replay and its cheats;
#   5. an example bundle under the worker runner (CUDA IPC) and the sealed CUBIN direct artifact;
#   6. collective graph replay on NCCL where two or more GPUs exist;
#   7. the table: per slot the variants that ran, profile runs passed, graph replays passed, and the
#      median / range of the speedup over the torch incumbent; then each step's exit status.
set -uo pipefail
RESULTS=${1:-gpu_check_results.txt}
WORK=$(mktemp -d)  # the JSON reports the table is built from
exec > >(tee "$RESULTS") 2>&1
export PYTHONPATH="$PWD/src:$PWD" PYTHONUNBUFFERED=1 TRITON_INTERPRET=0  # compiled Triton, never the interpreter
PY=${PYTHON:-python3}
STEPS=()

run_step() {  # run_step NAME SECONDS CMD...: run with a deadline, record its exit status
  local name=$1 limit=$2
  shift 2
  echo "== $name (timeout ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  echo "-- $name: rc=$rc in $((SECONDS - t0))s"
  STEPS+=("$name|$rc|$((SECONDS - t0))")
}

echo "== gpu_check $(date -u +%FT%TZ) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi -L
$PY -c "import torch, triton; print('torch', torch.__version__, torch.cuda.get_device_name(), 'sm_%d%d' % torch.cuda.get_device_capability(), 'triton', triton.__version__)"

TRITON_SLOTS="--slot activation.silu_and_mul --slot norm.rmsnorm --slot attention.decode --slot moe.fused_experts --slot moe.block_tkg"
OTHER_SLOTS=$($PY -c "
from kernelslot.slots import CATALOG
from kernelslot.abi import SlotKind
triton = {'activation.silu_and_mul', 'norm.rmsnorm', 'attention.decode', 'moe.fused_experts', 'moe.block_tkg'}
print(' '.join('--slot ' + n for n, d in sorted(CATALOG.items()) if d.slot.kind is not SlotKind.COLLECTIVE and n not in triton))")

# shellcheck disable=SC2086  # the --slot lists split on purpose
run_step "Triton variants on CUDA, timed against the torch incumbent" 240 \
  $PY -m kernelslot.cli verify $TRITON_SLOTS --device cuda --time --quiet --json "$WORK/triton.json"
# shellcheck disable=SC2086
run_step "other single-device built-ins on CUDA" 90 \
  $PY -m kernelslot.cli verify $OTHER_SLOTS --device cuda --quiet --json "$WORK/other.json"
run_step "CUDA test subset (-m cuda)" 150 \
  $PY -m pytest -q -m cuda -p no:cacheprovider tests/kernels/triton/test_cuda.py tests/verify/test_graph_cuda.py
run_step "example bundle under the worker runner (CUDA IPC)" 60 \
  $PY -m kernelslot.cli verify examples/honest_attention --device cuda --isolate --quiet
run_step "sealed CUBIN direct artifact (cuda.cubin.v1; docs/direct-artifacts.md)" 60 \
  $PY -m kernelslot.cli verify examples/direct_cuda_activation --device cuda --quiet
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  run_step "collective graph replay on NCCL (two GPUs)" 120 \
    $PY -m pytest -q -m cuda -p no:cacheprovider tests/verify/test_collective_cuda.py
else
  echo "== collective graph replay on NCCL: not run (needs two GPUs)"
fi

echo "== table"
$PY - "$WORK" "${STEPS[@]}" <<'EOF'
import json, statistics, sys
from pathlib import Path

work, steps = Path(sys.argv[1]), sys.argv[2:]
rows = []
for path in sorted(work.glob("*.json")):
    for slot in json.loads(path.read_text())["slots"]:
        ran = [r for r in slot["results"] if r["status"] != "skip"]
        graph = [c["status"] for r in ran for c in r["checks"] if c["name"] == "graph_replay"]
        speedups = [r["timing"]["speedup"] for r in ran if (r.get("timing") or {}).get("speedup")]
        speed = (f"{statistics.median(speedups):.2f}x ({min(speedups):.2f}-{max(speedups):.2f})" if speedups else "-")
        status = "PASS" if slot["passed"] else "FAIL"
        rows.append((slot["slot"], status, ",".join(sorted({r["kernel"] for r in ran})) or "-",
                     f"{sum(r['status'] == 'pass' for r in ran)}/{len(ran)}",
                     f"{graph.count('pass')}/{len(graph)}" if graph else "-", speed))
        for why in slot["errors"]:
            rows.append(("", "", "error: " + why[:100], "", "", ""))
head = ("slot", "verdict", "variants that ran", "runs passed", "graph replays", "speedup vs torch (median, range)")
widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
for r in [head, tuple("-" * w for w in widths)] + rows:
    print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
print()
for step in steps:
    name, rc, secs = step.split("|")
    print(f"{'ok  ' if rc == '0' else 'FAIL'} rc={rc:<3} {secs:>4}s  {name}")
EOF
rm -rf "$WORK"
