"""Building and loading: the cache, the forced-ISA switch, and the fallback when no compiler
exists (the package keeps working on its torch path and warns once)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kernelslot.kernels import native
from kernelslot.kernels.native import build

_PROBE = """
import warnings, torch
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from kernelslot.kernels.native import native_status
    from kernelslot.kernels.moe_block import prepare_fused_experts, selective_experts, ExpertActivation, ScalingMode
    w = prepare_fused_experts(torch.randn(2, 64, 32), torch.randn(2, 32, 32))
    y = selective_experts(w, torch.randn(1, 32), torch.tensor([[0, 1]]), torch.ones(1, 2), ExpertActivation(),
                          ScalingMode.POST_SCALE)
    native_status(); native_status()
print(native_status()[0], native_status()[1], tuple(y.shape),
      sum("fast path is off" in str(c.message) for c in caught))
"""


def _probe(tmp_path, **env) -> list[str]:
    full = {**os.environ, "KERNELSLOT_NATIVE_CACHE": str(tmp_path / "cache"), **env}
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=full, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_no_compiler_falls_back_and_warns_once(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"PATH": str(empty), "CC": ""}
    assert _probe(tmp_path, **env) == ["False", "none", "(1,", "32)", "1"]


def test_disabled_by_environment(tmp_path):
    assert _probe(tmp_path, KERNELSLOT_NATIVE="0") == ["False", "none", "(1,", "32)", "1"]


def test_cached_library_lives_in_a_hashed_directory():
    ok, isa, reason = native.native_status()
    if not ok:
        pytest.skip(f"native path unavailable: {reason}")
    st = build.loaded()
    assert st.lib._name.startswith("/proc/self/fd/")  # loaded from the verified bytes, not by path
    cached = [p for p in build.cache_root().glob("*/libks_native.so") if build._verified(p) is not None]
    assert any(build._verified(p)[1] == st.sha256 == build.loaded_sha256() for p in cached)
    assert isa in build.ISA_NAMES and build.isa_supported(isa) and build.isa_supported("portable")


def test_forced_isa(tmp_path):
    if not native.native_status()[0]:
        pytest.skip("native path unavailable")
    cache = str(build.cache_root())  # reuse the built library
    assert _probe(tmp_path, KERNELSLOT_NATIVE_CACHE=cache, KERNELSLOT_NATIVE_ISA="portable")[:2] == ["True", "portable"]
    out = _probe(tmp_path, KERNELSLOT_NATIVE_CACHE=cache, KERNELSLOT_NATIVE_ISA="sse9")
    assert out[:2] == ["False", "none"] and out[-1] == "1"
