"""Binding the declared logical inventory to the observed physical one (both providers).

Logical kernels are sorted by name (the manifest requires it); physical kernels come sorted
from the provider's observation. They are bound by ordinal, after requiring the same count
and the same set of names where names are stable (ELF symbols), and then every formal
parameter width must match the declaration exactly. The messages name the kernel, the
parameter and both widths.
"""
from __future__ import annotations

from kernelslot.bundle.direct.elf import InventoryError, PhysicalKernel, cubin_inventory, init_entries, native_inventory
from kernelslot.bundle.direct.spec import PROVIDERS, Binding, DirectOp, KernelDecl

# The class a native parameter must have for each binding kind (widths are checked separately).
_CLASS_OF = {"pointer": "pointer", "packed_struct": "struct", "fast_divmod": "struct"}


class AdmissionError(ValueError):
    """The loaded object is not the declared artifact (one line: which kernel, which parameter)."""


def bind_inventory(logical: tuple[KernelDecl, ...], physical: list[PhysicalKernel], *, names_stable: bool) -> dict[str, PhysicalKernel]:
    """Logical name -> the physical kernel bound to it by ordinal; raises :class:`AdmissionError`."""
    lnames, pnames = [k.name for k in logical], [k.name for k in physical]
    if names_stable and set(lnames) != set(pnames) or len(lnames) != len(pnames):
        extra = sorted(set(pnames) - set(lnames)) if names_stable else []
        missing = sorted(set(lnames) - set(pnames)) if names_stable else []
        detail = "; ".join(([f"extra exported kernel(s) {', '.join(extra)} (not declared)"] if extra else [])
                           + ([f"missing kernel(s) {', '.join(missing)} (declared, not exported)"] if missing else []))
        raise AdmissionError(f"the object exports {len(pnames)} kernel(s), the manifest declares {len(lnames)}"
                             + (f": {detail}" if detail else f" ({', '.join(pnames)})"))
    bound = {}
    for decl, phys in zip(logical, physical):
        if phys.problem:
            raise AdmissionError(f"kernel {phys.name} {phys.problem}")
        if len(phys.params) != len(decl.params):
            raise AdmissionError(f"kernel {decl.name} (physical {phys.name}) takes {len(phys.params)} parameter(s) in the "
                                 f"object, the manifest declares {len(decl.params)}")
        for n, (seen, declared) in enumerate(zip(phys.params, decl.params)):
            if seen != declared:
                raise AdmissionError(f"kernel {decl.name} parameter {n} is {seen} bytes wide in the object, the manifest "
                                     f"declares {declared}")
        bound[decl.name] = phys
    return bound


def admit_native_bytes(op: DirectOp, data: bytes, baseline: dict) -> dict[str, PhysicalKernel]:
    """Every check of a shared object that can be made on its bytes (the worker repeats them on what it loads)."""
    try:
        physical = native_inventory(data)
    except InventoryError as exc:
        raise AdmissionError(str(exc)) from None
    bound = bind_inventory(op.kernels(), physical, names_stable=True)
    check_classes(op, bound)
    ctors = init_entries(data)
    if ctors > int(baseline.get("init_entries", 0)):
        raise AdmissionError(f"the object runs {ctors - int(baseline.get('init_entries', 0))} load-time constructor(s) of its "
                             "own; a direct artifact runs code only when the referee launches it")
    return bound


def admit_static(op: DirectOp, data: bytes, baseline: dict) -> None:
    """The referee's look at a freshly sealed artifact, as data (nothing is loaded in the referee)."""
    if PROVIDERS[op.provider].device == "cpu":
        admit_native_bytes(op, data, baseline)
        return
    try:
        physical = cubin_inventory(data)
    except InventoryError as exc:
        raise AdmissionError(str(exc)) from None
    bind_inventory(op.kernels(), physical, names_stable=False)


def check_classes(op: DirectOp, bound: dict[str, PhysicalKernel]) -> None:
    """Native calls also need the right register class: a pointer where a pointer is, a float where a float is."""
    for e in op.exports:
        for j, ln in enumerate(e.launches):
            phys = bound[ln.kernel]
            for n, p in enumerate(ln.params):
                b: Binding = e.bindings[p]
                want = _CLASS_OF.get(b.kind) or ("float" if (b.type or "").startswith("f") else "int")
                if phys.classes and phys.classes[n] != want:
                    raise AdmissionError(f"export {e.name} launch {j}: kernel {ln.kernel} parameter {n} is a "
                                         f"{phys.classes[n]} in the object but binding {p} is a {want} ({b.describe()})")
