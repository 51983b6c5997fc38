"""What a runner observes about the arguments of a call, in the referee and in the children alike.

A tensor argument's identity is a :class:`TensorMeta` (data and storage pointers, storage size,
shape, strides, offset, dtype). A child process reports, per argument, ``"same"`` or where the
argument now points *relative to the shared storage it lies in* (:func:`argument_meta`); the
referee maps that back to its own addresses (:func:`translate_meta`), so the checks compare
identities in one address space whichever process ran the call. Return values are reported as a
short text (:func:`short_repr`), never as objects.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["TensorMeta", "storage_use_count", "bits_equal", "identity", "short_repr", "argument_meta", "translate_meta"]


@dataclass(frozen=True)
class TensorMeta:
    """Identity of a tensor argument: where its storage lives and how it is viewed."""

    data_ptr: int
    storage_ptr: int
    storage_nbytes: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: str

    def changes(self, after: "TensorMeta") -> str:
        """What differs from ``after``, named ("data pointer 0x.. -> 0x.., stride (4, 1) -> (1, 4)"); '' if nothing."""
        parts = []
        if self.storage_ptr != after.storage_ptr or self.storage_nbytes != after.storage_nbytes:
            parts.append(f"storage {self.storage_ptr:#x} ({self.storage_nbytes} B) -> {after.storage_ptr:#x} ({after.storage_nbytes} B)")
        if self.data_ptr != after.data_ptr:
            parts.append(f"data pointer {self.data_ptr:#x} -> {after.data_ptr:#x}")
        for what, a, b in (("storage offset", self.offset, after.offset), ("shape", self.shape, after.shape),
                           ("stride", self.stride, after.stride), ("dtype", self.dtype, after.dtype)):
            if a != b:
                parts.append(f"{what} {a} -> {b}")
        return ", ".join(parts)

    @staticmethod
    def of(t: torch.Tensor) -> "TensorMeta":
        s = t.untyped_storage()
        return TensorMeta(t.data_ptr(), s.data_ptr(), s.nbytes(), tuple(t.shape), tuple(t.stride()),
                          t.storage_offset(), str(t.dtype))


def storage_use_count(t: torch.Tensor) -> int:
    """How many tensors/views share ``t``'s storage (the StorageImpl reference count)."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality (NaN payloads and signed zeros included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def identity(t: torch.Tensor) -> tuple:
    """:class:`TensorMeta`'s fields as a plain tuple (cheap to compare before and after a call)."""
    s = t.untyped_storage()
    return (t.data_ptr(), s.data_ptr(), s.nbytes(), tuple(t.shape), tuple(t.stride()), t.storage_offset(), str(t.dtype))


def short_repr(value: Any) -> str:
    """A value returned by candidate code, as at most 80 characters (a hostile ``__repr__`` included)."""
    if isinstance(value, torch.Tensor):
        return f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__
        text = f"<{type(value).__name__}>"
    return text if len(text) < 80 else text[:77] + "..."


def argument_meta(n: int, tensors: list, before: dict, locate: Any, storages: dict) -> list[Any]:
    """What each of ``n`` arguments views after a call: ``"same"``, or where it now points, relative
    to the shared storage it lies in (``locate``: a storage pointer -> its key in ``storages``), for
    the referee to translate into its own addresses (``output_storage_swapped``, rebinding)."""
    meta: list[Any] = [None] * n
    for i, t in tensors:
        now = identity(t)
        if now == before[i]:
            meta[i] = "same"
            continue
        key = locate(now[1])
        base = storages[key].data_ptr() if key is not None else now[1]
        meta[i] = {"key": key, "data_delta": now[0] - base, "storage_delta": now[1] - base, "nbytes": now[2],
                   "shape": list(now[3]), "stride": list(now[4]), "offset": now[5], "dtype": now[6]}
    return meta


def translate_meta(meta: Any, arg: Any, base_of: Callable[[Any], int]) -> TensorMeta | None:
    """The referee's side of :func:`argument_meta`: a child's report on ``arg`` in referee addresses.

    ``base_of(key)`` is the referee's data pointer of the shared storage registered as ``key``
    (0 when it is not one of ours). Raises ``KeyError``/``TypeError``/``ValueError`` on a
    malformed report (the caller's protocol failure).
    """
    if not isinstance(arg, torch.Tensor):
        return None
    if meta is None or meta == "same":  # None: the call never started (load failure)
        return TensorMeta.of(arg)
    base = base_of(meta["key"])
    return TensorMeta(base + int(meta["data_delta"]), base + int(meta["storage_delta"]), int(meta["nbytes"]),
                      tuple(int(s) for s in meta["shape"]), tuple(int(s) for s in meta["stride"]),
                      int(meta["offset"]), str(meta["dtype"]))
