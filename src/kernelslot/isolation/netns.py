"""One private network namespace for the rank processes of one collective process group.

A :class:`GroupNetwork` starts a small *holder* process (a bare interpreter, no torch, no
kernelslot, never candidate code) that makes a new user namespace (mapping only the caller's
uid and gid to themselves) and a new network namespace owned by it, brings its loopback up, and
hands the referee descriptors of both namespaces. Every rank's sandbox launcher then joins them
(:meth:`GroupNetwork.enter`, a ``preexec_fn``: ``setns`` user, then net, in the forked child
before it execs ``bwrap``/``unshare``), so all ranks of the group share that one namespace:
``127.0.0.1`` is theirs alone, and nothing else is reachable — not the host's loopback, its
interfaces or its abstract Unix sockets, nor another group's namespace. The rank sandboxes add
their own nested user, PID, mount and IPC namespaces on top, as single-device workers do.

Needs only unprivileged user namespaces (what ``bwrap``/``unshare`` need anyway); :func:`probe`
says whether they work here. The holder exits when the referee closes its channel or dies.
"""
from __future__ import annotations

import ctypes
import functools
import os
import socket
import subprocess
import sys

__all__ = ["GroupNetwork", "NetworkUnavailable", "probe"]

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000

# Run as `python -I -S -c HOLDER FD`: the namespaces, loopback up, then the descriptors to the
# referee over FD, then wait for the referee to go away.
HOLDER = r"""
import ctypes, fcntl, os, socket, struct, sys
ch = socket.socket(fileno=int(sys.argv[1]))
try:
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(0x10000000 | 0x40000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER|CLONE_NEWNET): " + os.strerror(ctypes.get_errno()))
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # SIOCGIFFLAGS / SIOCSIFFLAGS: lo up
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))
    fds = [os.open(f"/proc/self/ns/{ns}", os.O_RDONLY) for ns in ("user", "net")]
    socket.send_fds(ch, [b"ok"], fds)
except Exception as exc:
    ch.sendall(("error: " + str(exc)).encode()[:4000])
    sys.exit(1)
ch.recv(1)
"""


class NetworkUnavailable(RuntimeError):
    """A private network namespace cannot be made here (the message says why)."""


class GroupNetwork:
    """A private, loopback-only network namespace; ranks join it through :meth:`enter`. Always :meth:`close`."""

    def __init__(self, timeout_s: float = 30.0):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.holder = subprocess.Popen([sys.executable, "-I", "-S", "-c", HOLDER, str(theirs.fileno())],
                                           pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            theirs.close()
        self._chan = ours
        ours.settimeout(timeout_s)
        try:
            msg, fds, _, _ = socket.recv_fds(ours, 4096, 2)
        except OSError as exc:
            msg, fds = f"error: no answer from the namespace holder ({exc})".encode(), []
        if msg != b"ok" or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            self.close()
            raise NetworkUnavailable(msg.decode(errors="replace").removeprefix("error: ") or "the holder exited")
        self.user_fd, self.net_fd = fds
        self._setns = _libc().setns  # resolved here: the child only calls it

    def enter(self) -> None:
        """``preexec_fn`` of a rank's launcher: join the user namespace, then the network namespace."""
        for fd, kind in ((self.user_fd, CLONE_NEWUSER), (self.net_fd, CLONE_NEWNET)):
            if self._setns(fd, kind) != 0:
                os.write(2, b"kernelslot: cannot join the process group's network namespace\n")
                os._exit(126)

    def close(self) -> None:
        """Let the holder go; the namespace ends with the last rank in it."""
        for fd in (getattr(self, "user_fd", -1), getattr(self, "net_fd", -1)):
            if fd >= 0:
                os.close(fd)
        self.user_fd = self.net_fd = -1
        self._chan.close()
        try:
            self.holder.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.holder.kill()
            self.holder.wait()


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@functools.lru_cache(maxsize=1)
def probe() -> str:
    """'' when a private group network can be made here, else why not (once per process)."""
    try:
        GroupNetwork(timeout_s=30.0).close()
    except (NetworkUnavailable, OSError) as exc:
        return str(exc)
    return ""
