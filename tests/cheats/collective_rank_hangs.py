"""Group rank 1 sleeps forever; rank 0 waits for it in the all-reduce. Must be reported, never deadlock."""
import time

import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"raised"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py with a short deadline


def entry(x, out, group):
    if dist.get_rank(group) == 1:
        time.sleep(3600)
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc, group=group)
    out.copy_(acc)
