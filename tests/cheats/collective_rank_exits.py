"""Group rank 1 kills its own process mid-call (os._exit): the referee must name rank 1 and the exit code."""
import os

import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"raised"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def entry(x, out, group):
    if dist.get_rank(group) == 1:
        os._exit(7)
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc, group=group)
    out.copy_(acc)
