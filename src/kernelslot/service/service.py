"""The admission service: submissions admitted into the store, jobs dispatched to Ray device workers.

:meth:`Service.admit` answers a submission at once: bytes that are no bundle (not an archive, over
a limit, a manifest error) are ``invalid`` with their one-line reason and exit code 2, and nothing
is queued; byte-identical bundles (the same content hash) are never run twice: a copy of a stored
PASS is ``copy_of:<first id>`` (credited to the first), of a stored FAIL ``duplicate_of:<first
id>:<reason>``, and a copy of one still queued or running waits for it and gets the same answer.
Everything else is queued. Each submission is committed to the store before it is answered.

The dispatcher (a thread of :meth:`Service.start`) hands queued jobs, oldest first, to idle
device workers whose device and node fit the job's needs (:class:`Needs`): a CUDA job one GPU, a
collective job its world size of GPUs on one node. A job no live node can serve is finished
``not run`` with that reason at once. A job whose verify process runs past ``job_timeout_s`` is
stopped and finished ``not run`` with that reason. A job whose worker dies (actor killed, node
lost) or stops answering is tried again on a fresh worker, up to ``max_attempts``, then finished
``not run: worker lost`` (or ``timed out``). Attempts are rows of their own; a finished attempt
cannot be finished again (the store refuses), so no result is recorded twice. A restarted service
marks the attempts it left running as interrupted and resumes the queue.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelslot.service.archive import ArchiveError, Limits, unpack
from kernelslot.service.store import ServiceStore, StoreConflict, follower_outcome

__all__ = ["Service", "Needs", "needs_of", "feasible", "DEFAULT_STORE"]

log = logging.getLogger("kernelslot.service")
DEFAULT_STORE = "kernelslot-service.db"
EXIT_INVALID = 2


@dataclass(frozen=True)
class Needs:
    """What a job needs of one node: ``gpus`` GPUs (0: the node's CPU device)."""
    gpus: int = 0

    def describe(self) -> str:
        return f"{self.gpus} GPU{'s' if self.gpus != 1 else ''} on one node" if self.gpus else "a CPU"


def needs_of(bundle, options: dict[str, Any]) -> Needs:
    """A job's needs: on CUDA one GPU, or the largest collective world size among the bundle's slots."""
    if options.get("device", "cpu") != "cuda":
        return Needs(0)
    from kernelslot.abi import SlotKind
    from kernelslot.slots import get_slot
    from kernelslot.verify import VerifyOptions

    collective = any(get_slot(row.slot).slot.kind is SlotKind.COLLECTIVE for row in bundle.manifest.ops)
    world = max(options.get("world_size") or VerifyOptions.world_sizes) if collective else 1
    return Needs(world)


@dataclass
class _Worker:
    name: str
    node: str
    device: str  # "cpu" or "cuda"
    handle: Any
    gpu_ids: tuple[str, ...] = ()
    busy: int | None = None  # the attempt it runs or is reserved for


@dataclass
class _Running:
    sid: int
    aid: int
    worker: _Worker
    reserved: list[_Worker]
    ref: Any
    deadline: float


class Service:
    """Admission, the store and the Ray workers. ``store``: a SQLite path or a SQLAlchemy URL;
    ``address``: a Ray cluster to join (None: start a local instance, CPU only, no dashboard);
    ``cpu_workers``: workers sharing each node's CPU (1: the CPU is one device; more run jobs side
    by side, each job's own speed ratios still interleaved, but under each other's load)."""

    def __init__(self, store: str | Path = DEFAULT_STORE, *, address: str | None = None, max_attempts: int = 3,
                 job_timeout_s: float = 3600.0, limits: Limits = Limits(), defaults: dict[str, Any] | None = None,
                 num_cpus: int | None = None, cpu_workers: int = 1):
        self.store = ServiceStore(store)
        self.address, self.num_cpus, self.cpu_workers = address, num_cpus, cpu_workers
        self.max_attempts, self.job_timeout_s, self.limits = max_attempts, job_timeout_s, limits
        self.defaults = {"device": "cpu", "time": True, **(defaults or {})}
        self.workers: list[_Worker] = []
        self.running: dict[Any, _Running] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.ray_started = False

    # --- admission -----------------------------------------------------------------------------

    def admit(self, data: bytes, submitter: str | None = None, options: dict[str, Any] | None = None) -> dict:
        """Store a submission and answer it at once (its row: id, hash, state, status, reason, exit_code)."""
        from kernelslot.bundle import load_bundle

        opts = {**self.defaults, **(options or {})}
        bad = _bad_options(opts)
        bundle = None
        if bad is None:
            with tempfile.TemporaryDirectory(prefix="kernelslot-admit-") as tmp:
                try:
                    root = unpack(data, Path(tmp) / "bundle", self.limits)
                    bundle = load_bundle(root)  # static checks only: no candidate code runs here
                    needs = needs_of(bundle, opts)
                except ArchiveError as exc:
                    bad = str(exc)
                except Exception as exc:  # a manifest error, or any other reason the bundle cannot load
                    bad = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)
                    bad = bad.replace(f"{Path(tmp) / 'bundle'}/", "")  # paths as inside the bundle
        if bundle is None:
            return self.reject(bad or "invalid", submitter, hashlib.sha256(data).hexdigest(), opts)
        with self._lock, self.store.engine.begin() as conn:
            digest = bundle.content_hash
            first = self.store.first_of(conn, digest, opts["device"])
            common = dict(hash=digest, submitter=submitter, bundle_id=bundle.bundle_id,
                          options={**opts, "needs": dataclasses.asdict(needs)})
            if first is None:
                self.store.add_blob(conn, digest, data)
                sid = self.store.insert_submission(conn, state="queued", **common)
            elif first["state"] == "done":
                sid = self.store.insert_submission(conn, state="done", first_id=first["id"], finished=time.time(),
                                                   **follower_outcome(first["id"], first["status"], first["reason"],
                                                                      first["exit_code"]), **common)
            else:
                sid = self.store.insert_submission(conn, state="waiting", first_id=first["id"], **common)
        self._wake.set()
        return self.store.submission(sid)

    def reject(self, reason: str, submitter: str | None = None, digest: str | None = None,
               options: dict[str, Any] | None = None) -> dict:
        """Store and answer a submission refused at the door (``invalid``, exit code 2, nothing queued)."""
        with self._lock, self.store.engine.begin() as conn:
            sid = self.store.insert_submission(
                conn, hash=digest or "-", submitter=submitter, state="done", status="invalid",
                reason=reason.splitlines()[0], exit_code=EXIT_INVALID, options=options or {}, finished=time.time())
        return self.store.submission(sid)

    # --- workers -------------------------------------------------------------------------------

    def start(self) -> "Service":
        """Start (or join) Ray, one worker per device, the dispatcher; resume what a previous run left."""
        import ray

        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=False)
            else:
                ray.init(num_cpus=self.num_cpus, include_dashboard=False,
                         logging_level=logging.WARNING, log_to_driver=False, object_store_memory=256 << 20)
            self.ray_started = True
        requeued = self.store.resume()
        if requeued:
            log.warning("kernelslot serve: resumed %d job(s) left running by a previous service", len(requeued))
        self._spawn_workers()
        self._stop.clear()
        self._thread = threading.Thread(target=self._dispatch_loop, name="kernelslot-dispatch", daemon=True)
        self._thread.start()
        return self

    def _spawn(self, node: str, device: str) -> _Worker:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from kernelslot.service.worker import DeviceWorker

        actor = ray.remote(DeviceWorker).options(
            num_cpus=0, num_gpus=1 if device == "cuda" else 0, max_restarts=0,  # the service counts CPU workers itself
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(device)
        info = ray.get(actor.describe.remote(), timeout=300)
        name = f"{device}:{node[:8]}:{info['pid']}"
        return _Worker(name=name, node=node, device=device, handle=actor, gpu_ids=tuple(info["gpus"]))

    def _nodes(self) -> list[dict]:
        import ray

        return [n for n in ray.nodes() if n.get("Alive")]

    def _spawn_workers(self) -> None:
        for n in self._nodes():
            for _ in range(self.cpu_workers):
                self.workers.append(self._spawn(n["NodeID"], "cpu"))
            for _ in range(int(n.get("Resources", {}).get("GPU", 0))):
                self.workers.append(self._spawn(n["NodeID"], "cuda"))

    def _replace(self, w: _Worker) -> None:
        import ray

        with_node = any(n["NodeID"] == w.node for n in self._nodes())
        self.workers.remove(w)
        try:
            ray.kill(w.handle, no_restart=True)
        except Exception:
            pass
        if with_node:
            try:
                self.workers.append(self._spawn(w.node, w.device))
            except Exception as exc:  # the node went away meanwhile
                log.warning("kernelslot serve: could not restart worker %s: %s", w.name, exc)

    def stop(self) -> None:
        """Stop dispatching and the workers; jobs running now stay 'running' in the store and are
        resumed by the next service on the same store."""
        import ray

        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=30)
        for w in self.workers:
            try:
                ray.kill(w.handle, no_restart=True)
            except Exception:
                pass
        self.workers.clear()
        self.running.clear()
        if self.ray_started:
            ray.shutdown()
            self.ray_started = False
        self.store.close()

    # --- dispatch ------------------------------------------------------------------------------

    def _feasible(self, needs: Needs) -> str | None:
        return None if needs.gpus == 0 else feasible(needs, self._nodes())

    def _pick(self, needs: Needs) -> list[_Worker] | None:
        idle = [w for w in self.workers if w.busy is None]
        if needs.gpus == 0:
            cpu = [w for w in idle if w.device == "cpu"]
            return cpu[:1] or None
        by_node: dict[str, list[_Worker]] = {}
        for w in idle:
            if w.device == "cuda":
                by_node.setdefault(w.node, []).append(w)
        return next((ws[:needs.gpus] for ws in by_node.values() if len(ws) >= needs.gpus), None)

    def _dispatch_once(self) -> None:
        for sub in self.store.queued():
            needs = Needs(**sub["options"].get("needs", {}))
            why = self._feasible(needs)
            if why is not None:
                with self.store.engine.begin() as conn:
                    self.store.finish(conn, sub["id"], "not run", why, 3)
                continue
            picked = self._pick(needs)
            if picked is None:
                continue
            w = picked[0]
            aid, number = self.store.start_attempt(sub["id"], w.name, w.node)
            visible = ",".join(g for p in picked for g in p.gpu_ids) if len(picked) > 1 else None
            opts = {k: v for k, v in sub["options"].items() if k != "needs"}
            ref = w.handle.run.remote(self.store.blob(sub["hash"]), opts, visible, self.job_timeout_s)
            for p in picked:
                p.busy = aid
            # the job's own process stops at job_timeout_s (a 'not run' verdict); past this margin the worker is stuck
            self.running[ref] = _Running(sub["id"], aid, w, picked, ref, time.monotonic() + self.job_timeout_s + 120.0)
            log.info("kernelslot serve: submission %d attempt %d on %s", sub["id"], number, w.name)

    def _collect(self, timeout: float) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        from kernelslot.service.worker import verdict_of

        if not self.running:
            self._wake.wait(timeout)
            self._wake.clear()
            return
        ready, _ = ray.wait(list(self.running), num_returns=1, timeout=timeout)
        for ref in ready:
            job = self.running.pop(ref)
            try:
                result = ray.get(ref)
            except (RayActorError, GetTimeoutError) as exc:  # the actor died, or its node was lost
                self._lost(job, "worker lost", _first(exc))
                continue
            except RayTaskError as exc:  # the job raised inside a live worker: a referee error, not the bundle's
                self._lost(job, "worker lost", f"the job raised: {_first(exc)}", replace=False)
                continue
            self._release(job)
            verdict, rows = verdict_of(result)
            try:
                self.store.record_verdict(job.sid, job.aid, verdict, rows)
            except StoreConflict as exc:
                log.warning("kernelslot serve: %s; result dropped", exc)
        now = time.monotonic()
        for ref, job in list(self.running.items()):
            if now > job.deadline:
                self.running.pop(ref)
                self._lost(job, "timed out", f"no result after {self.job_timeout_s:.0f} s")

    def _release(self, job: _Running) -> None:
        for p in job.reserved:
            p.busy = None

    def _lost(self, job: _Running, outcome: str, message: str, replace: bool = True) -> None:
        self._release(job)
        if replace:
            self._replace(job.worker)
        requeued = self.store.lose_attempt(job.sid, job.aid, outcome, message, self.max_attempts)
        log.warning("kernelslot serve: submission %d: %s (%s)%s", job.sid, outcome, message,
                    "; queued again" if requeued else "; no attempts left")

    def _dispatch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._dispatch_once()
                self._collect(timeout=0.5)
            except Exception:  # keep serving: one bad row must not stop the queue
                log.exception("kernelslot serve: dispatcher error")
                time.sleep(1.0)

    # --- waiting -------------------------------------------------------------------------------

    def wait(self, sid: int, timeout: float | None = None, poll_s: float = 0.2) -> dict:
        """The submission ``sid`` once it is done; TimeoutError if not within ``timeout`` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            row = self.store.submission(sid)
            if row is None:
                raise KeyError(f"no submission {sid}")
            if row["state"] == "done":
                return row
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"submission {sid} is still {row['state']} after {timeout} s")
            time.sleep(poll_s)


def feasible(needs: Needs, nodes: list[dict]) -> str | None:
    """None if one of the live Ray ``nodes`` (``ray.nodes()`` rows) can serve ``needs``, else why not."""
    gpus = {n["NodeID"]: int(n.get("Resources", {}).get("GPU", 0)) for n in nodes if n.get("Alive", True)}
    if needs.gpus == 0 and gpus or any(g >= needs.gpus for g in gpus.values()):
        return None
    have = ", ".join(f"node {node[:8]}: {g} GPU{'s' if g != 1 else ''}" for node, g in gpus.items())
    return f"not run: no node can serve it (needs {needs.describe()}; {have or 'no live node'})"


def _bad_options(opts: dict[str, Any]) -> str | None:
    if opts.get("device") not in ("cpu", "cuda"):
        return f"device {opts.get('device')!r}: must be cpu or cuda"
    unknown = set(opts) - {"device", "time", "seeds", "draws", "model", "slot", "dtype", "profile", "timeout",
                          "world_size"}
    if unknown:
        return f"unknown option(s) {', '.join(sorted(unknown))}"
    return None


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
