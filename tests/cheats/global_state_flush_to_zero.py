"""Turns on flush-to-zero / denormals-are-zero for speed (subnormal arithmetic is slow on x86) and
never turns it off: every later computation in the process, the incumbent's and the referee's
references in-process included, silently flushes subnormals. Its own outputs are right."""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"global_state_changed"}


def entry(x, weight, out, eps):
    torch.set_flush_denormal(True)
    xf = x.float()
    out.copy_(xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float())
