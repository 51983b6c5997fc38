"""Memory for the streamed weights (kernels/native/memory.py): zeroed, 2 MiB-aligned, advised for
transparent huge pages, alive as long as a view is, granted huge pages where the kernel's THP mode
allows them, and the same numbers from the kernels whatever memory the tiles sit on."""
from __future__ import annotations

import gc
import mmap
import re
import sys

import pytest
import torch

from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights
from kernelslot.kernels.native import expert_mlp_native, native_status, prepare_native_experts
from kernelslot.kernels.native.memory import HUGE_PAGE, MIN_HUGE_BYTES, huge_page_bytes, streamed_zeros

AVAILABLE, _, REASON = native_status()
LINUX_MADVISE = sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE")


def _thp_mode() -> str | None:
    """The kernel's THP mode ('always', 'madvise', 'never'), None where it cannot be read."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            m = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        return None
    return m.group(1) if m else None


@pytest.mark.skipif(not LINUX_MADVISE, reason="needs Linux madvise(MADV_HUGEPAGE)")
def test_streamed_zeros_is_zeroed_contiguous_and_2mib_aligned():
    rows = MIN_HUGE_BYTES // (5 * 4160) + 1
    t = streamed_zeros(rows, 5, 4096 + 64)
    assert t.shape == (rows, 5, 4160) and t.dtype == torch.uint8 and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0
    assert int(t.count_nonzero()) == 0
    t[1, 2, 7] = 9  # writable, and element order is the plain row-major order
    assert int(t.view(-1)[(1 * 5 + 2) * 4160 + 7]) == 9


@pytest.fixture
def mmap_calls(monkeypatch) -> list:
    """The arguments of every mmap.mmap call made while the test runs (the mappings are still made)."""
    calls = []
    real = mmap.mmap
    monkeypatch.setattr(mmap, "mmap", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def test_small_tensors_stay_on_plain_memory(mmap_calls):
    """Below MIN_HUGE_BYTES no mapping is made (a huge page per small tensor would cost 2 MiB of
    memory each); from it on one is."""
    t = streamed_zeros(MIN_HUGE_BYTES // 64 - 1, 64)
    assert mmap_calls == [] and int(t.count_nonzero()) == 0
    streamed_zeros(MIN_HUGE_BYTES // 64, 64)
    assert len(mmap_calls) == (1 if LINUX_MADVISE else 0)


@pytest.mark.skipif(not LINUX_MADVISE, reason="needs Linux madvise(MADV_HUGEPAGE)")
def test_a_view_keeps_the_mapping_alive():
    t = streamed_zeros(MIN_HUGE_BYTES + (4 << 20))
    view = t[1 << 20:]
    ptr = view.data_ptr()
    del t
    gc.collect()
    view.fill_(5)  # would fault if the mapping had been unmapped with the first tensor
    assert int(view[-1]) == 5 and view.data_ptr() == ptr


def test_switch_off_gives_plain_zeros(monkeypatch, mmap_calls):
    """KERNELSLOT_NATIVE_HUGEPAGES=0: even a tensor above MIN_HUGE_BYTES gets no mapping."""
    monkeypatch.setenv("KERNELSLOT_NATIVE_HUGEPAGES", "0")
    t = streamed_zeros(MIN_HUGE_BYTES // 64, 64)
    assert mmap_calls == [] and t.shape == (MIN_HUGE_BYTES // 64, 64) and int(t.count_nonzero()) == 0
    assert streamed_zeros(0, 3).shape == (0, 3)
    monkeypatch.setenv("KERNELSLOT_NATIVE_HUGEPAGES", "1")
    streamed_zeros(MIN_HUGE_BYTES // 64, 64)
    assert len(mmap_calls) == (1 if LINUX_MADVISE else 0)


@pytest.mark.skipif(not LINUX_MADVISE or _thp_mode() not in ("always", "madvise"),
                    reason=f"needs transparent huge pages in mode always or madvise (mode here: {_thp_mode()})")
def test_the_kernel_grants_huge_pages():
    t = streamed_zeros(max(16 << 20, MIN_HUGE_BYTES))
    t.fill_(1)  # fault every page in
    got = huge_page_bytes(t.data_ptr(), t.numel())
    assert got is not None and got >= t.numel() // 2, f"only {got} of {t.numel()} bytes on huge pages"


@pytest.mark.skipif(not AVAILABLE, reason=f"native path unavailable: {REASON}")
@pytest.mark.parametrize("fmt", ("bf16", "mxfp4"))
def test_prepared_tiles_on_either_memory_give_the_same_bits(monkeypatch, fmt):
    gen = torch.Generator().manual_seed(3)
    E, H, I, T = 4, 2048, 1024, 3  # gate/up tiles above MIN_HUGE_BYTES in both formats
    if fmt == "bf16":
        w = ExpertWeights("dense", (torch.randn(E, 2 * I, H, generator=gen) * 0.2).bfloat16(),
                          (torch.randn(E, H, I, generator=gen) * 0.2).bfloat16())
    else:
        u8 = lambda *s, lo=0, hi=256: torch.randint(lo, hi, s, dtype=torch.uint8, generator=gen)
        w = ExpertWeights("mxfp4", u8(E, 2 * I, H // 2), u8(E, H, I // 2), u8(E, 2 * I, H // 32, lo=118, hi=123),
                          u8(E, H, I // 32, lo=118, hi=123))
    x, ids, wts = torch.randn(T, H, generator=gen), torch.randint(0, E, (T, 2), generator=gen), torch.rand(T, 2, generator=gen)
    outs = []
    for switch in ("1", "0"):
        monkeypatch.setenv("KERNELSLOT_NATIVE_HUGEPAGES", switch)
        prep = prepare_native_experts(w)
        if switch == "1" and LINUX_MADVISE:
            assert prep.gate_up_tiles.numel() >= MIN_HUGE_BYTES and prep.gate_up_tiles.data_ptr() % HUGE_PAGE == 0
        out = torch.zeros(T, H)
        expert_mlp_native(x, ids, wts, prep, ExpertActivation("silu"), True, fmt == "mxfp4", out, num_threads=2)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
