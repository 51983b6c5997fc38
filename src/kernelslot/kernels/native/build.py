"""Compile-on-first-use and loading of the native CPU library (ctypes, no torch extension).

The C sources beside this file are compiled with the system C compiler (``$CC``, else
``gcc``, else ``cc``) into ``<cache>/<hash>/libks_native.so``; ``<cache>`` is
``$KERNELSLOT_NATIVE_CACHE`` or ``$XDG_CACHE_HOME/kernelslot/native`` (default
``~/.cache/kernelslot/native``) and ``<hash>`` covers the sources, the flags and the compiler's
version, so an edit or a different compiler builds a fresh library. Each build happens in a
private temporary directory and the finished library is moved into place with an atomic
rename, so concurrent processes never load a half-written file.

Integrity: the build records the library's SHA-256 beside it (``libks_native.so.sha256``).
Every load reads the library once, checks those bytes against the record, and loads exactly
those bytes (from an anonymous memory file, so nothing can swap the file between the check and
``dlopen``); a library that does not match its record, or has none, is rebuilt, never loaded.
:func:`loaded_sha256` is the hash of what was loaded, for receipts.

Environment: ``KERNELSLOT_NATIVE=0`` turns the fast path off; ``KERNELSLOT_NATIVE_ISA`` =
``portable`` | ``avx2`` | ``avx512`` | ``avx512bf16`` forces the default instruction set (it must be supported
by the CPU); ``KERNELSLOT_NATIVE_VNNI_MX=0`` keeps the AVX-512 variants off the VNNI integer MX path
of MXFP4 (read per call); ``KERNELSLOT_NATIVE_MXFP8_SCALAR=1`` runs the scalar MXFP8 quantiser
instead of its AVX2 / AVX-512 version (same bits; read per call); ``KERNELSLOT_NATIVE_BF16_MX`` / ``KERNELSLOT_NATIVE_FP8_REBIAS`` = 1 | 0
force the per-vendor choices of docs/native.md, "Instruction sets"; ``KERNELSLOT_NATIVE_HUGEPAGES=0`` prepares the
weights on plain torch memory instead of memory advised for transparent huge pages (``memory.py``). If anything fails the package keeps working on its torch paths and warns once.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

ISA_NAMES = ("portable", "avx2", "avx512", "avx512bf16")
_SRC_DIR = Path(__file__).resolve().parent
_SOURCES = ("ks_native.h", "ks_kernels.c", "ks_native.c", "ks_pool.c", "ks_fp4_avx2.c", "ks_mxint_avx2.c", "ks_fp8_avx2.c",
            "ks_mxint_avx512.c", "ks_mxfp8_avx2.c", "ks_mxfp8_avx512.c",
            "ks_block.c", "ks_probe.c")
_COMMON = ["-O3", "-fPIC", "-std=gnu11", "-fno-strict-aliasing", "-fvisibility=default"]
_X86_FLAGS = {
    0: [],
    1: ["-mavx2", "-mfma", "-mf16c"],
    2: ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
}
_X86_FLAGS[3] = [*_X86_FLAGS[2], "-mavx512bf16"]


@dataclass(frozen=True)
class _Loaded:
    lib: ctypes.CDLL | None
    isa: str
    reason: str
    sha256: str | None = None  # of the library bytes loaded


_lock = threading.Lock()
_state: _Loaded | None = None


def cache_root() -> Path:
    if os.environ.get("KERNELSLOT_NATIVE_CACHE"):
        return Path(os.environ["KERNELSLOT_NATIVE_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "kernelslot" / "native"


def _compiler() -> str | None:
    for cand in (os.environ.get("CC"), "gcc", "cc"):
        if cand and shutil.which(cand):
            return cand
    return None


def _objects(x86: bool) -> list[tuple[str, list[str]]]:
    """(source, extra flags) of every object in the library."""
    objs = [("ks_native.c", []), ("ks_pool.c", []), ("ks_block.c", []), ("ks_probe.c", []),
            ("ks_kernels.c", ["-DKS_ISA=0"])]
    if x86:
        objs += [("ks_fp4_avx2.c", _X86_FLAGS[1]), ("ks_mxint_avx2.c", _X86_FLAGS[1]), ("ks_fp8_avx2.c", _X86_FLAGS[1]),
                 ("ks_mxfp8_avx2.c", _X86_FLAGS[1]), ("ks_mxfp8_avx512.c", _X86_FLAGS[2]),
                 ("ks_mxint_avx512.c", [*_X86_FLAGS[2], "-mavx512vnni"]),
                 ("ks_kernels.c", ["-DKS_ISA=1", *_X86_FLAGS[1]]),
                 ("ks_kernels.c", ["-DKS_ISA=2", *_X86_FLAGS[2]]),
                 ("ks_kernels.c", ["-DKS_ISA=3", *_X86_FLAGS[3]])]
    return objs


_DIGEST = "libks_native.so.sha256"


def _verified(target: Path) -> tuple[bytes, str] | None:
    """The library's bytes and hash when they match the hash recorded at build time, else None."""
    try:
        data = target.read_bytes()
        recorded = (target.parent / _DIGEST).read_text().strip()
    except OSError:
        return None
    sha = hashlib.sha256(data).hexdigest()
    return (data, sha) if sha == recorded else None


