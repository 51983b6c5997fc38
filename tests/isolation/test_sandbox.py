"""The sandbox launcher, its seccomp filter and the collective ranks' shared network (isolation/sandbox.py, seccomp.py, netns.py)."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kernelslot.isolation import netns, sandbox, seccomp

HEADERS = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "aarch64": "/usr/include/asm-generic/unistd.h"}
SRC = str(Path(sandbox.__file__).resolve().parents[2])


def _header_numbers(path: str) -> dict[str, int]:
    text = Path(path).read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\b", text)}


@pytest.mark.parametrize("arch,col", [("x86_64", 0), ("aarch64", 1)])
def test_syscall_table_matches_the_kernel_headers(arch, col):
    if not os.path.exists(HEADERS[arch]):
        pytest.skip(f"no {HEADERS[arch]}")
    numbers = _header_numbers(HEADERS[arch])
    for name, nums in {**seccomp._NUMBERS, "clone": seccomp._CLONE, "clone3": seccomp._CLONE3}.items():
        assert numbers[name] == nums[col], (arch, name)


_PROBE = r"""
import ctypes, errno, os, subprocess, sys, threading
sys.path.insert(0, {src!r})
from kernelslot.isolation import seccomp
assert seccomp.install()
libc = ctypes.CDLL(None, use_errno=True)
def err(r):
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
print("ptrace", err(libc.ptrace(0, 0, 0, 0)))                      # PTRACE_TRACEME
print("process_vm_readv", err(libc.syscall(310 if os.uname().machine == "x86_64" else 270, os.getpid(), 0, 0, 0, 0, 0)))
print("unshare", err(libc.unshare(0x10000000)))
print("mount", err(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
print("keyctl", err(libc.syscall(250 if os.uname().machine == "x86_64" else 219, 0, 0, 0, 0, 0)))
print("clone3", err(libc.syscall(435, 0, 0)))
t = threading.Thread(target=lambda: None); t.start(); t.join(); print("thread ok")
print("fork", subprocess.run(["true"]).returncode)
"""


def test_the_filter_denies_the_listed_calls_and_nothing_an_honest_kernel_needs():
    if not seccomp.supported():
        pytest.skip("no syscall table for this architecture")
    out = subprocess.run([sys.executable, "-c", _PROBE.format(src=SRC)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert got == {"ptrace": "EPERM", "process_vm_readv": "EPERM", "unshare": "EPERM", "mount": "EPERM",
                   "keyctl": "EPERM", "clone3": "ENOSYS", "thread": "ok", "fork": "0"}


def test_the_program_is_well_formed():
    prog = seccomp.program()
    assert prog is not None and len(prog) % 8 == 0 and len(prog) // 8 < 256


_CONFINED = r"""
import os, socket, sys
sys.path.insert(0, {src!r})
from kernelslot.isolation import sandbox
sandbox.confine({mode!r}, {scratch!r})
print("pid", os.getpid())
print("cwd", os.getcwd())
for path in ({outside!r}, os.path.join(sys.prefix, "ks_probe")):
    try:
        open(path, "w").close(); print("wrote", path)
    except OSError as exc:
        print("denied", exc.errno)
open(os.path.join(os.environ["HOME"], "mine"), "w").write("ok")
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2); print("net connected")
except OSError:
    print("net refused")
"""


@pytest.mark.parametrize("mode", ["bwrap", "unshare"])
def test_a_sandboxed_process_sees_only_its_scratch(mode, tmp_path):
    try:
        box = sandbox.select(mode)
    except sandbox.SandboxUnavailable as exc:
        pytest.skip(str(exc))
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    scratch, outside = tmp_path / "scratch", tmp_path / "outside.txt"
    scratch.mkdir()
    code = _CONFINED.format(src=SRC, mode=mode, scratch=str(scratch), outside=str(outside), port=listener.getsockname()[1])
    proc = box.popen([sys.executable, "-c", code], scratch_dir=str(scratch), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert int(lines[0].split()[1]) <= 3  # its own PID namespace
    assert lines[1] == "cwd /tmp"
    assert lines[2].startswith("denied") and lines[3].startswith("denied")
    assert not outside.exists() and (scratch / "mine").read_text() == "ok"
    assert lines[4] == "net refused"
    with pytest.raises(OSError):
        listener.accept()
    listener.close()


def test_modes_and_the_once_only_warning(capsys, monkeypatch):
    monkeypatch.setattr(sandbox, "_warned", False)
    box = sandbox.current("none")
    assert box.mode == "none" and not box.isolated and "seccomp only" in box.describe()
    sandbox.current("none")
    assert capsys.readouterr().err.count("WITHOUT a sandbox") == 1
    with pytest.raises(sandbox.SandboxUnavailable, match="no sandbox is available"):
        sandbox.current("none", require=True)
    with pytest.raises(sandbox.SandboxUnavailable, match="unknown sandbox mode"):
        sandbox.select("docker")
    env = sandbox.neutral_env(sandbox.Sandbox("bwrap", "/usr/bin/bwrap"), "/somewhere")
    assert env["HOME"] == "/tmp" and not any("kernelslot" in v or "verify" in v for v in env.values())


def test_bwrap_command_shape():
    box = sandbox.Sandbox("bwrap", "/usr/bin/bwrap")
    cmd = box.command(["python", "-"], scratch_dir="/s", seccomp_fd=7)
    assert cmd[:5] == ["/usr/bin/bwrap", "--ro-bind", "/", "/", "--dev"]
    assert "--unshare-net" in cmd and "--unshare-pid" in cmd and cmd[cmd.index("--seccomp") + 1] == "7"
    assert cmd[-3:] == ["--", "python", "-"]
    assert "--unshare-net" not in box.command(["x"], scratch_dir="/s", own_net=False)


_NET = r"""
import socket, sys
if sys.argv[1] == "listen":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
    print(s.getsockname()[1], flush=True)
    s.accept()[0].close()
    print("accepted", flush=True)
else:
    for port in sys.argv[2:]:
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=2).close(); print("reached", port)
        except OSError:
            print("refused", port)
