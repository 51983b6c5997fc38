"""Honest: a thread pool created on first use, the work split across it, the pool left alive and
idle after ``entry`` returns (as many real kernels and libraries do). Must pass under both runners."""
from concurrent.futures import ThreadPoolExecutor

import torch

SLOT = "activation.silu_and_mul"
_pool = None


def _rows(x, out, lo, hi):
    d = x.shape[-1] // 2
    out[lo:hi].copy_(torch.nn.functional.silu(x[lo:hi, ..., :d].float()) * x[lo:hi, ..., d:].float())


def entry(x, out):
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="kpool")
    n = x.shape[0]
    bounds = [(i * n // 3, (i + 1) * n // 3) for i in range(3)]
    for f in [_pool.submit(_rows, x, out, lo, hi) for lo, hi in bounds]:
        f.result()
