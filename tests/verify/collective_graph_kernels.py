"""Kernels for tests/verify/test_collective_cuda.py (loaded by every rank from this file)."""
import torch
import torch.distributed as dist

_frozen = {}


def bakes_capture(x, out, group):
    """Reduces once eagerly, then captures only a copy of that result: replays never see new inputs."""
    key = (tuple(x.shape), out.data_ptr())
    if torch.cuda.is_current_stream_capturing():
        out.copy_(_frozen[key])
        return
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc, group=group)
    _frozen[key] = acc
    out.copy_(acc)