def _compile(cc: str) -> tuple[bytes, str]:
    """The verified library (bytes, sha256), built first when missing or not matching its record."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update(name.encode() + b"\0" + (_SRC_DIR / name).read_bytes())
    digest.update(repr((_COMMON, _objects(x86), version, platform.machine())).encode())
    target_dir = cache_root() / digest.hexdigest()[:20]
    target = target_dir / "libks_native.so"
    if target.exists() and (good := _verified(target)) is not None:
        return good
    target_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target_dir, prefix="build-") as tmp:
        objs = []
        for i, (src, flags) in enumerate(_objects(x86)):
            obj = os.path.join(tmp, f"o{i}.o")
            cmd = [cc, *_COMMON, *flags, "-c", str(_SRC_DIR / src), "-o", obj]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if res.returncode != 0:
                raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{res.stderr.strip()[-2000:]}")
            objs.append(obj)
        lib_tmp = os.path.join(tmp, "libks_native.so")
        cmd = [cc, "-shared", *objs, "-o", lib_tmp, "-lpthread", "-lm"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{res.stderr.strip()[-2000:]}")
        data = Path(lib_tmp).read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        Path(tmp, _DIGEST).write_text(sha + "\n")
        os.replace(lib_tmp, target)  # atomic: a concurrent builder's identical file is fine
        os.replace(os.path.join(tmp, _DIGEST), target_dir / _DIGEST)
    return data, sha


def _dlopen(data: bytes) -> ctypes.CDLL:
    """Load exactly ``data`` (a verified library) from an anonymous memory file."""
    fd = os.memfd_create("libks_native.so", 0)  # kept open: the library stays mapped from it
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return ctypes.CDLL(f"/proc/self/fd/{fd}")


def _declare(lib: ctypes.CDLL) -> None:
    c_int, c_i64, vp = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    lib.ks_moe_experts.restype = c_int
    lib.ks_moe_experts.argtypes = [vp, vp, vp, c_i64, vp, vp, c_i64, c_int, c_int, vp, c_int, c_int]
    lib.ks_moe_block.restype = c_int
    lib.ks_moe_block.argtypes = [vp, vp, vp, c_i64, c_int, ctypes.c_float, vp, vp, vp, c_int, c_int]
    lib.ks_mxfp8_quantize.restype = c_int
    lib.ks_mxfp8_quantize.argtypes = [vp, c_i64, c_i64, vp, vp]
    lib.ks_mxfp8_rows_hook.restype = c_int
    lib.ks_mxfp8_rows_hook.argtypes = [c_int, vp, c_i64, vp, vp, vp, vp, vp, vp, vp, vp, c_int]
    lib.ks_read_bandwidth_probe.restype = ctypes.c_double
    lib.ks_read_bandwidth_probe.argtypes = [vp, c_i64, c_int, c_int]
    lib.ks_probe_read.restype = c_int
    lib.ks_probe_read.argtypes = [vp, c_i64, c_int, c_int, c_int, c_int, ctypes.POINTER(ctypes.c_uint64),
                                  ctypes.POINTER(ctypes.c_double)]
    lib.ks_probe_width_supported.restype = c_int
    lib.ks_probe_width_supported.argtypes = [c_int]
    lib.ks_probe_alloc.restype = vp
    lib.ks_probe_alloc.argtypes = [c_i64, c_int]
    lib.ks_probe_free.restype = None
    lib.ks_probe_free.argtypes = [vp]
    lib.ks_repack_matrix.restype = c_int
    lib.ks_repack_matrix.argtypes = [c_int, vp, c_i64, vp, c_i64, c_i64, c_i64, vp, vp, c_i64]
    lib.ks_pool_warm.restype = None
    lib.ks_pool_warm.argtypes = [c_int]
    lib.ks_isa_supported.restype = c_int
    lib.ks_isa_supported.argtypes = [c_int]
    lib.ks_best_isa.restype = c_int
    lib.ks_best_isa.argtypes = []
    for feature in (lib.ks_vnni_supported, lib.ks_vbmi_supported):
        feature.restype = c_int
        feature.argtypes = []


def switched_off(name: str) -> bool:
    """Whether the environment switch ``name`` is set to 0 / off / false / no (unset: on)."""
    return os.environ.get(name, "1").strip().lower() in ("0", "off", "false", "no")


def _load() -> _Loaded:
    if switched_off("KERNELSLOT_NATIVE"):
        return _Loaded(None, "none", "disabled by KERNELSLOT_NATIVE=0")
    cc = _compiler()
    if cc is None:
        return _Loaded(None, "none", "no C compiler found ($CC, gcc, cc)")
    try:
        data, sha = _compile(cc)
        lib = _dlopen(data)
        _declare(lib)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return _Loaded(None, "none", f"native build/load failed: {exc}")
    isa = ISA_NAMES[lib.ks_best_isa()]
    forced = os.environ.get("KERNELSLOT_NATIVE_ISA", "").strip().lower()
    if forced:
        if forced not in ISA_NAMES or not lib.ks_isa_supported(ISA_NAMES.index(forced)):
            return _Loaded(None, "none", f"KERNELSLOT_NATIVE_ISA={forced!r} is not one of the "
                           f"ISAs this CPU supports (best: {isa!r}; names: {ISA_NAMES})")
        isa = forced
    return _Loaded(lib, isa, "ok", sha)


def loaded_sha256() -> str | None:
    """SHA-256 of the library this process loaded; None when it has not loaded one (nothing is built here)."""
    return _state.sha256 if _state is not None else None


def loaded() -> _Loaded:
    """The library (built and loaded on first call); warns once when it is unavailable."""
    global _state
    with _lock:
        if _state is None:
            _state = _load()
            if _state.lib is None:
                warnings.warn(f"kernelslot native CPU fast path is off ({_state.reason}); "
                              "using the torch path", RuntimeWarning, stacklevel=3)
    return _state


def vnni_supported() -> bool:
    """Whether the AVX-512 variants can run the VNNI integer MX path of MXFP4 (the CPU has AVX512_VNNI)."""
    st = loaded()
    return st.lib is not None and bool(st.lib.ks_vnni_supported())


def vbmi_supported() -> bool:
    """Whether avx512bf16 can run MXFP8 weights on the bf16 MX path (the CPU has AVX512_VBMI)."""
    st = loaded()
    return st.lib is not None and bool(st.lib.ks_vbmi_supported())


def isa_supported(isa: str) -> bool:
    """Whether the loaded library can run ``isa`` on this CPU."""
    st = loaded()
    return st.lib is not None and isa in ISA_NAMES and bool(st.lib.ks_isa_supported(ISA_NAMES.index(isa)))
