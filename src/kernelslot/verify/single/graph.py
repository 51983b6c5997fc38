"""CUDA-graph replay (docs/referee.md; CUDA only, for ``graph_safe`` candidates).

The candidate's call is captured once into a ``torch.cuda.CUDAGraph`` after a warm-up on a
side stream. Each replay refills the captured input storages with fresh values, re-poisons
the outputs, replays the graph and compares with a fresh reference: a kernel that baked
capture-time data (or a host-side decision) into the graph fails. Host synchronisation during
capture is an error raised by CUDA itself and is reported as a failure.
"""
from __future__ import annotations

import traceback
from typing import Any

import torch

from kernelslot.bundle.loader import resolve_kernel
from kernelslot.slots.base import Case
from kernelslot.verify.cases import refill_live
from kernelslot.verify.verdict import FAIL, Check

GRAPH_REPLAYS = 2


def graph_replay(run: Any, case: Case, cpu_case: Case, outputs: dict, args: list, prepared: Any) -> None:
    """Capture ``run``'s call (a :class:`~kernelslot.verify.single.pipeline.ProfileRun`) and replay it on fresh inputs."""
    run.performed.add(Check.GRAPH_REPLAY)
    entry, _ = resolve_kernel(run.cand.kernel)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                entry(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        for alloc in outputs.values():
            alloc.poison()
        with torch.cuda.graph(graph):
            entry(*args)
    except Exception:
        run.result.record(Check.GRAPH_REPLAY, FAIL, "capture failed (host sync or graph-unsafe work?):\n" + traceback.format_exc(limit=4))
        return
    for r in range(GRAPH_REPLAYS):
        ref_case = refill_live(run.defn, run.profile, run.seed, 100 + r, case, cpu_case)
        expected = run.expected(ref_case)
        for alloc in outputs.values():
            alloc.poison()
        graph.replay()
        torch.cuda.synchronize()
        for name, alloc in outputs.items():
            left = torch.isnan(alloc.view).sum().item() if alloc.view.dtype.is_floating_point else 0
            if left:
                run.result.record(Check.GRAPH_REPLAY, FAIL, f"graph replay {r}: output {name}: {left} cells never written")
                return
        if not run.compare(outputs, expected, f"graph replay {r}: ", Check.GRAPH_REPLAY):
            return
