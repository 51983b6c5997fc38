"""rmsnorm in fp32, but a float16 output rounded through bfloat16 first (a bf16 output tile reused).

A relative error up to 2^-9 (3.9e-3), about 8x float16's half ulp, which float16's 1e-2 tolerance,
an accumulation allowance, admits on every profile: exact in float32 and bfloat16, and every
comparator passed it. The slot's contract is fp32 math with one cast to the output dtype, so its
comparator also judges precision in output ulps (abi/comparators.py UlpShare): about 60% of the
cells land more than one float16 ulp from the correctly rounded reference, against 1% allowed.
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"compare"}
DOMAIN: dict = {}  # any call (tests/test_cheats.py then runs every dtype, float16 included)


def entry(x, weight, out, eps):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()
    out.copy_(y.to(torch.bfloat16) if out.dtype == torch.float16 else y)
