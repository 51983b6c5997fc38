"""Process-wide numeric state that candidate code could change for every later computation.

A candidate that turns on flush-to-zero, drops torch's thread count or switches matmul precision
and leaves it that way changes what the *next* computation in its process computes (another
profile, the incumbent in-process, the referee's own references in-process). Both runners take a
:func:`snapshot` right before candidate code runs (import, ``prepare``, ``entry``) and compare it
right after (:func:`changes`); any difference fails ``global_state_changed`` and is put back
(:func:`restore`). What :func:`restore` could not put back is reported, and the worker runner then
discards the worker.

What is read, and how:

* the calling thread's floating-point environment with ``fegetenv`` (glibc, through ctypes): on
  x86-64 the x87 control word and MXCSR (flush-to-zero bit 15, denormals-are-zero bit 6, rounding
  bits 13-14, exception masks bits 7-12; the sticky status bits 0-5 are ignored), on aarch64 FPCR.
  It is restored with ``fesetenv`` on the saved environment;
* denormal handling in torch's intra-op thread pool, by a probe: one parallel multiply whose
  chunks produce a subnormal result (flushed under FTZ) and read a subnormal operand (zeroed under
  DAZ) on every pool thread. Pool threads cannot be reset from Python: a change there is reported
  as not restored;
* torch's intra-op and inter-op thread counts, OpenMP's ``omp_get_max_threads`` and MKL's
  ``mkl_get_max_threads`` (from the libraries torch loaded), the default dtype and device, the
  float32 matmul precision and every ``torch.backends`` precision flag (TF32, reduced-precision
  reductions, ``fp32_precision``), cuDNN/oneDNN switches, grad / inference / anomaly modes,
  deterministic-algorithms mode and CPU/CUDA autocast.

Cost: about 0.1 ms per snapshot (the pool probe dominates), so every candidate call takes two.
"""
from __future__ import annotations

import ctypes
import platform
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

State = dict[str, Any]


@dataclass(frozen=True)
class FpEnv:
    """The control part of the calling thread's floating-point environment (``raw``: the whole ``fenv_t``)."""

    control: tuple[int, ...]
    raw: bytes = field(compare=False, repr=False)

    def describe(self) -> str:
        if _ARCH == "x86_64":
            x87, mxcsr = self.control
            flags = [name for bit, name in ((0x8000, "flush-to-zero"), (0x40, "denormals-are-zero")) if mxcsr & bit]
            rounding = ("nearest", "down", "up", "toward zero")[(mxcsr >> 13) & 3]
            return f"MXCSR {mxcsr:#06x} ({', '.join(flags) or 'no FTZ/DAZ'}, rounding {rounding}), x87 control {x87:#06x}"
        fpcr = self.control[0]
        flags = [name for bit, name in ((1 << 24, "flush-to-zero"), (1 << 19, "fp16 flush-to-zero")) if fpcr & bit]
        return f"FPCR {fpcr:#x} ({', '.join(flags) or 'no flush-to-zero'}, rounding mode {(fpcr >> 22) & 3})"


_ARCH = platform.machine()
_FENV_BYTES = 64  # larger than fenv_t on every glibc target
_libm: Any = None


def _fenv() -> FpEnv | None:
    global _libm
    if _ARCH not in ("x86_64", "aarch64"):
        return None
    if _libm is None:
        try:
            _libm = ctypes.CDLL("libm.so.6")
        except OSError:
            _libm = False
    if not _libm:
        return None
    buf = ctypes.create_string_buffer(_FENV_BYTES)
    if _libm.fegetenv(buf) != 0:
        return None
    raw = buf.raw
    if _ARCH == "x86_64":  # fenv_t: x87 control word at 0, MXCSR at 28 (status bits 0-5 masked off)
        control = (int.from_bytes(raw[0:2], "little"), int.from_bytes(raw[28:32], "little") & ~0x3F)
    else:  # aarch64 fenv_t: FPCR at 0, FPSR at 4 (status only)
        control = (int.from_bytes(raw[0:4], "little"),)
    return FpEnv(control, raw)


def _set_fenv(env: FpEnv | None) -> None:
    if env is not None and _libm:
        _libm.fesetenv(ctypes.create_string_buffer(env.raw, _FENV_BYTES))


_GRAIN = 32768  # at::internal::GRAIN_SIZE: chunks of this many elements go to separate pool threads
_probe_cache: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
_TINY = torch.finfo(torch.float32).tiny  # the smallest normal float32
_STEP = 1024


def _pool_denormals() -> tuple[bool, bool]:
    """(flush-to-zero, denormals-are-zero) seen on any thread of torch's intra-op pool.

    One multiply of ``threads × grain`` elements, so every pool thread gets a chunk; a pair of probe
    cells every 1024 elements (a normal times 1/2 = subnormal, a subnormal times 64 = normal), ones
    elsewhere: subnormal arithmetic is slow, so there is little of it.
    """
    n = max(1, torch.get_num_threads()) * _GRAIN
    if n not in _probe_cache:
        _probe_cache.clear()
        x, s = torch.ones(n), torch.ones(n)
        x[0::_STEP], s[0::_STEP] = _TINY, 0.5
        x[1::_STEP], s[1::_STEP] = _TINY / 4, 64.0
        _probe_cache[n] = (x, s, torch.empty_like(x))
    x, s, y = _probe_cache[n]
    with torch.no_grad():
        torch.mul(x, s, out=y)
    return bool((y[0::_STEP] == 0).any()), bool((y[1::_STEP] == 0).any())


