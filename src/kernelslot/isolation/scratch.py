"""Poison the memory a candidate's scratch allocations come from, for one call.

A kernel that reads scratch it never wrote (``torch.empty`` then accumulate, ``acc * 0`` as a
"clear", a partially written workspace) passes wherever that memory happens to hold zeros or finite
values. Around a call (:func:`poisoned_scratch`; the worker, or in-process) the runner poisons it:

* every ``torch.empty`` / ``empty_like`` / ``empty_strided`` / ``new_empty`` during the call, from
  Python or C++, is filled with NaN (floats) or the largest integer: torch's
  ``fill_uninitialized_memory``, which acts only in deterministic-algorithms mode, so that mode is
  on (warn only) for the call. Ops with a separate deterministic implementation use it there; a
  kernel whose result depends on that choice was not run-to-run deterministic to begin with;
* the freed memory of the allocators is filled with bytes ``0xFF`` (NaN in every float dtype, -1
  in every integer dtype), for scratch that does not come from torch (``numpy.empty``, ``malloc``):

* CPU (glibc): ``mallopt`` fixes the mmap threshold at 4 MiB (allocations below it come from the
  heap) and the trim threshold at 32 MiB (freed poison stays in the heap, and the process keeps at
  most that much free memory). Then, for every power of two from 1 MiB down to 64 B, blocks are
  taken with ``posix_memalign`` (as torch's CPU allocator does) and filled while the allocator
  still serves them from freed memory below the heap's break (at most 32 per size up to 64 KiB,
  4 above), plus one from the top; then all are freed. Larger scratch from outside torch comes
  from fresh, zeroed pages and cannot be poisoned (docs/referee.md, Known gaps).
* CUDA (when initialised in this process): blocks of every power of two up to 64 MiB are
  allocated on the current device, filled and freed, so they wait in the caching allocator's pools.

The CPU part fills at most about 10 MiB (a few milliseconds per poisoned call). Best effort by nature: an allocation is served from poisoned memory with high
probability, not certainty.
"""
from __future__ import annotations

import contextlib
import ctypes
import warnings
from typing import Any, Iterator

import torch

POISON_BYTE = 0xFF
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_MMAP_THRESHOLD = 4 << 20
_TRIM_THRESHOLD = 32 << 20
_LARGEST, _SMALL = 1 << 20, 64 << 10
_PER_SIZE = {True: 32, False: 4}  # blocks per size: small (<= _SMALL), large
_libc: Any = None


def _glibc() -> Any:
    """libc with the allocator configured (once), or False where that is not glibc."""
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(None)
            libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
            libc.memset.argtypes, libc.memset.restype = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t], ctypes.c_void_p
            libc.free.argtypes = [ctypes.c_void_p]
            libc.sbrk.argtypes, libc.sbrk.restype = [ctypes.c_ssize_t], ctypes.c_size_t
            libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
            libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
            _libc = libc
        except (OSError, AttributeError):
            _libc = False
    return _libc


def _poison_heap() -> None:
    libc = _glibc()
    if not libc:
        return
    brk = libc.sbrk(0) or 0
    taken: list[ctypes.c_void_p] = []
    size = _LARGEST
    while size >= 64:
        for _ in range(_PER_SIZE[size <= _SMALL]):
            p = ctypes.c_void_p()
            if libc.posix_memalign(ctypes.byref(p), 64, size) != 0:
                break
            libc.memset(p, POISON_BYTE, size)
            taken.append(p)
            if not brk or p.value + size > brk:  # from the top of the heap: no freed chunk of this size left
                break
        size //= 2
    for p in reversed(taken):
        libc.free(p)


def _poison_cuda() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    blocks, size = [], 512
    while size <= 64 << 20:
        blocks.append(torch.full((size,), POISON_BYTE, dtype=torch.uint8, device=device))
        size *= 2
    del blocks
    torch.cuda.synchronize(device)


@contextlib.contextmanager
def poisoned_scratch() -> Iterator[None]:
    """Around one call: the allocators' freed memory filled with poison first, and every torch
    ``empty`` allocation during the call filled with NaN (float) or the largest integer (see the
    module docstring); torch's own setting is put back afterwards unless the call changed it."""
    _poison_heap()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        _poison_cuda()
    before = _fill_mode()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*deterministic.*")
            yield
    finally:
        if _fill_mode() == (True, True, True):  # what was set here: the call left it alone
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])
            torch.utils.deterministic.fill_uninitialized_memory = before[2]


def _fill_mode() -> tuple[bool, bool, bool]:
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            bool(torch.utils.deterministic.fill_uninitialized_memory))
