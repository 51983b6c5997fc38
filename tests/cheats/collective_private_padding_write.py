"""Honest while its output lives in shared memory (the referee's tensors); otherwise, as in an engine,
it writes whole padded rows (the padding of ``out`` zeroed, i.e. memory that belongs to someone else).

The rank hands the candidate private copies on the plain call and on half the extra replays: the
whole storage is copied (padding included, same offset and strides) and copied back after the
call, so the write into the padding of a private padded replay shows (``out_of_bounds_write``).
"""
import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"out_of_bounds_write"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def entry(x, out, group):
    acc = x.to(torch.float32, copy=True).contiguous()
    dist.all_reduce(acc, group=group)
    if out.is_shared():
        out.copy_(acc)
        return
    rows = torch.empty(0, dtype=out.dtype).set_(out.untyped_storage(), out.storage_offset(),
                                                (out.shape[0], out.stride(0)), (out.stride(0), 1))
    rows.zero_()
    rows[:, : out.shape[1]].copy_(acc)
