"""Reduces correctly but only group rank 0 writes the output: the other ranks keep the poison."""
import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"poison_left"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def entry(x, out, group):
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc, group=group)
    if dist.get_rank(group) == 0:
        out.copy_(acc)
