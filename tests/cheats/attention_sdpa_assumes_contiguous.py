"""Cheat for ``attention.sdpa``: correct math, but writes the result through a view of ``out``'s
storage with contiguous strides, assuming the validator's output is contiguous. On the referee's
padded output this lands in the padding (``out_of_bounds_write``) and leaves logical cells
unwritten (``poison_left``).
"""
from __future__ import annotations

import torch

from kernelslot.kernels.attention import sdpa


def entry(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, sm_scale: float, causal: bool) -> None:
    result = torch.empty(out.shape, dtype=out.dtype, device=out.device)
    sdpa(q, k, v, result, sm_scale, causal)
    t, h, d = out.shape
    out.as_strided((t, h, d), (h * d, d, 1), out.storage_offset()).copy_(result)
