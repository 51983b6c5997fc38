"""The referee-owned builder and the seal.

Build: the declared sources are copied into a private build directory and compiled by the
fixed toolchain (``gcc``/``g++`` for ``native.elf.v1``, ``nvcc -cubin`` for ``cuda.cubin.v1``)
with fixed flags, in child processes with an empty environment (``PATH``, ``LC_ALL``, and ``TMPDIR`` set
to the build directory, the only place a build writes),
stdin closed, a deadline, and no network (``unshare --net`` where the kernel allows it; the
index records which). Nothing from the bundle chooses a flag, a compiler or a path.

Seal: the finished directory holds the artifact, copies of the sources and ``index.json``
with every file's path, size and SHA-256, the flags, the toolchain versions, the canonical
declaration and its digest. It is published with one atomic rename under
``$KERNELSLOT_SEAL_DIR`` (default ``$XDG_CACHE_HOME/kernelslot/sealed``) keyed by a digest of
the declaration, the sources, the flags and the toolchain, so an unchanged row is built once.
:func:`open_seal` re-verifies everything before every use: a file added, missing or changed,
an index that is not the one the referee sealed, or a declaration that no longer parses and
joins, is a rejection (:class:`SealError`); it never rebuilds or repairs.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kernelslot.bundle.direct.spec import PROVIDERS, DirectOp, declaration_digest

SCHEMA = "kernelslot.sealed-direct.v1"
INDEX = "index.json"
BUILD_TIMEOUT_S = 300
NATIVE_ARTIFACT, CUDA_ARTIFACT = "artifact.so", "artifact.cubin"
_NATIVE_COMMON = ["-O2", "-g", "-fPIC", "-fvisibility=hidden", "-fno-strict-aliasing", "-fno-fast-math",
                  "-Wall", "-Werror=implicit-function-declaration", "-Werror=return-type"]
C_FLAGS = ["-std=gnu11", *_NATIVE_COMMON]
CXX_FLAGS = ["-std=gnu++17", "-fno-exceptions", "-fno-rtti", *_NATIVE_COMMON]
LINK_FLAGS = ["-shared", "-Wl,-z,defs", "-Wl,--hash-style=gnu", "-lm"]
CUDA_FLAGS = ["-cubin", "-O3", "-lineinfo", "--std=c++17"]


class SealError(ValueError):
    """The sealed artifact cannot be built, or it is not what was sealed (one line: what and where)."""


class ToolchainMissing(SealError):
    """This machine lacks the provider's fixed toolchain: the bundle is not run here (not a bad bundle)."""


@dataclass(frozen=True)
class Seal:
    """A verified seal: its directory, the digest of its index, the index and the artifact's bytes."""

    path: Path
    digest: str
    index: dict
    artifact: bytes

    @property
    def handle(self) -> str:
        """What a worker is given to reopen exactly this seal: ``DIR@INDEX_SHA256``."""
        return f"{self.path}@{self.digest}"


