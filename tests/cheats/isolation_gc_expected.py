"""Isolation cheat: reads the referee's expected output through ``gc.get_objects()``.

In-process the reference has already been computed when the candidate runs, so a scan of the
live objects finds an fp32 tensor of the output's shape and copies it. Under the worker runner
the references live in another process: nothing matches, the fallback leaves zeros, and the
referee's compare fails. No import-time side effects (tests/test_cheats.py imports every cheat).
"""
import gc

import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("compare", None)  # (failed check, cause tag) under WorkerRunner


def entry(x, out):
    for obj in gc.get_objects():
        if (isinstance(obj, torch.Tensor) and obj.dtype == torch.float32 and tuple(obj.shape) == tuple(out.shape)
                and obj.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()
                and not bool(torch.isnan(obj).any())):
            out.copy_(obj)
            return
    out.zero_()
