"""The collective graph-replay path on NCCL (two or more CUDA GPUs; skipped cleanly elsewhere).

Every rank captures the candidate's call in a CUDA graph and replays it with fresh inputs written
into the same storages and fresh poison; a kernel that bakes capture-time data into the graph fails.
"""
from __future__ import annotations

import pytest
import torch

from kernelslot.slots import Candidate, get_slot
from kernelslot.verify import VerifyOptions
from kernelslot.verify.collective.referee import verify_collective

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL)")]
OPTS = VerifyOptions(device="cuda", world_sizes=(2,), dtypes=(torch.bfloat16,), profiles=("decode_batch.w2",))


@pytest.mark.parametrize("name", ["collective.all_reduce", "collective.ar_residual_rmsnorm"])
def test_builtin_passes_graph_replay_on_nccl(name):
    defn = get_slot(name)
    report = verify_collective(defn, Candidate(defn.incumbent, graph_safe=True), OPTS)
    assert report.passed, [(c.name, c.message[:300]) for r in report.results for c in r.failures()]
    assert all(r.check("graph_replay").status == "pass" for r in report.results)


def test_graph_baked_at_capture_fails():
    from kernelslot.slots import Kernel

    defn = get_slot("collective.all_reduce")
    cand = Candidate(Kernel(None, name="baked", source=_source("bakes_capture")), graph_safe=True)
    report = verify_collective(defn, cand, OPTS)
    assert not report.passed and "graph_replay" in report.failed_checks()


def _source(entry: str):
    from pathlib import Path

    from kernelslot.slots.base import KernelSource

    return KernelSource(entry, file=str(Path(__file__).with_name("collective_graph_kernels.py")))