def seal_root() -> Path:
    if os.environ.get("KERNELSLOT_SEAL_DIR"):
        return Path(os.environ["KERNELSLOT_SEAL_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "kernelslot" / "sealed"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _run(cmd: list[str], cwd: str, network_off: list[str]) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C", "TMPDIR": cwd}  # writes stay in the build dir
    try:
        return subprocess.run([*network_off, *cmd], cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SealError(f"the build step `{' '.join(cmd[:3])} ...` ran past {BUILD_TIMEOUT_S}s") from None
    except OSError as exc:
        raise SealError(f"the build step `{cmd[0]}` could not start ({exc})") from None


def _network_off() -> list[str]:
    """``unshare --net`` (with a user namespace when not root) if this kernel allows it, else nothing."""
    for cmd in (["unshare", "--net"], ["unshare", "--map-root-user", "--net"]):
        if shutil.which("unshare"):
            try:
                if subprocess.run([*cmd, "true"], capture_output=True, timeout=10).returncode == 0:
                    return cmd
            except (OSError, subprocess.SubprocessError):
                pass
    return []


def _version(tool: str) -> str:
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = out.splitlines()
    return next((ln for ln in lines if "release" in ln), lines[-1]) if tool == "nvcc" and lines else (lines[0] if lines else "")


def toolchain(provider: str) -> dict[str, str]:
    tools = PROVIDERS[provider].tools
    return {t: _version(t) for t in tools}


def cuda_arch() -> str:
    """The CUBIN target: ``$KERNELSLOT_CUDA_ARCH``, else the current device's, else ``sm_90``."""
    if os.environ.get("KERNELSLOT_CUDA_ARCH"):
        return os.environ["KERNELSLOT_CUDA_ARCH"]
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001 - no usable CUDA: the default target
        pass
    return "sm_90"


def _build_commands(op: DirectOp, tmp: str) -> tuple[list[list[str]], str, list[str]]:
    units = [s for s in op.sources if not s.endswith((".h", ".hpp", ".cuh"))]
    if PROVIDERS[op.provider].device == "cuda":
        arch = cuda_arch()
        flags = [*CUDA_FLAGS, f"-arch={arch}"]
        return [["nvcc", *flags, os.path.join("sources", units[0]), "-o", CUDA_ARTIFACT]], CUDA_ARTIFACT, flags
    cmds, objs = [], []
    cxx = any(u.endswith((".cc", ".cpp")) for u in units)
    for i, u in enumerate(units):
        is_cxx = u.endswith((".cc", ".cpp"))
        obj = f"obj{i}.o"
        cmds.append(["g++" if is_cxx else "gcc", *(CXX_FLAGS if is_cxx else C_FLAGS), "-c", os.path.join("sources", u), "-o", obj])
        objs.append(obj)
    cmds.append(["g++" if cxx else "gcc", *LINK_FLAGS[:1], *objs, *LINK_FLAGS[1:], "-o", NATIVE_ARTIFACT])
    flags = C_FLAGS + (CXX_FLAGS if cxx else []) + LINK_FLAGS
    return cmds, NATIVE_ARTIFACT, flags


def _index_files(root: Path) -> list[dict]:
    files = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != INDEX:
            data = p.read_bytes()
            files.append({"path": p.relative_to(root).as_posix(), "size": len(data), "sha256": _sha256(data)})
    return files


def build_and_seal(op: DirectOp, bundle_root: Path) -> Seal:
    """Build ``op`` into a sealed directory (or reuse the one already sealed for exactly this input)."""
    from kernelslot.bundle.direct.elf import static_inventory

    tools = toolchain(op.provider)
    missing = [t for t, v in tools.items() if not v and t != "ld"]
    if missing:
        raise ToolchainMissing(f"the {op.provider} builder needs {', '.join(missing)}, which is not installed here")
    sources = {s: (bundle_root / s).read_bytes() for s in op.sources}
    key = hashlib.sha256(json.dumps([SCHEMA, op.digest, sorted((s, _sha256(b)) for s, b in sources.items()),
                                     _build_commands(op, "")[2], tools, platform.machine()]).encode()).hexdigest()
    root = seal_root()
    target = root / key[:32]
    if target.exists():
        return open_seal(target)
    root.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=root)
    try:
        for rel, data in sources.items():
            dest = Path(tmp, "sources", rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        network_off = _network_off()
        cmds, artifact, flags = _build_commands(op, tmp)
        for cmd in cmds:
            res = _run(cmd, tmp, network_off)
            if res.returncode != 0:
                first = next((ln for ln in res.stderr.splitlines() if "error" in ln), res.stderr.strip()[-300:])
                raise SealError(f"building {op.slot} failed: `{' '.join(cmd)}`: {first.strip()}")
        for obj in Path(tmp).glob("obj*.o"):
            obj.unlink()
        data = Path(tmp, artifact).read_bytes()
        index = {"schema": SCHEMA, "slot": op.slot, "provider": op.provider, "artifact": artifact,
                 "declaration": op.declaration, "declaration_digest": op.digest, "flags": flags, "toolchain": tools,
                 "network": " ".join(network_off) or "not isolated (unshare unavailable)", "machine": platform.machine(),
                 "baseline": _baseline(op.provider, tmp, network_off),
                 "inventory": static_inventory(op.provider, data), "files": _index_files(Path(tmp))}
        Path(tmp, INDEX).write_text(json.dumps(index, indent=1, sort_keys=True))
        for p in Path(tmp).rglob("*"):
            p.chmod(0o555 if p.is_dir() else 0o444)
        Path(tmp).chmod(0o555)
        try:
            os.rename(tmp, target)
        except OSError:  # a concurrent builder published the same key first
            if not target.exists():
                raise
    finally:
        if os.path.exists(tmp):
            _rmtree(tmp)
    return open_seal(target)


def _baseline(provider: str, tmp: str, network_off: list[str]) -> dict:
    """What the fixed toolchain itself puts in an empty artifact (load-time constructors)."""
    if PROVIDERS[provider].device != "cpu":
        return {}
    from kernelslot.bundle.direct.elf import init_entries

    d = tempfile.mkdtemp(dir=tmp)
    try:
        Path(d, "empty.c").write_text("int kernelslot_empty_unit;\n")
        res = _run(["gcc", *C_FLAGS, *LINK_FLAGS[:1], "empty.c", *LINK_FLAGS[1:], "-o", "empty.so"], d, network_off)
        if res.returncode != 0:
            raise SealError(f"the builder cannot link an empty unit: {res.stderr.strip()[-200:]}")
        return {"init_entries": init_entries(Path(d, "empty.so").read_bytes())}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _rmtree(path: str) -> None:
    for p in Path(path).rglob("*"):
        if p.is_dir():
            p.chmod(0o755)
    Path(path).chmod(0o755)
    shutil.rmtree(path, ignore_errors=True)


def open_seal(path: str | Path, expected_digest: str | None = None) -> Seal:
    """Re-verify a sealed directory completely and return it; any difference is a :class:`SealError`."""
    path = Path(path)
    try:
        raw = (path / INDEX).read_bytes()
    except OSError as exc:
        raise SealError(f"{path}: the seal index cannot be read ({exc.strerror})") from None
    digest = _sha256(raw)
    if expected_digest is not None and digest != expected_digest:
        raise SealError(f"{path}/{INDEX} changed after sealing (sha256 {digest[:16]}..., sealed {expected_digest[:16]}...)")
    try:
        index = json.loads(raw)
        files = {f["path"]: f for f in index["files"]}
        artifact_name = index["artifact"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SealError(f"{path}/{INDEX} is not a seal index ({exc})") from None
    if index.get("schema") != SCHEMA:
        raise SealError(f"{path}/{INDEX}: schema {index.get('schema')!r}, expected {SCHEMA!r}")
    present = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != INDEX}
    extra, missing = sorted(present - set(files)), sorted(set(files) - present)
    if extra:
        raise SealError(f"{path}: {extra[0]} was added after sealing; a sealed directory is immutable")
    if missing:
        raise SealError(f"{path}: sealed file {missing[0]} is missing")
    artifact = b""
    for rel, f in files.items():
        data = (path / rel).read_bytes()
        if len(data) != f["size"] or _sha256(data) != f["sha256"]:
            raise SealError(f"{path}: sealed file {rel} changed after sealing (size {len(data)}, sha256 "
                            f"{_sha256(data)[:16]}...; sealed {f['size']}, {f['sha256'][:16]}...); rebuild from the bundle")
        if rel == artifact_name:
            artifact = data
    if declaration_digest(index["declaration"]) != index.get("declaration_digest"):
        raise SealError(f"{path}/{INDEX}: the declaration does not match its digest")
    return Seal(path, digest, index, artifact)
