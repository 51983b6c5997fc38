"""Memory for the bytes the native kernels stream: the prepared expert tiles.

:func:`streamed_zeros` gives a zeroed ``uint8`` tensor on 2 MiB-aligned anonymous memory advised
for transparent huge pages (``madvise(MADV_HUGEPAGE)`` before the first touch), so the kernel can
back it with 2 MiB pages: a cold read of an expert then walks one page-table entry per 2 MiB
instead of one per 4 KiB, and the hardware prefetchers are not cut off at every 4 KiB (cold
GPT-OSS-shape calls on AMD Zen 4 measured 0.99-1.08x, about 1.03x in the median: docs/native.md,
Performance, "Huge pages for the prepared weights"). Tensors under :data:`MIN_HUGE_BYTES` stay on
plain memory. Where the platform has no ``madvise`` (non-Linux), the mapping fails, or
``KERNELSLOT_NATIVE_HUGEPAGES=0`` (read per call, for A/B runs), it is plain ``torch.zeros``.
Whether the kernel grants huge pages is its choice (THP mode ``always`` or ``madvise``, free
2 MiB blocks); :func:`huge_page_bytes` reads what it granted.
"""
from __future__ import annotations

import math
import mmap
from typing import Optional

import torch

from .build import switched_off

HUGE_PAGE = 2 << 20
# Smaller tensors stay on plain memory: a huge page faulted in for a few KiB of tiles would cost
# 2 MiB of RSS each (tests and small models prepare many), and at this size the page walks and
# prefetcher restarts huge pages save are a small share of a call.  From 8 MiB the rounding up to
# whole huge pages costs at most a quarter more memory.
MIN_HUGE_BYTES = 8 << 20


def streamed_zeros(*shape: int) -> torch.Tensor:
    """A zeroed contiguous ``uint8`` tensor of ``shape``: from :data:`MIN_HUGE_BYTES` on, its
    first byte 2 MiB-aligned on memory advised for huge pages (see the module doc); smaller, or
    where that is not possible, ``torch.zeros``. The tensor keeps its mapping alive; the mapping
    is unmapped with the last view."""
    n = math.prod(shape)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if n < MIN_HUGE_BYTES or advice is None or not flags or switched_off("KERNELSLOT_NATIVE_HUGEPAGES"):
        return torch.zeros(shape, dtype=torch.uint8)
    try:
        mem = mmap.mmap(-1, n + HUGE_PAGE, flags=flags)
        mem.madvise(advice)  # before any page is touched: the faults can then map 2 MiB pages
    except (OSError, ValueError):
        return torch.zeros(shape, dtype=torch.uint8)
    whole = torch.frombuffer(mem, dtype=torch.uint8)  # holds `mem` (buffer protocol)
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start:start + n].view(shape)


def huge_page_bytes(ptr: int, nbytes: int) -> Optional[int]:
    """Bytes of the mappings overlapping ``[ptr, ptr + nbytes)`` that the kernel backs with huge
    pages (their ``AnonHugePages`` in /proc/self/smaps; a mapping is counted whole); None where
    that cannot be read."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    total, inside = 0, False
    for line in lines:
        head = line.split()[0] if line else ""
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo < ptr + nbytes and hi > ptr
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1]) * 1024
    return total
