"""The read-bandwidth limit: the best sustained read this machine does with the kernels' threads.

``ks_probe.c`` streams a buffer with the native thread pool by one :class:`ReadMethod` (vector
width, 1-4 sequential streams per thread, software-prefetch distance) over a buffer with or
without transparent huge pages. :func:`read_methods` lists the candidates in a fixed order;
:func:`select_best` measures them round-robin and keeps the fastest median (ties: the earlier
candidate), so the limit benchmarks report is the best of every method tried, not one guess.

Contracts: :meth:`ProbeBuffer.read` returns ``(GB/s, checksum)``, where the checksum is the sum
of the read bytes' 64-bit words mod 2**64 whatever the method (:meth:`ProbeBuffer.expected_sum`
computes it independently); nothing here asserts a rate.
"""
from __future__ import annotations

import ctypes
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from . import build
from .memory import huge_page_bytes

WIDTHS = (64, 128, 256, 512)        # bits per load: scalar, SSE2, AVX2, AVX-512F
STREAMS = (1, 2, 4)                  # sequential streams per thread
PREFETCH = (0, 512, 2048, 8192)      # software prefetch distance in bytes (0: none)
_GOLDEN = 0x9E3779B97F4A7C15         # ks_probe_alloc's fill: word i = i * _GOLDEN mod 2^64
_MASK = (1 << 64) - 1


@dataclass(frozen=True, order=True)
class ReadMethod:
    width: int       # bits per load
    streams: int     # sequential streams per thread
    prefetch: int    # bytes ahead (0: none)
    huge: bool       # buffer with madvise(MADV_HUGEPAGE)

    @property
    def name(self) -> str:
        isa = {64: "scalar", 128: "sse2", 256: "avx2", 512: "avx512"}[self.width]
        return f"{isa} x{self.streams} pf{self.prefetch} {'thp' if self.huge else '4k'}"


def _lib() -> ctypes.CDLL:
    st = build.loaded()
    if st.lib is None:
        raise RuntimeError(f"native CPU path unavailable: {st.reason}")
    return st.lib


def width_supported(width: int) -> bool:
    return bool(_lib().ks_probe_width_supported(int(width)))


def read_methods(widths: Optional[Iterable[int]] = None, streams: Sequence[int] = STREAMS,
                 prefetch: Sequence[int] = PREFETCH, huge: Sequence[bool] = (False, True)) -> tuple[ReadMethod, ...]:
    """Every combination the CPU supports, in a fixed order (widest width first)."""
    ws = sorted((w for w in (WIDTHS if widths is None else widths) if width_supported(w)), reverse=True)
    if not ws:
        raise ValueError(f"read_methods: none of the widths {tuple(widths or WIDTHS)} is supported on this CPU")
    return tuple(ReadMethod(w, s, p, h) for h in huge for w in ws for s in streams for p in prefetch)