def _native_threads(symbol: str) -> Callable[[], int] | None:
    """``symbol`` (e.g. ``omp_get_max_threads``) from the OpenMP/MKL libraries torch loaded, if any."""
    try:
        with open("/proc/self/maps") as f:
            libs = {ln.split()[-1] for ln in f if ".so" in ln and any(k in ln for k in ("gomp", "iomp", "torch_cpu"))}
    except OSError:
        return None
    for lib in sorted(libs):
        try:
            return getattr(ctypes.CDLL(lib), symbol)
        except (OSError, AttributeError):
            continue
    return None


def _attr(path: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """Getter and setter of a ``torch.backends`` attribute given by its dotted path below ``torch``."""
    *parents, leaf = path.split(".")

    def owner() -> Any:
        obj: Any = torch
        for p in parents:
            obj = getattr(obj, p)
        return obj

    return (lambda: getattr(owner(), leaf)), (lambda v: setattr(owner(), leaf, v))


def _autocast(device: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    def get() -> tuple[bool, torch.dtype]:
        return torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)

    def put(v: tuple[bool, torch.dtype]) -> None:
        torch.set_autocast_enabled(device, v[0])
        torch.set_autocast_dtype(device, v[1])

    return get, put


def _items() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None] | None]]:
    items: dict[str, tuple[Callable[[], Any], Callable[[Any], None] | None]] = {
        "floating-point environment": (_fenv, _set_fenv),
        "denormals in torch's thread pool (flush-to-zero, denormals-are-zero)": (_pool_denormals, None),
        "torch.get_num_threads()": (torch.get_num_threads, torch.set_num_threads),
        "torch.get_num_interop_threads()": (torch.get_num_interop_threads, None),
        "torch.get_default_dtype()": (torch.get_default_dtype, torch.set_default_dtype),
        "torch.get_default_device()": (torch.get_default_device, torch.set_default_device),
        "torch.get_float32_matmul_precision()": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        "torch.is_grad_enabled()": (torch.is_grad_enabled, torch.set_grad_enabled),
        "torch.is_inference_mode_enabled()": (torch.is_inference_mode_enabled, None),
        "torch.is_anomaly_enabled()": (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        "deterministic algorithms (on, warn only)": (
            lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        "autocast cpu (enabled, dtype)": _autocast("cpu"),
        "autocast cuda (enabled, dtype)": _autocast("cuda"),
    }
    for name, setter in (("omp_get_max_threads", "omp_set_num_threads"), ("mkl_get_max_threads", "mkl_set_num_threads")):
        get, put = _native_threads(name), _native_threads(setter)
        if get is not None:
            items[f"{name}()"] = (get, (lambda f: lambda v: f(int(v)))(put) if put is not None else None)
    for path in ("backends.fp32_precision", "backends.cuda.matmul.allow_tf32", "backends.cuda.matmul.fp32_precision",
                 "backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
                 "backends.cuda.matmul.allow_bf16_reduced_precision_reduction", "backends.cuda.matmul.allow_fp16_accumulation",
                 "backends.cudnn.enabled", "backends.cudnn.allow_tf32", "backends.cudnn.benchmark", "backends.cudnn.deterministic",
                 "backends.cudnn.conv.fp32_precision", "backends.mkldnn.enabled", "backends.mkldnn.matmul.fp32_precision",
                 "backends.mkldnn.conv.fp32_precision"):
        get, put = _attr(path)
        try:
            get()
        except (AttributeError, RuntimeError):  # not in this torch build
            continue
        items[f"torch.{path}"] = (get, put)
    return items


_ITEMS: dict[str, tuple[Callable[[], Any], Callable[[Any], None] | None]] | None = None


def _registry() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None] | None]]:
    global _ITEMS
    if _ITEMS is None:
        _ITEMS = _items()
    return _ITEMS


def snapshot() -> State:
    """The current value of every item (see the module docstring)."""
    state: State = {}
    for name, (get, _) in _registry().items():
        try:
            state[name] = get()
        except Exception as exc:  # noqa: BLE001 - an item that cannot be read is recorded as such
            state[name] = f"<unreadable: {type(exc).__name__}>"
    return state


def _text(value: Any) -> str:
    return value.describe() if isinstance(value, FpEnv) else repr(value)


def changes(before: State, after: State) -> list[str]:
    """One line per item that differs: ``"torch.get_num_threads(): 2 -> 1"``."""
    return [f"{name}: {_text(before[name])} -> {_text(after.get(name))}" for name in before if after.get(name) != before[name]]


def restore(before: State) -> list[str]:
    """Put every changed item back to ``before``; the names of those still different afterwards."""
    now = snapshot()
    for name, (_, put) in _registry().items():
        if name in before and now.get(name) != before[name] and put is not None:
            try:
                put(before[name])
            except Exception:  # noqa: BLE001 - reported below as not restored
                pass
    after = snapshot()
    return [name for name in before if after.get(name) != before[name]]


class Guard:
    """``with Guard() as g:`` around candidate code; afterwards ``g.changed`` lists what changed (one line
    each) and ``g.unrestored`` the items :func:`restore` could not put back."""

    def __enter__(self) -> "Guard":
        self.changed: list[str] = []
        self.unrestored: list[str] = []
        self.before = snapshot()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.changed = changes(self.before, snapshot())
        if self.changed:
            self.unrestored = restore(self.before)
