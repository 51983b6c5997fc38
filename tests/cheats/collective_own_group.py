"""Builds a process group of its own (ranks 0..world-1 of the default group) instead of using the supplied one.

``new_group`` needs every rank of the default world group, including the referee's spare rank,
so it never completes: the ranks are reported blocked at the deadline.
"""
import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"raised"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py with a short deadline


def entry(x, out, group):
    mine = dist.new_group(ranks=list(range(dist.get_world_size(group))))
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc, group=mine)
    out.copy_(acc)
