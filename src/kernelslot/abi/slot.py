"""The slot contract: a named boundary with an exact, ordered argument list.

A candidate ``entry`` is called with the slot's arguments in exactly this order. Outputs are
written in place (the candidate never allocates a replacement) and ``entry`` returns ``None``.
``prepare`` (where the slot has one) runs once at load time on the ``prepare_args`` and
returns an opaque object handed to ``entry`` in the ``PREPARED`` position.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(str, enum.Enum):
    INPUT = "input"  # tensor read by the candidate, must stay bit-exactly unchanged
    OUTPUT = "output"  # tensor owned by the validator, every logical cell written by the candidate
    SCALAR = "scalar"  # python scalar (eps, sm_scale, block_size, ...)
    PREPARED = "prepared"  # the object returned by the candidate's prepare()
    GROUP = "group"  # a torch.distributed process group (collective slots)


class SlotKind(str, enum.Enum):
    OP = "op"
    BLOCK = "block"
    COLLECTIVE = "collective"


@dataclass(frozen=True)
class Arg:
    name: str
    role: Role
    optional: bool = False  # the validator may pass None (e.g. an absent residual)
    shape: str = ""  # symbolic shape for the docs, where the profiles' dimensions do not spell it
    doc: str = ""  # layout or meaning beyond the role (shown by `kernelslot slots NAME`)

    def __str__(self) -> str:
        suffix = "?" if self.optional else ""
        return f"{self.name}{suffix}:{self.role.value}"


@dataclass(frozen=True)
class Slot:
    """A slot's identity and call signature."""

    name: str
    kind: SlotKind
    args: tuple[Arg, ...]
    prepare_args: tuple[str, ...] = ()  # names of prepare()'s positional parameters; () = no prepare
    summary: str = ""

    def __post_init__(self) -> None:
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ValueError(f"slot {self.name}: duplicate argument names {names}")
        if self.kind is SlotKind.COLLECTIVE and not any(a.role is Role.GROUP for a in self.args):
            raise ValueError(f"slot {self.name}: a collective slot needs a group argument")
        if self.prepare_args and not any(a.role is Role.PREPARED for a in self.args):
            raise ValueError(f"slot {self.name}: prepare_args given but no prepared argument")

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    def names(self, role: Role) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if a.role is role)

    @property
    def needs_prepare(self) -> bool:
        return bool(self.prepare_args)

    def signature(self) -> str:
        sig = f"entry({', '.join(a.name for a in self.args)})"
        if self.prepare_args:
            sig = f"prepare({', '.join(self.prepare_args)}) -> prepared; " + sig
        return sig
