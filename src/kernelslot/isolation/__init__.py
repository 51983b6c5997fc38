"""Where untrusted candidate code runs, and nothing else: the sandbox, the worker processes and
their wire, and what the referee observes of a call.

Runners (the registry :data:`RUNNERS`, chosen by :func:`make_runner`):

- ``in-process`` — :class:`~kernelslot.isolation.runner.InProcessRunner`: the caller's own
  process; for trusted (built-in) kernels and for authors debugging their own code.
- ``isolated`` — :class:`~kernelslot.isolation.worker.WorkerRunner`: a sandboxed worker process
  forked by a zygote (``sandbox.py``, ``seccomp.py``, ``netns.py``, ``cgroup.py``), tensors shared
  in place, deadlines and containment (``process.py``); its child side is ``child.py``.

Both report a :class:`~kernelslot.isolation.runner.CallObservation` (``observe.py``); every
verdict is made by the caller from that observation and the shared tensors. This package never
imports the referee (``kernelslot.verify``): verification, e2e and serving all use it.
"""
from __future__ import annotations

from typing import Any, Callable

from kernelslot.isolation.runner import InProcessRunner, Runner
from kernelslot.isolation.sandbox import current as current_sandbox
from kernelslot.isolation.worker import WorkerRunner

__all__ = ["RUNNERS", "make_runner", "register_runner"]


def _in_process(**_: Any) -> Runner:
    return InProcessRunner()


def _isolated(*, timeout_s: float, memory_limit_gib: float | None, sandbox: str | None, require_sandbox: bool,
              **_: Any) -> Runner:
    box = current_sandbox(sandbox, require=require_sandbox)
    return WorkerRunner(call_timeout_s=timeout_s, prepare_timeout_s=max(4 * timeout_s, 60.0), memory_limit_gib=memory_limit_gib,
                        sandbox=box)


# name -> factory(timeout_s=, device=, memory_limit_gib=, sandbox=, require_sandbox=) -> Runner
RUNNERS: dict[str, Callable[..., Runner]] = {"in-process": _in_process, "isolated": _isolated}


def register_runner(name: str, factory: Callable[..., Runner]) -> None:
    """Add a runner kind (a factory taking the keyword options of :func:`make_runner`)."""
    if name in RUNNERS:
        raise ValueError(f"runner {name!r} is registered already")
    RUNNERS[name] = factory


def make_runner(isolate: bool, timeout_s: float = 30.0, *, device: str = "cpu", memory_limit_gib: float | None = 4.0,
                sandbox: str | None = None, require_sandbox: bool = False, kind: str | None = None) -> Runner:
    """The runner a command asks for: ``isolated`` when ``isolate`` (the default for bundles), else
    ``in-process``; ``kind`` names a registered runner explicitly.

    ``memory_limit_gib`` caps each worker's resident memory (host memory; device memory is
    the operator's to cap, docs/threat-model.md); ``sandbox`` forces a mode of
    :mod:`kernelslot.isolation.sandbox` and ``require_sandbox`` refuses to run without one.
    """
    name = kind or ("isolated" if isolate else "in-process")
    if name not in RUNNERS:
        raise ValueError(f"unknown runner {name!r}; registered: {', '.join(sorted(RUNNERS))}")
    return RUNNERS[name](timeout_s=timeout_s, device=device, memory_limit_gib=memory_limit_gib, sandbox=sandbox,
                         require_sandbox=require_sandbox)