"""


def test_a_group_network_is_shared_by_its_members_and_private():
    """Processes that enter one GroupNetwork meet on its loopback; the host's loopback and another
    group's namespace are out of reach."""
    if netns.probe():
        pytest.skip(f"no private network namespace here: {netns.probe()}")
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(1)
    host.setblocking(False)
    one, other = netns.GroupNetwork(), netns.GroupNetwork()
    try:
        server = subprocess.Popen([sys.executable, "-c", _NET, "listen"], stdout=subprocess.PIPE, text=True, preexec_fn=one.enter)
        port = server.stdout.readline().strip()
        hostport = str(host.getsockname()[1])
        run = lambda net, *ports: subprocess.run([sys.executable, "-c", _NET, "connect", *ports], capture_output=True,  # noqa: E731
                                                 text=True, preexec_fn=net.enter, timeout=60).stdout.split("\n")
        assert run(other, port)[0] == f"refused {port}"  # another group's namespace
        assert run(one, hostport, port)[:2] == [f"refused {hostport}", f"reached {port}"]
        assert server.stdout.readline().strip() == "accepted"
        server.wait(timeout=30)
    finally:
        one.close()
        other.close()
    with pytest.raises(BlockingIOError):
        host.accept()
    host.close()


_IMPORTS = r"""
import os, sys
sys.path[:0] = [{src!r}, {lib!r}]
from kernelslot.isolation import sandbox
sandbox.confine({mode!r}, {scratch!r})
import ks_tmp_probe
print("imported", ks_tmp_probe.VALUE)
try:
    open(os.path.join({lib!r}, "ks_written"), "w").close(); print("wrote")
except OSError as exc:
    print("denied", exc.errno)
"""


@pytest.mark.parametrize("mode", ["bwrap", "unshare"])
def test_import_paths_under_tmp_stay_visible_and_read_only(mode, tmp_path, monkeypatch):
    """A checkout or virtual environment under /tmp (CI clones there) is shown read-only inside the
    sandbox's private /tmp, so sandboxed workers and ranks can still import the referee and torch."""
    try:
        box = sandbox.select(mode)
    except sandbox.SandboxUnavailable as exc:
        pytest.skip(str(exc))
    lib, scratch = tmp_path / "lib", tmp_path / "scratch"
    lib.mkdir(), scratch.mkdir()
    (lib / "ks_tmp_probe.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(lib))
    assert str(lib.resolve()) in sandbox.with_interpreter_paths([]) or str(tmp_path.resolve()) in sandbox.with_interpreter_paths([])
    code = _IMPORTS.format(src=SRC, lib=str(lib), mode=mode, scratch=str(scratch))
    proc = box.popen([sys.executable, "-c", code], scratch_dir=str(scratch), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["imported 42", f"denied {__import__('errno').EROFS}"], out
    assert not (lib / "ks_written").exists()
