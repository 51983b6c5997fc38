"""The wire between the collective referee and its rank processes: JSON frames plus file descriptors.

Nothing on this wire is pickled, in either direction. A frame is an 8-byte big-endian length
followed by that many bytes of UTF-8 JSON (an object); shared-memory storages travel as file
descriptors attached to the frame's length header (``SCM_RIGHTS``), in the order the frame's
``"storages"`` list names them. Tensor *values* never travel: the referee owns every tensor in
shared memory and the rank maps it; the rank's replies carry only observations (JSON).

A tensor argument is described by :func:`tensor_desc`: ``{"t": key, "offset", "shape",
"stride", "dtype"}`` over a storage the receiver registered under ``key``; scalars are
``{"v": value}``; the prepared object is ``{"prepared": true}``; the group ``{"group": true}``.

:func:`recv_frame` is safe on untrusted input: a frame over ``max_bytes``, a short read, bytes
that are not JSON or JSON that is not an object raise :class:`WireError` (never run code).
"""
from __future__ import annotations

import array
import base64
import json
import socket
from typing import Any

import torch

__all__ = ["WireError", "send_frame", "recv_frame", "tensor_desc", "MAX_FRAME_BYTES", "share_storage", "map_storage"]

MAX_FRAME_BYTES = 8 << 20
_MAX_FDS = 64


class WireError(RuntimeError):
    """A malformed frame, or the peer hung up (``eof`` is True then)."""

    def __init__(self, message: str, eof: bool = False):
        super().__init__(message)
        self.eof = eof


def send_frame(sock: socket.socket, obj: dict, fds: list[int] = ()) -> None:
    """Send ``obj`` as one frame, with ``fds`` attached to its header."""
    if len(fds) > _MAX_FDS:
        raise WireError(f"at most {_MAX_FDS} storages per frame, got {len(fds)}")
    data = json.dumps(obj, separators=(",", ":")).encode()
    header = len(data).to_bytes(8, "big")
    sent = 0
    if fds:
        sent = sock.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", list(fds)))])
    sock.sendall(header[sent:] + data)


def _recv_exact(sock: socket.socket, n: int, fds: list[int] | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if fds is not None:
            data, anc, _, _ = sock.recvmsg(n - len(buf), socket.CMSG_LEN(_MAX_FDS * 4))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(payload[: len(payload) - len(payload) % a.itemsize])
                    fds.extend(a)
        else:
            data = sock.recv(n - len(buf))
        if not data:
            raise WireError("the peer closed the connection", eof=True)
        buf += data
    return bytes(buf)


def recv_frame(sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES, with_fds: bool = False) -> tuple[dict, list[int]]:
    """One frame: the decoded JSON object and the descriptors attached to it (``with_fds`` only)."""
    fds: list[int] | None = [] if with_fds else None
    size = int.from_bytes(_recv_exact(sock, 8, fds), "big")
    if size > max_bytes:
        raise WireError(f"a frame of {size} bytes exceeds the {max_bytes}-byte limit (the channel was written to "
                        "by something other than the rank's call loop?)")
    data = _recv_exact(sock, size, None)
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"a frame is not UTF-8 JSON ({exc.__class__.__name__}: {str(exc)[:80]}); the channel was "
                        "written to by something other than the rank's call loop") from None
    if not isinstance(obj, dict):
        raise WireError(f"a frame holds a JSON {type(obj).__name__}, not an object")
    return obj, fds or []


def tensor_desc(key: int, t: torch.Tensor) -> dict[str, Any]:
    return {"t": key, "offset": t.storage_offset(), "shape": list(t.shape), "stride": list(t.stride()),
            "dtype": str(t.dtype).removeprefix("torch.")}


def share_storage(storage: torch.UntypedStorage) -> tuple[dict[str, Any], int | None]:
    """Move ``storage`` into shared memory in place; returns its registration entry and fd (CPU) or None.

    CPU storages become file-descriptor-backed shared memory (the fd travels with the frame);
    CUDA storages are described by their CUDA IPC handle (base64 inside the JSON).
    """
    if storage.device.type == "cuda":
        device, handle, size, offset, ref_handle, ref_offset, event, sync = storage._share_cuda_()
        b64 = lambda b: base64.b64encode(b).decode() if isinstance(b, (bytes, bytearray)) else b  # noqa: E731
        return {"kind": "cuda", "args": [device, b64(handle), size, offset, b64(ref_handle), ref_offset, b64(event), sync],
                "nbytes": storage.nbytes()}, None
    if storage.nbytes() == 0:
        return {"kind": "empty", "nbytes": 0}, None
    fd, size = storage._share_fd_cpu_()
    return {"kind": "cpu", "nbytes": size}, fd


def map_storage(entry: dict, fd: int | None, device: torch.device) -> torch.UntypedStorage:
    """The receiver's side of :func:`share_storage`."""
    kind = entry["kind"]
    if kind == "cpu":
        return torch.UntypedStorage._new_shared_fd_cpu(fd, int(entry["nbytes"]))
    if kind == "empty":
        return torch.UntypedStorage(0, device=device)
    if kind == "cuda":
        device_index, handle, size, offset, ref_handle, ref_offset, event, sync = entry["args"]
        unb64 = lambda s: base64.b64decode(s) if isinstance(s, str) else s  # noqa: E731
        return torch.UntypedStorage._new_shared_cuda(device_index, unb64(handle), size, offset, unb64(ref_handle),
                                                     ref_offset, unb64(event), sync)
    raise WireError(f"unknown storage kind {kind!r}")
