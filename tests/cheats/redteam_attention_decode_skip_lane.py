"""Leaves the last lane of every 128-wide head (d = 127) at zero in paged decode attention.

``attention.decode`` is judged by matched_ratio >= 0.99 per cell; one lane in 128 is 0.78% of
the cells, so a kernel whose D=128 tiling drops the last lane (or skips it on purpose) passes.
Only the D=128 profile (MiniMax-M3) has that lane, the others are unaffected. Catching it needs
a bound on the mismatched cells' error (a dropped lane has the full output magnitude) or a
per-column ratio.
"""
from kernelslot.kernels import attention as builtin

SLOT = "attention.decode"
CATCHES = {"compare", "replay"}


def entry(q, k_cache, v_cache, req_to_token, seq_lens, req_pool_indices, topk_idx, out, sm_scale, block_size):
    builtin.decode(q, k_cache, v_cache, req_to_token, seq_lens, req_pool_indices, topk_idx, out, sm_scale, block_size)
    out[..., 127::128] = 0
