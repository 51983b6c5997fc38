"""``python -m kernelslot.verify.collective``: verify one collective slot, locally or under torchrun.

Locally (no ``RANK``/``WORLD_SIZE`` in the environment) it runs :func:`verify_collective`, the
isolated local mode. Under torchrun every launched process is one rank (NCCL on
``cuda:$LOCAL_RANK`` with ``--device cuda``, gloo with ``--device cpu``): each rank refills,
poisons, calls and checks its own share in its own process — the same checks and call sequence
as the local mode, but next to the candidate, so this measures behaviour on a real cluster and
is *not* isolation (admission uses the local mode). Ranks send their findings to global rank 0
as JSON over a separate gloo group (never pickle); rank 0 prints one ``PASS``/``FAIL`` line per
profile. ``--spare-rank`` keeps global rank 0 outside the candidate's group (launch W + 1
processes for a group of W): default-group misuse then hangs and is caught by ``--timeout``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as dist

from kernelslot.abi import Role, SlotKind
from kernelslot.slots.base import Candidate, Kernel, SlotDef
from kernelslot.slots.collective import world_of
from kernelslot.verify.collective.referee import ProfileCheck, verify_collective
from kernelslot.verify.collective.session import stuck_where
from kernelslot.verify.collective.rank import forbid_group_creation
from kernelslot.verify.cases import select_profiles
from kernelslot.verify.options import VerifyOptions
from kernelslot.verify.verdict import FAIL, ProfileResult
from kernelslot.isolation.runner import InProcessRunner, RunnerError

__all__ = ["main"]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m kernelslot.verify.collective",
        description="Verify a collective slot. Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR set) every launched "
                    "process is one rank; otherwise the referee spawns isolated ranks locally.")
    p.add_argument("--slot", required=True, help="a collective slot, e.g. collective.all_reduce")
    p.add_argument("--kernel", help="candidate entry: 'module:qualname' or '/path/file.py:qualname' "
                                    "(default: the slot's built-in kernel)")
    p.add_argument("--prepare", help="candidate prepare, same forms (slots with prepare)")
    p.add_argument("--profile", action="append", help="profile name filter (repeatable), e.g. decode_batch.w2")
    p.add_argument("--dtype", action="append", choices=["float32", "bfloat16"], help="dtype filter (repeatable)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--replays", type=int, default=VerifyOptions.replays)
    p.add_argument("--timeout", type=float, default=30.0, help="per-call deadline in seconds")
    p.add_argument("--world-size", type=int, action="append", help="local mode: group sizes to verify (default 2)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--spare-rank", action="store_true",
                   help="torchrun mode: global rank 0 stays outside the candidate's group (never runs candidate "
                        "code; catches default-group use); the group is ranks 1..WORLD_SIZE-1")
    return p.parse_args(argv)


def _candidate(a: argparse.Namespace, defn: SlotDef) -> Candidate:
    if a.kernel is None:
        return Candidate(defn.incumbent)
    if defn.slot.needs_prepare and a.prepare is None:
        raise SystemExit(f"{defn.name} needs --prepare as well as --kernel")
    target, _, entry = a.kernel.rpartition(":")
    ptarget, _, prepare = (a.prepare or "").rpartition(":")
    if not target or (a.prepare and ptarget != target):
        raise SystemExit("--kernel/--prepare: give 'module:qualname' or '/path/file.py:qualname', both in one source")
    from kernelslot.slots.base import KernelSource

    where = {"file": os.path.abspath(target)} if target.endswith(".py") else {"module": target}
    return Candidate(Kernel(None, name=a.kernel, source=KernelSource(entry, prepare or None, **where)))


def _print(result: ProfileResult, out: Any = sys.stdout) -> None:
    first = result.first_failure()
    why = f": {first.name}: {first.message.splitlines()[0]}" if first else ""
    metrics = " ".join(f"{k}={v:.4g}" for k, v in result.metrics.items())
    print(f"{result.status.upper():4} {result.slot} {result.profile}[{result.dtype}] seed={result.seed} {metrics}{why}",
          file=out, flush=True)


def _gather_json(obj: Any, group: Any, world: int) -> list[Any]:
    """Every rank's ``obj`` (JSON-encoded bytes in uint8 tensors; all_gather, so every rank gets the list)."""
    data = torch.tensor(list(json.dumps(obj).encode()), dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([data.numel()]), group=group)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:data.numel()] = data
    bufs = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(bufs, padded, group=group)
    return [json.loads(bytes(b[:int(s.item())].tolist()).decode()) for b, s in zip(bufs, sizes)]


