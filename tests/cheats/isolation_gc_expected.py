"""Isolation cheat: looks for the referee's expected output through ``gc.get_objects()``.

It scans live tensors (and dicts holding tensors) for an fp32 tensor of the output's shape and
copies it. In-process this only fails because the pipeline computes references after the call;
under the worker runner references live in another process, so there is nothing to find whatever
the order: the fallback leaves zeros and the referee's compare fails. No import-time side effects
(tests/test_cheats.py imports every cheat).
"""
import gc

import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("compare", None)  # (failed check, cause tag) under WorkerRunner


def _candidates():
    for obj in gc.get_objects():  # tensors may be untracked; the containers holding them are not
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, dict):
            yield from (v for v in obj.values() if isinstance(v, torch.Tensor))


def entry(x, out):
    for obj in _candidates():
        if (obj.dtype == torch.float32 and tuple(obj.shape) == tuple(out.shape)
                and obj.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()
                and not bool(torch.isnan(obj).any())):
            out.copy_(obj)
            return
    out.zero_()