class ProbeBuffer:
    """``nbytes`` (a multiple of 2 MiB) allocated by ``ks_probe_alloc``: 2 MiB-aligned, huge pages
    advised or refused, every page written. Freed on :meth:`close` or garbage collection."""

    def __init__(self, nbytes: int, huge: bool):
        if nbytes <= 0 or nbytes % (2 << 20):
            raise ValueError(f"ProbeBuffer: nbytes must be a positive multiple of 2 MiB, got {nbytes}")
        self.lib, self.nbytes, self.huge = _lib(), int(nbytes), bool(huge)
        self.ptr = self.lib.ks_probe_alloc(self.nbytes, int(self.huge))
        if not self.ptr:
            raise MemoryError(f"ProbeBuffer: could not allocate {nbytes} bytes")

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self.lib.ks_probe_free(self.ptr)
            self.ptr = None

    __del__ = close

    def huge_bytes(self) -> Optional[int]:
        """Bytes of the buffer the kernel backs with huge pages (AnonHugePages of its mapping in
        /proc/self/smaps); None where that cannot be read."""
        return huge_page_bytes(self.ptr, self.nbytes)

    def expected_sum(self, offset: int = 0, nbytes: Optional[int] = None) -> int:
        """The checksum a read of ``[offset, offset + nbytes)`` must return (from the fill formula)."""
        n = self.nbytes - offset if nbytes is None else nbytes
        i0, i1 = offset // 8, (offset + n) // 8
        return ((i0 + i1 - 1) * (i1 - i0) // 2 * _GOLDEN) & _MASK

    def read(self, method: ReadMethod, threads: int, offset: int = 0, nbytes: Optional[int] = None) -> tuple[float, int]:
        """Stream ``[offset, offset + nbytes)`` (offset % 64 == 0, nbytes % 256 == 0) by ``method``
        with ``threads`` pool threads; returns (GB/s, checksum)."""
        n = self.nbytes - offset if nbytes is None else int(nbytes)
        if method.huge != self.huge:
            raise ValueError(f"ProbeBuffer.read: method {method.name} wants huge={method.huge}, buffer has {self.huge}")
        if offset < 0 or offset % 64 or n <= 0 or n % 256 or offset + n > self.nbytes:
            raise ValueError(f"ProbeBuffer.read: need 0 <= offset (multiple of 64), nbytes a positive multiple "
                             f"of 256, offset + nbytes <= {self.nbytes}; got offset {offset}, nbytes {n}")
        csum, secs = ctypes.c_uint64(), ctypes.c_double()
        rc = self.lib.ks_probe_read(self.ptr + offset, n, int(threads), method.width, method.streams,
                                    method.prefetch, ctypes.byref(csum), ctypes.byref(secs))
        if rc == -4:
            raise ValueError(f"ProbeBuffer.read: width {method.width} is not supported on this CPU")
        if rc:
            raise ValueError(f"ProbeBuffer.read: bad arguments (threads {threads}, method {method})")
        return n / max(secs.value, 1e-12) / 1e9, int(csum.value)


def select_best(measure: Callable[[ReadMethod], float], methods: Sequence[ReadMethod],
                rounds: int = 3) -> tuple[ReadMethod, dict[ReadMethod, float]]:
    """Run ``measure(m)`` (a rate, larger is better) for every method, ``rounds`` times round-robin
    (so host noise spreads over all of them); returns the method with the largest median (ties:
    the earliest in ``methods``) and every method's median."""
    if not methods or rounds < 1:
        raise ValueError(f"select_best: need methods and rounds >= 1, got {len(methods)} methods, {rounds} rounds")
    rates: dict[ReadMethod, list[float]] = {m: [] for m in methods}
    for _ in range(rounds):
        for m in methods:
            rates[m].append(float(measure(m)))
    med = {m: statistics.median(v) for m, v in rates.items()}
    best = max(methods, key=lambda m: (med[m], -methods.index(m)))
    return best, med


class ReadLimit:
    """The best read methods on this machine and the buffers to re-measure them with.

    ``ReadLimit.measure(threads)`` tries :func:`read_methods` on ``nbytes`` buffers (default
    1 GiB, ten times a 105 MiB LLC; one with huge pages advised, one without) and keeps the
    ``keep`` best; :meth:`read` then reads a rotating ``slice_bytes`` slice by each of them in
    turn, for interleaving with the kernels, and :meth:`limit` is the best of their medians."""

    def __init__(self, threads: int, top: Sequence[ReadMethod], medians: dict[ReadMethod, float],
                 buffers: dict[bool, ProbeBuffer], slice_bytes: int):
        self.threads, self.top, self.medians, self.buffers = threads, tuple(top), medians, buffers
        self.best, self.slice_bytes = self.top[0], slice_bytes
        self._i, self._pos = 0, {h: 0 for h in buffers}
        self.rates: dict[ReadMethod, list[float]] = {m: [] for m in self.top}

    @classmethod
    def measure(cls, threads: int, nbytes: int = 1 << 30, slice_bytes: int = 1 << 28, rounds: int = 3,
                methods: Optional[Sequence[ReadMethod]] = None, keep: int = 3) -> "ReadLimit":
        methods = tuple(methods or read_methods())
        if nbytes % slice_bytes or keep < 1:
            raise ValueError(f"ReadLimit.measure: nbytes {nbytes} must be a multiple of slice_bytes {slice_bytes}, "
                             f"keep >= 1 (got {keep})")
        bufs = {h: ProbeBuffer(nbytes, h) for h in sorted({m.huge for m in methods})}
        lim = cls(threads, methods[:1], {}, bufs, slice_bytes)
        for m in methods:  # warm every path once, untimed
            lim._read(m)
        best, med = select_best(lim._read, methods, rounds)
        order = sorted(methods, key=lambda m: (-med[m], methods.index(m)))
        assert order[0] == best
        top = order[:keep]
        for h in list(bufs):
            if all(m.huge != h for m in top):
                bufs.pop(h).close()
        return cls(threads, top, med, bufs, slice_bytes)

    def _read(self, m: ReadMethod) -> float:
        buf = self.buffers[m.huge]
        k = buf.nbytes // self.slice_bytes  # a rotating slice: consecutive reads never hit the LLC
        off = (self._pos[m.huge] % k) * self.slice_bytes
        self._pos[m.huge] += 1
        return buf.read(m, self.threads, off, self.slice_bytes)[0]

    def read(self) -> float:
        """One read of the next slice by the next of the kept methods; GB/s (also recorded)."""
        m = self.top[self._i % len(self.top)]
        self._i += 1
        rate = self._read(m)
        self.rates[m].append(rate)
        return rate

    def limit(self, reset: bool = True) -> float:
        """The largest median over the kept methods of the reads since the last reset (GB/s)."""
        meds = [statistics.median(v) for v in self.rates.values() if v]
        if not meds:
            raise ValueError("ReadLimit.limit: no read since the last reset; call read() first")
        if reset:
            self.rates = {m: [] for m in self.top}
        return max(meds)

    def table(self, top: int = 0) -> list[tuple[str, float]]:
        """(method name, median GB/s of the selection), fastest first (``top`` > 0: only that many)."""
        rows = sorted(self.medians.items(), key=lambda kv: -kv[1])
        return [(m.name, v) for m, v in (rows[:top] if top else rows)]
