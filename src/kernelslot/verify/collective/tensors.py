"""One rank's tensors for one profile × seed, owned by the collective referee, and what a rank's reply says of a call.

The referee allocates every rank's inputs, prepare arguments (weights) and outputs (padded, inside
canary buffers, and the plain contiguous ones of the engine-like call) itself, in shared memory the
rank maps (:mod:`kernelslot.isolation.wire`: CPU storages as file descriptors, CUDA storages as IPC
handles), describes a call's arguments to the rank by storage key, and turns the rank's JSON reply
into a :class:`~kernelslot.isolation.runner.CallObservation` over this process's addresses.
"""
from __future__ import annotations

from typing import Any

import torch

from kernelslot.abi import Role, allocate_output
from kernelslot.abi.tensor_spec import allocate_plain
from kernelslot.isolation.observe import translate_meta
from kernelslot.isolation.runner import CallObservation, state_changed_text
from kernelslot.isolation.wire import share_storage, tensor_desc
from kernelslot.slots.base import SlotDef
from kernelslot.slots.collective import RankShare
from kernelslot.verify.cases import call_args, tensors_in, to_device
from kernelslot.verify.checks import snapshot
from kernelslot.verify.collective.session import CollectiveSession
from kernelslot.verify.plan import PlannedCall

__all__ = ["RankTensors", "state_text"]


class RankTensors:
    """One rank's tensors for one profile × seed, owned by the referee (shared memory in local mode)."""

    def __init__(self, share: RankShare, defn: SlotDef, outputs: dict, device: torch.device,
                 session: CollectiveSession | None):
        self.defn, self.session = defn, session
        self.inputs = to_device(share.inputs, device)
        self.prepare_args = to_device(share.prepare_args, device)
        self.outputs = {n: allocate_output(spec, device) for n, spec in outputs.items() if spec is not None}
        self.plain = {n: allocate_plain(spec, device) for n, spec in outputs.items() if spec is not None}
        self.keys: dict[int, int] = {}  # StorageImpl address -> key
        self.bases: dict[int, int] = {}  # key -> data pointer of the shared storage here
        self._pending: list[tuple[dict, int | None]] = []
        tensors = list(tensors_in(self.inputs).values()) + list(tensors_in(self.prepare_args).values())
        for t in tensors + [a.base for a in (*self.outputs.values(), *self.plain.values())]:
            self._key(t)  # shared before any identity is recorded (data pointers move once)
        self.prep_snap = snapshot(tensors_in(self.prepare_args))

    def _key(self, t: torch.Tensor) -> int:
        storage = t.untyped_storage()
        key = self.keys.get(storage._cdata)
        if key is None:
            key = self.session.new_key() if self.session else len(self.keys) + 1
            if self.session is not None:
                entry, fd = share_storage(storage)
                self._pending.append(({**entry, "key": key}, fd))
            self.keys[storage._cdata] = key
            self.bases[key] = storage.data_ptr()
        return key

    def take_storages(self) -> tuple[list[dict], list[int]]:
        """Storages not yet registered with the rank, and their fds (CPU storages only)."""
        pending, self._pending = self._pending, []
        return [e for e, _ in pending], [fd for _, fd in pending if fd is not None]

    def args(self, call: PlannedCall) -> list[Any]:
        """The call's arguments here; PREPARED / GROUP: the role itself, filled in where the call runs."""
        return call_args(self.defn, self.inputs, self.plain if call.plain else self.outputs, lambda a: a.role)

    def describe_args(self, values: list[Any]) -> list[dict]:
        """The arguments as the rank's request names them (tensors by storage key and view; never values)."""
        descs = []
        for v in values:
            if isinstance(v, torch.Tensor):
                descs.append(tensor_desc(self._key(v), v))
            elif v is Role.PREPARED:
                descs.append({"prepared": True})
            elif v is Role.GROUP:
                descs.append({"group": True})
            elif v is None:
                descs.append({"none": True})
            elif isinstance(v, (bool, int, float, str)):
                descs.append({"v": v})
            else:
                raise TypeError(f"cannot describe a {type(v).__name__} argument to a rank; collective cases hold tensors and scalars")
        return descs

    def observation(self, reply: dict, values: list[Any]) -> CallObservation:
        """A rank's JSON reply as a :class:`CallObservation` over this process's addresses (malformed = protocol)."""
        obs = CallObservation()
        if reply.get("error"):
            obs.error, obs.cause = str(reply["error"])[:20000], str(reply.get("cause") or "exception")[:40]
        if reply.get("returned") is not None:
            obs.returned = str(reply["returned"])[:200]
        meta = reply.get("meta")
        if not isinstance(meta, list) or len(meta) != len(values):
            raise ValueError("its observation lists no identity for every argument")
        obs.meta_after = [translate_meta(m, v, lambda key: self.bases.get(key, 0)) for m, v in zip(meta, values)]
        retained = reply.get("retained", [])
        if not isinstance(retained, list):
            raise ValueError("'retained' is not a list")
        obs.retained = [int(i) for i in retained if isinstance(i, int) and 0 <= i < len(values)]
        changed = state_text(reply)
        obs.state_changed = [changed] if changed else []
        return obs

    def tensors(self, plain: bool) -> list[tuple[str, torch.Tensor]]:
        """Every tensor of this rank a call could write: inputs, weights and whole output buffers (padding included)."""
        outs = self.plain if plain else self.outputs
        return [*tensors_in(self.inputs).items(), *(("weights " + k, t) for k, t in tensors_in(self.prepare_args).items()),
                *((n, a.base) for n, a in outs.items())]


def state_text(reply: dict) -> str:
    """A rank's report of the process-wide numeric state candidate code changed (``global_state``), as the
    failure message; '' when it reports none. Raises ``TypeError`` on a malformed report (protocol)."""
    changed, unrestored = reply.get("global_state") or [], reply.get("global_state_unrestored") or []
    if not isinstance(changed, list) or not isinstance(unrestored, list):
        raise TypeError("'global_state' is not a list")
    return state_changed_text([str(c)[:300] for c in changed[:32]], [str(u)[:120] for u in unrestored[:32]]) if changed else ""
