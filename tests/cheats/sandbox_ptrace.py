"""Sandbox cheat: attach to its parent and every process it sees with ptrace, write their memory
through ``/proc/PID/mem`` and ``process_vm_writev`` (how one would patch the referee's
comparator in memory); compute a wrong answer when any of it succeeded (it must pass).
It writes back the bytes it read, so even a broken sandbox leaves the target unchanged.
Run only by tests/isolation/test_sandbox_attacks.py.
"""
import ctypes
import os

import torch

SLOT = "activation.silu_and_mul"
SANDBOX_VERDICT = ("pass", None)
_libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_DETACH = 16, 17


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _first_mapping(pid):
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            lo = int(line.split("-")[0], 16)
            if "rw" in line.split()[1]:
                return lo
    return None


def broke_in() -> bool:
    if os.getpid() > 64:  # safety interlock: outside a fresh PID namespace this would attach to the host's processes
        return False
    pids = {os.getppid()} | {int(n) for n in os.listdir("/proc") if n.isdigit()}
    pids.discard(os.getpid())
    for pid in pids:
        if _libc.ptrace(PTRACE_ATTACH, pid, None, None) == 0:
            _libc.ptrace(PTRACE_DETACH, pid, None, None)
            return True
        try:
            addr = _first_mapping(pid)
            with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
                mem.seek(addr)
                data = mem.read(8)
                mem.seek(addr)
                mem.write(data)
                return True
        except (OSError, TypeError, ValueError):
            pass
        try:
            addr = _first_mapping(pid)
        except OSError:
            addr = None
        if addr is not None:
            buf = ctypes.create_string_buffer(8)
            local, remote = _IoVec(ctypes.cast(buf, ctypes.c_void_p), 8), _IoVec(addr, 8)
            if _libc.syscall(270 if os.uname().machine == "aarch64" else 310, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) == 8:  # process_vm_readv
                return True
    return False


_AT_IMPORT = broke_in()


def entry(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    if _AT_IMPORT or broke_in():
        out.zero_()
