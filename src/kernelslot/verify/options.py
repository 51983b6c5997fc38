"""The referee's options (:class:`VerifyOptions`) and progress callback, shared by both wings.

``VerifyOptions`` is frozen: one value describes a whole ``kernelslot verify`` run (device,
filters, seeds, the call plan's replay counts, envelope and timing switches, collective group
sizes). ``Progress`` is called once per finished profile run, in completion order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kernelslot.verify.plan import BUNDLE_LONG_RUN
from kernelslot.verify.verdict import ProfileResult

__all__ = ["VerifyOptions", "Progress", "device_arch", "UNTRUSTED"]

Progress = Callable[[ProfileResult], None]


@dataclass(frozen=True)
class VerifyOptions:
    device: str = "cpu"
    dtypes: tuple[torch.dtype, ...] | None = None  # None: every dtype the slot's profiles take
    seeds: tuple[int, ...] = (0,)
    replays: int = 3  # base replays after the first call (at least two), cycling tail, head, row-or-cells refills
    extra_mean: float = 0.25  # mean of the geometric number of extra replays per profile (verify/plan.py)
    long_run: tuple[int, int] | None = None  # one run per slot gets log-uniform [lo, hi] more replays (plan.py; bundles)
    plan_seed: int | None = None  # seeds the call plan (tests); None: drawn from the OS's secret RNG
    envelope: bool = False  # run boundary profiles of each variant's domain and record the verified envelope
    envelope_max_bytes: int = 256 << 20  # a boundary profile whose tensors would exceed this is clipped
    envelope_fields: tuple[str, ...] | None = None  # extend only these size fields (None: every one the slot maps)
    profiles: tuple[str, ...] | None = None  # profile-name filter
    model: str | None = None  # run this model's profiles (falls back to generic where the slot has none)
    graph: bool = True  # CUDA-graph replay for graph_safe candidates on CUDA
    time: bool = False  # time candidate and incumbent side by side
    time_reps: int = 7  # the least number of timed repetitions (the plan adds up to half as many)
    draws: int = 2  # drawn profiles per slot and seed, inside the slot's domain (slots/draw.py); 0: none
    world_sizes: tuple[int, ...] = (2,)  # collective slots: group sizes to verify (profiles carry dims["world"])
    collective_timeout_s: float = 30.0  # collective slots: per-call deadline for every rank


# What verifying an untrusted bundle adds, wherever it is verified (`kernelslot verify BUNDLE`, e2e's
# qualification): a mean of 2 extra replays, the secret long run, and the verified envelope recorded.
UNTRUSTED = {"extra_mean": 2.0, "long_run": BUNDLE_LONG_RUN, "envelope": True}


def device_arch(device: str) -> str:
    """The canonical architecture of ``device`` (``cpu``, ``sm_90``, ...; see abi.canonical_arch)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        return f"sm_{major}{minor}"
    return dev.type


