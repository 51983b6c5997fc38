"""Broken: reduces straight into out, which the referee (like an engine slicing a buffer) pads."""
import torch.distributed as dist


def all_reduce(x, out, group):
    out.copy_(x)
    dist.all_reduce(out, group=group)
