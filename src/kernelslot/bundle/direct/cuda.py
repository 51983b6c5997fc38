"""``cuda.cubin.v1``: a sealed CUBIN, admitted and launched through the CUDA Driver API (ctypes).

Admission (in the worker, after torch has made the device's primary context current): the
verified CUBIN bytes are loaded with ``cuLibraryLoadData``; the library's kernels are enumerated
(``cuLibraryEnumerateKernels``, names by ``cuKernelGetName``) and sorted by name, and each one's
parameter sizes are read with ``cuKernelGetParamInfo`` (driver 12.4 or newer); logical kernels
are bound by ordinal and every width must match. The admitted library handle is the one
launched (``cuLaunchKernel`` on the validator's current stream, the stream binding). Where
there is no CUDA device, no driver, or an older driver, :func:`unavailable_reason` says so and
the bundle gets the "not run" verdict; nothing here is imported or called on such a machine.
"""
from __future__ import annotations

import ctypes
from typing import Any

from kernelslot.bundle.direct.admit import AdmissionError, bind_inventory
from kernelslot.bundle.direct.elf import PhysicalKernel
from kernelslot.bundle.direct.seal import Seal
from kernelslot.bundle.direct.spec import DirectOp, Launch

MIN_DRIVER = 12040  # cuKernelGetParamInfo
_TMA_DTYPES = {"uint8": 0, "int32": 3, "int64": 5, "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
_driver: Any = None


def _lib() -> Any:
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def unavailable_reason() -> str | None:
    """Why ``cuda.cubin.v1`` cannot run here (``None``: it can)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "cuda.cubin.v1 needs a CUDA device; torch sees none here"
    except Exception as exc:  # noqa: BLE001 - a broken torch CUDA setup is "cannot run"
        return f"cuda.cubin.v1 needs CUDA; torch.cuda failed ({exc})"
    try:
        lib = _lib()
    except OSError as exc:
        return f"cuda.cubin.v1 needs the CUDA driver (libcuda.so.1 does not load: {exc})"
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value < MIN_DRIVER:
        return f"cuda.cubin.v1 needs CUDA driver {MIN_DRIVER // 1000}.{MIN_DRIVER % 1000 // 10} or newer (cuKernelGetParamInfo); this one is {version.value}"
    return None


def _check(rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        _lib().cuGetErrorName(rc, ctypes.byref(name))
        raise AdmissionError(f"{what} failed: {(name.value or b'CUDA error').decode()} ({rc})")


class CudaArtifact:
    """The admitted CUBIN of one seal, held as a CUDA library handle for its whole life."""

    names_stable = False  # physical names depend on the materialised module: bound by ordinal

    def __init__(self, op: DirectOp, seal: Seal):
        reason = unavailable_reason()
        if reason:
            raise AdmissionError(reason)
        import torch

        torch.cuda.init()
        major, minor = torch.cuda.get_device_capability()
        built = next((f.split("=", 1)[1] for f in seal.index.get("flags", []) if f.startswith("-arch=")), "")
        if built != f"sm_{major}{minor}":
            raise AdmissionError(f"the CUBIN was built for {built}, the device is sm_{major}{minor}")
        torch.empty(1, device="cuda")  # the primary context is current from here on
        lib = _lib()
        self._image = ctypes.create_string_buffer(seal.artifact, len(seal.artifact))
        self._library = ctypes.c_void_p()
        _check(lib.cuLibraryLoadData(ctypes.byref(self._library), self._image, None, None, 0, None, None, 0), "cuLibraryLoadData")
        count = ctypes.c_uint(0)
        _check(lib.cuLibraryGetKernelCount(ctypes.byref(count), self._library), "cuLibraryGetKernelCount")
        handles = (ctypes.c_void_p * count.value)()
        _check(lib.cuLibraryEnumerateKernels(handles, count, self._library), "cuLibraryEnumerateKernels")
        physical, by_name = [], {}
        for h in handles:
            name = ctypes.c_char_p()
            _check(lib.cuKernelGetName(ctypes.byref(name), ctypes.c_void_p(h)), "cuKernelGetName")
            sizes = []
            while len(sizes) < 256:
                off, size = ctypes.c_size_t(), ctypes.c_size_t()
                if lib.cuKernelGetParamInfo(ctypes.c_void_p(h), ctypes.c_size_t(len(sizes)), ctypes.byref(off),
                                            ctypes.byref(size)) != 0:
                    break
                sizes.append(size.value)
            pname = (name.value or b"").decode()
            physical.append(PhysicalKernel(pname, tuple(sizes), ()))
            by_name[pname] = h
        physical.sort(key=lambda k: k.name)
        bound = bind_inventory(op.kernels(), physical, names_stable=False)
        self.physical = {name: phys.name for name, phys in bound.items()}
        self.kernels = {}
        for name, phys in bound.items():
            fn = ctypes.c_void_p()
            _check(lib.cuKernelGetFunction(ctypes.byref(fn), ctypes.c_void_p(by_name[phys.name])), "cuKernelGetFunction")
            self.kernels[name] = fn

    def launch(self, export: int, ordinal: int, ln: Launch, values: list[Any], ctx: Any) -> None:
        """``ctx.dims(ln)`` gives (grid, block, shared bytes, stream); ``values`` are ctypes scalars or frames (bytes)."""
        grid, block, shared, stream = ctx.dims(ln)
        buffers = [ctypes.create_string_buffer(bytes(v), len(v)) if isinstance(v, (bytes, bytearray)) else v for v in values]
        params = (ctypes.c_void_p * max(len(buffers), 1))(*[ctypes.addressof(b) for b in buffers])
        dims = [ctypes.c_uint(int(d)) for d in (*grid, *block)]
        _check(_lib().cuLaunchKernel(self.kernels[ln.kernel], *dims, ctypes.c_uint(shared), ctypes.c_void_p(stream),
                                     params, None), f"cuLaunchKernel({ln.kernel})")

    def synchronize(self) -> None:
        """The worker synchronises the device after the call (asynchronous faults surface there)."""


def tma_descriptor(ptr: int, dtype: str, shape: tuple[int, ...], stride: tuple[int, ...], elsize: int, box: list[int]) -> bytes:
    """A 128-byte tiled tensor map (``cuTensorMapEncodeTiled``): dimensions and ``box`` innermost first,
    no interleave, swizzle, L2 promotion or out-of-bounds fill."""
    if dtype not in _TMA_DTYPES:
        raise ValueError(f"tma_descriptor: dtype {dtype} has no tensor-map type; allowed: {', '.join(_TMA_DTYPES)}")
    rank = len(shape)
    if len(box) != rank:
        raise ValueError(f"tma_descriptor: box has {len(box)} entries for a rank-{rank} tensor")
    dims = (ctypes.c_uint64 * rank)(*reversed(shape))
    strides = (ctypes.c_uint64 * max(rank - 1, 1))(*[stride[rank - 2 - i] * elsize for i in range(rank - 1)])
    boxes = (ctypes.c_uint32 * rank)(*box)
    ones = (ctypes.c_uint32 * rank)(*([1] * rank))
    raw = ctypes.create_string_buffer(128 + 64)  # a CUtensorMap is 64-byte aligned
    at = ctypes.addressof(raw) + (-ctypes.addressof(raw)) % 64
    _check(_lib().cuTensorMapEncodeTiled(ctypes.c_void_p(at), _TMA_DTYPES[dtype], ctypes.c_uint32(rank), ctypes.c_void_p(ptr),
                                         dims, strides, boxes, ones, 0, 0, 0, 0), "cuTensorMapEncodeTiled")
    return ctypes.string_at(at, 128)
