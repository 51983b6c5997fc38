"""The slot catalog: every slot the referee knows, by name."""
from __future__ import annotations

from importlib import import_module

from kernelslot.slots.base import Candidate, Case, Kernel, Profile, SlotDef

# One module per family; each exports SLOTS: tuple[SlotDef, ...].
FAMILY_MODULES = (
    "kernelslot.slots.activation",
    "kernelslot.slots.norm",
    "kernelslot.slots.attention",
    "kernelslot.slots.msa",
    "kernelslot.slots.collective",
    "kernelslot.slots.moe",
    "kernelslot.slots.moe_block",
)


def _load_catalog() -> dict[str, SlotDef]:
    catalog: dict[str, SlotDef] = {}
    for mod in FAMILY_MODULES:
        for defn in import_module(mod).SLOTS:
            if defn.name in catalog:
                raise RuntimeError(f"slot {defn.name} defined twice ({mod})")
            catalog[defn.name] = defn
    return catalog


CATALOG: dict[str, SlotDef] = _load_catalog()


class UnknownSlotError(KeyError):
    def __str__(self) -> str:
        return self.args[0]


def get_slot(name: str) -> SlotDef:
    try:
        return CATALOG[name]
    except KeyError:
        raise UnknownSlotError(f"unknown slot {name!r}; known slots: {', '.join(sorted(CATALOG))}") from None


__all__ = ["CATALOG", "Candidate", "Case", "Kernel", "Profile", "SlotDef", "get_slot", "UnknownSlotError"]
