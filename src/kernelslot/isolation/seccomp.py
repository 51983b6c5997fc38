"""The sandbox's seccomp filter: a classic-BPF program that denies a fixed list of system calls.

:func:`program` returns the filter as the bytes of a ``struct sock_filter`` array, the form
bubblewrap reads from ``--seccomp FD``; :func:`install` loads the same program into the
calling process (``PR_SET_NO_NEW_PRIVS`` + ``PR_SET_SECCOMP``), for sandboxes that cannot take
a filter on their command line. Both are ``None``/no-ops on an architecture without a table.

What the program does, in order:

1. a call made under another ABI than the native one (32-bit ``int 0x80``, x32 numbers) kills
   the process: its numbers would not match the table;
2. every call in :data:`DENIED` fails with ``EPERM``: tracing and reading/writing other
   processes' memory (``ptrace``, ``process_vm_readv``/``writev``), mounting and changing root,
   kernel modules and ``kexec``, the kernel keyring, namespaces (``unshare``, ``setns``, and
   ``clone`` with any ``CLONE_NEW*`` flag, which would re-acquire capabilities), ``bpf``,
   ``perf_event_open``, ``userfaultfd``, ``io_uring`` (whose operations bypass this filter),
   ``reboot`` and swap;
3. ``clone3`` fails with ``ENOSYS`` (its flags live in memory a filter cannot read), so the C
   library falls back to ``clone``, whose flags are checked;
4. everything else is allowed.
"""
from __future__ import annotations

import ctypes
import errno
import platform
import struct

__all__ = ["DENIED", "program", "install", "supported"]

# name -> (x86_64 number, aarch64 number); checked against the kernel headers by the tests.
_NUMBERS = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    "unshare": (272, 97), "setns": (308, 268),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "reboot": (169, 142), "swapon": (167, 224), "swapoff": (168, 225),
}
DENIED = tuple(_NUMBERS)
_CLONE, _CLONE3 = (56, 220), (435, 435)
_ARCH = {"x86_64": (0, 0xC000003E), "amd64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7), "arm64": (1, 0xC00000B7)}
_X32_BIT = 0x40000000
# CLONE_NEWTIME | NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NEW_MASK = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# classic BPF opcodes and seccomp return values
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data (little-endian low word of args[0])


def _arch() -> tuple[int, int] | None:
    return _ARCH.get(platform.machine().lower())


def supported() -> bool:
    """Whether this architecture has a syscall table here."""
    return _arch() is not None


def program() -> bytes | None:
    """The filter as ``struct sock_filter[]`` bytes (8 bytes per instruction), or None."""
    arch = _arch()
    if arch is None:
        return None
    col, audit_arch = arch
    # Instructions as (code, jt, jf, k); a jump target given as a label string is resolved below.
    code: list[tuple[int, object, object, int]] = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ_K, 0, "kill", audit_arch),
        (_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if col == 0:
        code.append((_JGE_K, "kill", 0, _X32_BIT))
    for name in DENIED:
        code.append((_JEQ_K, "deny", 0, _NUMBERS[name][col]))
    code.append((_JEQ_K, "nosys", 0, _CLONE3[col]))
    code.append((_JEQ_K, 0, "allow", _CLONE[col]))
    code.append((_LD_W_ABS, 0, 0, _OFF_ARG0))
    code.append((_JSET_K, "deny", "allow", _CLONE_NEW_MASK))
    labels = {"allow": len(code), "deny": len(code) + 1, "nosys": len(code) + 2, "kill": len(code) + 3}
    code += [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
             (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS), (_RET_K, 0, 0, _RET_KILL_PROCESS)]

    def offset(at: int, target: object) -> int:
        if isinstance(target, int):
            return target
        jump = labels[str(target)] - at - 1
        if not 0 <= jump <= 255:
            raise AssertionError(f"seccomp: jump of {jump} instructions does not fit a classic-BPF offset")
        return jump

    return b"".join(struct.pack("<HBBI", c, offset(i, jt), offset(i, jf), k) for i, (c, jt, jf, k) in enumerate(code))


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> bool:
    """Load :func:`program` into this process (and every process it starts later); False if unsupported."""
    prog = program()
    if prog is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
    return True
