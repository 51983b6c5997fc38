"""CUDA-graph replay (CUDA only; skipped cleanly elsewhere)."""
from __future__ import annotations

import pytest
import torch

from kernelslot.slots import Candidate, Kernel, get_slot
from kernelslot.verify import VerifyOptions, verify_slot

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
OPTS = VerifyOptions(device="cuda", dtypes=(torch.bfloat16,))


def host_syncing(x, out):
    d = x.shape[-1] // 2
    if float(x.abs().max().item()) > 1e9:  # a host read: illegal during capture
        out.zero_()
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())


_frozen = {}


def bakes_capture_data(x, out):
    """Decides on the host from values seen when the graph was captured."""
    key = (tuple(x.shape), out.data_ptr())
    if torch.cuda.is_current_stream_capturing():
        out.copy_(_frozen[key])  # replays copy the value seen at capture time
        return
    d = x.shape[-1] // 2
    _frozen[key] = (torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float()).to(out.dtype)
    out.copy_(_frozen[key])


@pytest.mark.parametrize("slot", ["activation.silu_and_mul", "norm.rmsnorm", "attention.sdpa", "attention.decode"])
def test_builtin_survives_graph_replay(slot):
    defn = get_slot(slot)
    report = verify_slot(defn, defn.builtin_candidates(), OPTS)
    assert report.passed, [c.message for r in report.results for c in r.failures()]
    assert all(r.check("graph_replay").status == "pass" for r in report.results)


@pytest.mark.parametrize("fn", [host_syncing, bakes_capture_data])
def test_graph_cheats_fail(fn):
    defn = get_slot("activation.silu_and_mul")
    report = verify_slot(defn, Candidate(Kernel(fn, name=fn.__name__), graph_safe=True), OPTS)
    assert "graph_replay" in report.failed_checks()
