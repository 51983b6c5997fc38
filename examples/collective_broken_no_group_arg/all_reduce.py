"""Bad input: no group parameter."""
import torch.distributed as dist


def all_reduce(x, out):
    acc = x.float().clone()
    dist.all_reduce(acc)
    out.copy_(acc)