def _deadline(seconds: float, rank: int) -> threading.Timer:
    """No progress within ``seconds``: say where this rank is stuck and exit 124 (torchrun stops the rest)."""
    main_thread = threading.main_thread().ident

    def fire() -> None:
        import traceback

        frame = sys._current_frames().get(main_thread)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
        print(f"FAIL rank {rank}: timeout: no result within {seconds:g} s; {stuck_where(stack)}", file=sys.stderr, flush=True)
        os._exit(124)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def _rank_profile(defn: SlotDef, cand: Candidate, profile: Any, seed: int, opts: VerifyOptions, rank: int,
                  group: Any, device: torch.device, timeout: float) -> dict:
    """This rank's part of one profile × seed, in this process: findings as plain data."""
    check = ProfileCheck(defn, cand, profile, seed, opts, [device] * world_of(profile), None)
    runner = InProcessRunner()
    rt = check.ranks[rank]
    prepared = None
    if defn.slot.needs_prepare:
        try:
            prepared = runner.prepare(cand.kernel, rt.prepare_args)
        except RunnerError as exc:
            check.prepare_failed(rank, {"error": str(exc), "cause": "exception"})
        else:
            check.prepare_failed(rank, {})
    for call in check.calls if not check.result.failures() else ():
        values = check.begin(call)[rank]
        if call.refill == "reprepare":  # the weights were reloaded in place: prepare again
            try:
                prepared = runner.prepare(cand.kernel, rt.prepare_args)
            except RunnerError as exc:
                check.prepare_failed(rank, {"error": str(exc), "cause": "exception"}, again=True)
                break
            if check.prepare_failed(rank, {}, again=True):
                break
        values = [prepared if v is Role.PREPARED else group if v is Role.GROUP else v for v in values]
        timer = _deadline(timeout, rank)
        obs = runner.call(cand.kernel, values, scratch=call.scratch)
        timer.cancel()
        check.judge(call, rank, obs)
        if obs.error:
            break
    return {"failures": [[c.name, c.message] for c in check.result.failures()], "metrics": check.result.metrics,
            "performed": sorted(check.performed)}


def _torchrun(a: argparse.Namespace, defn: SlotDef, cand: Candidate, opts: VerifyOptions) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(a.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=3 * a.timeout + 30)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://", timeout=timeout)
    try:
        return _torchrun_ranks(a, defn, cand, opts, rank, world, device, timeout)
    finally:
        # Tear the groups down before the interpreter exits: a gloo group still alive at exit
        # destroys its worker threads while joinable, and the C++ runtime aborts the rank
        # ("terminate called without an active exception", exit -6) after a passing run.
        dist.destroy_process_group()


def _torchrun_ranks(a: argparse.Namespace, defn: SlotDef, cand: Candidate, opts: VerifyOptions, rank: int,
                    world: int, device: torch.device, timeout: timedelta) -> int:
    results_group = dist.new_group(backend="gloo", timeout=timeout)  # the findings' channel, never the candidate's
    members = list(range(1 if a.spare_rank else 0, world))
    group = dist.new_group(ranks=members, timeout=timeout)
    forbid_group_creation()
    profiles = [p for p in select_profiles(defn, opts, None) if world_of(p) == len(members)]
    if not profiles:
        if rank == 0:
            worlds = sorted({world_of(p) for p in defn.profiles})
            print(f"no {defn.name} profile for a group of {len(members)} ranks (profiles exist for {worlds}; "
                  "adjust --nproc-per-node/--nnodes or --spare-rank)", file=sys.stderr)
        return 2
    ok = True
    for profile in profiles:
        for seed in opts.seeds:
            mine = (_rank_profile(defn, cand, profile, seed, opts, dist.get_rank(group), group, device, a.timeout)
                    if rank in members else None)
            every = _gather_json(mine, results_group, world)
            if rank == 0:
                result = ProfileResult(defn.name, profile.name, str(profile.dtype).removeprefix("torch."), profile.model,
                                       seed, cand.name)
                for found in (f for f in every if f is not None):
                    for name, message in found["failures"]:
                        result.record(str(name), FAIL, str(message))
                    for key, value in found["metrics"].items():
                        result.metrics[key] = min(result.metrics.get(key, value), value)
                ok &= result.passed
                _print(result)
    dist.barrier(group=results_group)  # every rank is done with every group before any tears one down
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when every selected profile passes."""
    from kernelslot.slots import get_slot

    a = _parse(argv)
    defn = get_slot(a.slot)
    if defn.slot.kind is not SlotKind.COLLECTIVE:
        raise SystemExit(f"{a.slot} is not a collective slot; use `kernelslot verify`")
    dtypes = tuple(getattr(torch, d) for d in a.dtype) if a.dtype else None
    opts = VerifyOptions(device=a.device, dtypes=dtypes, seeds=tuple(a.seeds), replays=a.replays,
                         profiles=tuple(a.profile) if a.profile else None,
                         world_sizes=tuple(a.world_size) if a.world_size else (2,), collective_timeout_s=a.timeout)
    cand = _candidate(a, defn)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # every rank must draw the same call plan: seeded from the first seed, no random extra replays
        return _torchrun(a, defn, cand, dataclasses.replace(opts, extra_mean=0.0, plan_seed=opts.seeds[0]))
    report = verify_collective(defn, cand, opts, progress=_print)
    for err in report.errors:
        print(f"ERROR {err}", file=sys.stderr)
    return 0 if report.passed else 1
