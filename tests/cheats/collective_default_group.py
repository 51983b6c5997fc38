"""All-reduces over the default world group instead of the supplied one.

The referee's world has a spare rank outside the candidate's group, so this collective never
completes: every rank of the group is reported blocked inside torch.distributed at the deadline.
"""
import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"raised"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py with a short deadline


def entry(x, out, group):
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc)  # no group=: the default world group
    out.copy_(acc)
