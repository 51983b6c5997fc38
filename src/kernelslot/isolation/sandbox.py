"""The sandbox candidate code runs in (docs/threat-model.md): found and started by the referee.

Modes, best first (:func:`current` picks one once per process; ``KERNELSLOT_SANDBOX`` or
``kernelslot verify --sandbox`` forces one):

``bwrap``
    bubblewrap (the sandbox Flatpak uses): a read-only view of the whole file system, a private
    scratch directory mounted as ``/tmp`` (also the working directory and ``$HOME``), a private
    ``/dev`` and ``/dev/shm``, its own user, PID, IPC, UTS and cgroup namespaces, no network
    (only a private loopback), no capabilities, ``no_new_privs``, the seccomp filter of
    :mod:`kernelslot.isolation.seccomp`, and it dies with the referee.
``unshare``
    util-linux ``unshare``: the same namespaces; the confined process itself then makes every
    mount read-only except the scratch (``/tmp``) and a private ``/dev/shm``, and loads the
    seccomp filter (:func:`confine`), before any candidate code runs.
``none``
    no namespaces: only the seccomp filter. Said once on stderr; ``--require-sandbox``
    makes it a bad-input error instead.

API for whoever starts candidate processes: ``current().popen(argv, scratch_dir=...,
network=..., pass_fds=..., env=...)`` starts ``argv`` inside the sandbox, and the child
calls :func:`confine` (with the mode and the scratch path it was given) before it runs
candidate code. Without ``network`` the process gets a network namespace of its own with
nothing in it; the rank processes of one collective process group pass the same
:class:`~kernelslot.isolation.netns.GroupNetwork` and share its private loopback
(``Sandbox.group_netns`` says whether that works here; else they keep the host's network).

Tensors reach sandboxed processes as file descriptors passed over their socket (the private
``/dev/shm`` hides the referee's shared-memory names).
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Sequence

from kernelslot.isolation import netns, seccomp

__all__ = ["Sandbox", "SandboxUnavailable", "MODES", "current", "confine", "neutral_env"]

MODES = ("bwrap", "unshare", "none")
SCRATCH = "/tmp"  # where the scratch directory appears inside bwrap/unshare sandboxes


class SandboxUnavailable(RuntimeError):
    """The sandbox asked for (``--require-sandbox``, ``--sandbox MODE``) cannot run here."""


@dataclasses.dataclass(frozen=True)
class Sandbox:
    mode: str  # one of MODES
    tool: str | None  # the launcher's path (bwrap / unshare)
    note: str = ""  # why this mode: what was missing for the better ones
    group_netns: bool = False  # a collective's ranks can share one private network namespace (netns.probe)

    @property
    def isolated(self) -> bool:
        return self.mode != "none"

    def describe(self) -> str:
        """One line for report headers and receipts."""
        net = ("no network (collective ranks: one private loopback per process group)" if self.group_netns
               else "no network (collective ranks: the host's network)")
        what = {"bwrap": f"bubblewrap: read-only root, private /tmp scratch, {net}, own PID namespace, seccomp",
                "unshare": f"unshare: read-only mounts, private /tmp scratch, {net}, own PID namespace, seccomp",
                "none": "none: seccomp only; candidate code has the referee's file and network access"}[self.mode]
        return what + (f" ({self.note})" if self.note else "")

    def command(self, argv: Sequence[str], *, scratch_dir: str, own_net: bool = True,
                seccomp_fd: int | None = None, visible: Sequence[str] = ()) -> list[str]:
        """``argv`` wrapped in this sandbox's launcher (``own_net``: a new, empty network namespace,
        else the launcher's own, i.e. a joined :class:`~kernelslot.isolation.netns.GroupNetwork`;
        ``seccomp_fd``: bwrap reads the filter from it; ``visible``: paths under ``/tmp`` to show
        read-only at their own place, e.g. a bundle there)."""
        if self.mode == "bwrap":
            cmd = [self.tool, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/dev/shm",
                   "--bind", scratch_dir, SCRATCH, "--chdir", SCRATCH,
                   "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                   *(["--unshare-net"] if own_net else []),
                   "--die-with-parent", "--new-session", "--as-pid-1", "--cap-drop", "ALL", "--hostname", "localhost"]
            for path in with_interpreter_paths(visible):
                cmd += ["--ro-bind", path, path]
            for dev in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri")):
                cmd += ["--dev-bind", dev, dev]  # the GPU stays usable (it is not isolated: see the threat model)
            if seccomp_fd is not None:
                cmd += ["--seccomp", str(seccomp_fd)]
            return [*cmd, "--", *argv]
        if self.mode == "unshare":
            return [self.tool, "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
                    "--ipc", "--uts", *(["--net"] if own_net else []), "--", *argv]
        return list(argv)

    def popen(self, argv: Sequence[str], *, scratch_dir: str, network: netns.GroupNetwork | None = None,
              pass_fds: Sequence[int] = (), env: dict[str, str] | None = None, visible: Sequence[str] = (),
              **kwargs) -> subprocess.Popen:
        """Start ``argv`` in the sandbox (cwd: the scratch directory; ``env`` defaults to :func:`neutral_env`),
        in ``network`` when given (the launcher joins it before it starts), else in no network at all.

        In ``unshare`` mode the child must pass the same ``visible`` to :func:`confine`."""
        if network is not None and not self.isolated:
            raise ValueError("a group network needs a sandbox mode with namespaces (bwrap or unshare)")
        seccomp_fd = None
        if self.mode == "bwrap" and (prog := seccomp.program()) is not None:
            seccomp_fd = os.memfd_create("filter", 0)  # a fresh description per launch: bwrap reads it to EOF
            os.write(seccomp_fd, prog)
            os.lseek(seccomp_fd, 0, os.SEEK_SET)
        try:
            cmd = self.command(argv, scratch_dir=scratch_dir, own_net=network is None, seccomp_fd=seccomp_fd,
                               visible=visible)
            fds = (*pass_fds, *([seccomp_fd] if seccomp_fd is not None else []))
            return subprocess.Popen(cmd, pass_fds=fds, cwd=scratch_dir, env=env if env is not None else neutral_env(self, scratch_dir),
                                    preexec_fn=network.enter if network is not None else None, **kwargs)
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)

    def home(self, scratch_dir: str) -> str:
        """The scratch directory as the sandboxed process sees it."""
        return SCRATCH if self.isolated else scratch_dir


def neutral_env(box: Sandbox, scratch_dir: str) -> dict[str, str]:
    """An environment that says nothing about the referee: the standard PATH, locale, the scratch as
    HOME/TMPDIR, and the few settings a kernel legitimately reads (devices, thread counts, compiler)."""
    home = box.home(scratch_dir)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": home, "TMPDIR": home,
           "LANG": os.environ.get("LANG", "C.UTF-8")}
    for name in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CC", "LD_LIBRARY_PATH"):
        if name in os.environ:
            env[name] = os.environ[name]
    from kernelslot.kernels.native.build import cache_root

    cache = cache_root()
    if cache.parts[-2:] == ("kernelslot", "native"):  # the built-in kernels' library cache, read-only inside
        env["XDG_CACHE_HOME"] = str(cache.parents[1])
    return env


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _probe(mode: str) -> tuple[Sandbox | None, str]:
    tool = shutil.which("bwrap" if mode == "bwrap" else "unshare") if mode != "none" else None
    if mode == "none":
        return Sandbox("none", None), ""
    if tool is None:
        return None, f"{'bwrap' if mode == 'bwrap' else 'unshare'} is not installed"
    box = Sandbox(mode, tool)
    scratch = os.path.realpath(os.environ.get("TMPDIR", "/tmp"))
    if not _works(box.command(["true"], scratch_dir=scratch)):
        return None, f"{tool} cannot create namespaces here (unprivileged user namespaces disabled?)"
    return box, ""


@functools.lru_cache(maxsize=None)
def select(mode: str = "auto") -> Sandbox:
    """The sandbox for ``mode`` (``auto``: the best that works here); raises SandboxUnavailable."""
    if mode not in ("auto", *MODES):
        raise SandboxUnavailable(f"unknown sandbox mode {mode!r}; choose one of auto, {', '.join(MODES)}")
    if mode != "auto":
        box, why = _probe(mode)
        if box is None:
            raise SandboxUnavailable(f"sandbox {mode!r} is not available: {why}")
        return _with_group_netns(box)
    missing = []
    for candidate in ("bwrap", "unshare"):
        box, why = _probe(candidate)
        if box is not None:
            return _with_group_netns(dataclasses.replace(box, note="; ".join(missing)))
        missing.append(why)
    return Sandbox("none", None, "; ".join(missing))


def _with_group_netns(box: Sandbox) -> Sandbox:
    if not box.isolated:
        return box
    why = netns.probe()
    if not why:
        return dataclasses.replace(box, group_netns=True)
    note = f"collective ranks keep the host's network: no private network namespace ({why})"
    return dataclasses.replace(box, note="; ".join(filter(None, (box.note, note))))


_warned = False


def current(mode: str | None = None, *, require: bool = False) -> Sandbox:
    """The sandbox in force (``mode`` or ``$KERNELSLOT_SANDBOX`` or ``auto``); says once when there is none.

    ``require``: no sandbox is an error (:class:`SandboxUnavailable`) instead of a warning.
    """
    global _warned
    box = select(mode or os.environ.get("KERNELSLOT_SANDBOX") or "auto")
    if not box.isolated:
        if require:
            raise SandboxUnavailable(f"no sandbox is available ({box.note or 'sandbox none was chosen'}); install bubblewrap "
                                     "(apt-get install bubblewrap) or allow unprivileged user namespaces")
        if not _warned:
            _warned = True
            print(f"kernelslot: warning: candidate code runs WITHOUT a sandbox ({box.note or 'sandbox none was chosen'}); "
                  "it can read and write your files and reach the network. Install bubblewrap "
                  "(apt-get install bubblewrap); --require-sandbox refuses to run without one.", file=sys.stderr)
    return box


# -- inside the sandboxed process ---------------------------------------------------------------
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 8, 32, 4096, 16384
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME, _MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
_LOCKED = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": _MS_NOATIME,
           "nodiratime": _MS_NODIRATIME, "relatime": _MS_RELATIME, "strictatime": _MS_STRICTATIME}


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _under_tmp(path: str) -> bool:
    tmp = os.path.realpath(tempfile.gettempdir())
    return any((path + "/").startswith(root + "/") for root in {SCRATCH, tmp})


def with_interpreter_paths(visible: Sequence[str]) -> list[str]:
    """``visible`` plus what this interpreter runs from that lives under ``/tmp`` (a checkout or a
    virtual environment there: ``sys.prefix``, the executable's directory, ``sys.path``), which
    the sandbox's private ``/tmp`` would otherwise hide; nested paths are collapsed. Read-only."""
    wanted = {os.path.realpath(p) for p in visible}
    for p in (sys.prefix, sys.exec_prefix, os.path.dirname(sys.executable), *sys.path):
        if p:
            # the venv's own path, not its target: bin/python there is a link into /usr
            for q in {os.path.abspath(p), os.path.realpath(p)}:
                if _under_tmp(q) and os.path.exists(q) and q not in (SCRATCH, os.path.realpath(tempfile.gettempdir())):
                    wanted.add(q)
    kept: list[str] = []
    for path in sorted(wanted, key=len):
        if not any((path + "/").startswith(k + "/") for k in kept):
            kept.append(path)
    return sorted(kept)


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape") if "\\" in path else path


def _lock_filesystem(scratch_dir: str, visible: Sequence[str]) -> None:
    """unshare mode: scratch on /tmp (``visible`` paths shown again), a private /dev/shm, every other mount read-only."""
    libc = ctypes.CDLL(None, use_errno=True)
    _mount(libc, "tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV)
    held = [(path, os.open(path, os.O_PATH)) for path in visible]  # reachable after /tmp is covered
    _mount(libc, scratch_dir, SCRATCH, None, _MS_BIND | _MS_REC)
    for path, fd in held:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "a").close()
        _mount(libc, f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
        os.close(fd)
    with open("/proc/self/mountinfo") as f:
        mounts = [(_unescape(line.split()[4]), line.split()[5].split(",")) for line in f]
    for target, opts in mounts:
        shown = any((target + "/").startswith(v + "/") for v in visible)  # read-only like the rest
        if target in (SCRATCH, "/dev/shm") or target.startswith("/proc") or (target.startswith(SCRATCH + "/") and not shown):
            continue
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | sum(_LOCKED.get(o, 0) for o in opts)
        try:
            _mount(libc, None, target, None, flags)
        except OSError:
            if not target.startswith(("/sys", "/dev")):
                raise
    os.chdir(SCRATCH)


def _drop_capabilities() -> None:
    """unshare mode: give up the capabilities the user namespace granted (bwrap does this itself), so
    no process of the sandbox can open another's /proc/PID/mem or remount anything."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        if libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # PR_CAPBSET_DROP; EINVAL past the last cap
            break
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all empty
    if libc.capset(header, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")


def confine(mode: str, scratch_dir: str, visible: Sequence[str] = ()) -> None:
    """Called first thing in a sandboxed process, before candidate code: finish what its launcher could not."""
    if mode == "unshare":
        _lock_filesystem(scratch_dir, with_interpreter_paths(visible))
        _drop_capabilities()
    if mode != "bwrap":  # bubblewrap loaded the filter before exec
        seccomp.install()
