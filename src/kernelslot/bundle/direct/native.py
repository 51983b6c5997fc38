"""``native.elf.v1``: a sealed CPU shared object, admitted and launched through ctypes.

Admission reads the verified bytes of the seal once, inspects them (:mod:`.elf`), and loads
*those bytes*: they are copied into a sealed memfd (no write, grow or shrink possible) and
``dlopen``\\ ed from it, so inspection and execution refer to the same object and no later
change to the file on disk reaches the process. An object that runs more load-time
constructors than the fixed toolchain's own is rejected before it is loaded (a constructor
is candidate host code outside the declared lifecycle). Each launch is one call of the admitted
function pointer on the calling thread, with arguments typed from their bindings.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import struct
from typing import Any

from kernelslot.bundle.direct.admit import AdmissionError, admit_native_bytes
from kernelslot.bundle.direct.seal import Seal
from kernelslot.bundle.direct.spec import Binding, DirectOp, Launch

_CTYPES = {"i8": ctypes.c_int8, "u8": ctypes.c_uint8, "i16": ctypes.c_int16, "u16": ctypes.c_uint16,
           "i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64,
           "f32": ctypes.c_float, "f64": ctypes.c_double, "ptr": ctypes.c_void_p}
_FAST_DIVMOD = (("divisor", "i32", 0), ("multiplier", "u32", 4), ("shift_right", "u32", 8))


def _struct_type(b: Binding) -> type[ctypes.Structure]:
    """A ctypes struct with the declared fields at their offsets (padding as bytes): passed by value."""
    layout = [(f"f{n}", f.type, f.offset) for n, f in enumerate(b.fields)] if b.kind == "packed_struct" else list(_FAST_DIVMOD)
    size = b.width
    fields, at = [], 0
    for name, typ, off in sorted(layout, key=lambda t: t[2]):
        if off > at:
            fields.append((f"_pad{at}", ctypes.c_uint8 * (off - at)))
        fields.append((name, _CTYPES[typ]))
        at = off + ctypes.sizeof(_CTYPES[typ])
    if at < size:
        fields.append((f"_pad{at}", ctypes.c_uint8 * (size - at)))
    cls = type("PackedStruct", (ctypes.Structure,), {"_fields_": fields})
    if ctypes.sizeof(cls) != size:
        raise AdmissionError(f"a packed_struct of {size} bytes has a natural C size of {ctypes.sizeof(cls)}; "
                             "declare the size the C struct really has")
    return cls


def _argtype(b: Binding) -> Any:
    if b.kind == "pointer":
        return ctypes.c_void_p
    if b.kind == "scalar":
        return _CTYPES[b.type or ""]
    return _struct_type(b)


class NativeArtifact:
    """The admitted shared object of one seal; :meth:`launch` calls one launch of the plan."""

    names_stable = True

    def __init__(self, op: DirectOp, seal: Seal):
        bound = admit_native_bytes(op, seal.artifact, seal.index.get("baseline", {}))
        self._fd = os.memfd_create("kernelslot-sealed-artifact", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        os.write(self._fd, seal.artifact)
        fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
        try:
            self._lib = ctypes.CDLL(f"/proc/self/fd/{self._fd}", mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as exc:
            raise AdmissionError(f"the sealed object does not load ({exc})") from None
        self.kernels = {name: ctypes.cast(getattr(self._lib, phys.name), ctypes.c_void_p).value
                        for name, phys in bound.items()}
        self.physical = {name: phys.name for name, phys in bound.items()}
        self._calls: dict[tuple[int, int], Any] = {}
        for e in op.exports:
            for j, ln in enumerate(e.launches):
                types = [_argtype(e.bindings[p]) for p in ln.params]
                self._calls[(e.index, j)] = (ctypes.CFUNCTYPE(None, *types)(self.kernels[ln.kernel]), types)

    def launch(self, export: int, ordinal: int, ln: Launch, values: list[Any], _ctx: Any = None) -> None:
        fn, types = self._calls[(export, ordinal)]
        args = [t.from_buffer_copy(v) if isinstance(v, (bytes, bytearray)) else v for t, v in zip(types, values)]
        fn(*args)

    def synchronize(self) -> None:
        """Host calls are synchronous."""


def fast_divmod(divisor: int) -> bytes:
    """The 12-byte CUTLASS/CuTe FastDivmod form ``{int32 divisor; uint32 multiplier; uint32 shift_right}``:
    for ``n >= 0``, ``n // divisor == (n * multiplier >> 32) >> shift_right`` (``multiplier = 0``: divisor 1)."""
    if not 1 <= divisor < 1 << 31:
        raise ValueError(f"fast_divmod divisor {divisor} is outside [1, 2**31)")
    if divisor == 1:
        return struct.pack("<iII", divisor, 0, 0)
    p = 31 + (divisor - 1).bit_length()  # 31 + ceil(log2(divisor))
    multiplier = ((1 << p) + divisor - 1) // divisor
    return struct.pack("<iII", divisor, multiplier & 0xFFFFFFFF, p - 32)
