"""Group rank 1 raises before the reduction: the referee must name rank 1 and the exception."""
import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"raised"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def entry(x, out, group):
    if dist.get_rank(group) == 1:
        raise RuntimeError("cheat: rank 1 gives up")
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc, group=group)
    out.copy_(acc)
