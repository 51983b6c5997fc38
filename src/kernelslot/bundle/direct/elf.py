"""What a sealed ELF object really exports, read as data with pyelftools (nothing is loaded).

For a ``native.elf.v1`` shared object the physical inventory is every *defined*, global or
weak, default-visibility function in ``.dynsym`` (the builder compiles with
``-fvisibility=hidden``, so only functions marked ``__attribute__((visibility("default")))``
are exported), sorted by name; each one's formal parameters come from its DWARF
``DW_TAG_subprogram`` (the builder compiles with ``-g``): byte width and class (``pointer``,
``int``, ``float``, ``struct``), followed through typedefs and qualifiers. A variadic
function, one without debug information, or one returning a value, has no admissible
signature. For a CUBIN the kernels are its ``.nv.info.NAME`` entry records and each parameter's
size comes from their ``EIATTR_KPARAM_INFO`` attributes (read as data here, and observed again
through the Driver API at admission on a GPU).
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from kernelslot.bundle.direct.spec import PROVIDERS

_TOOLCHAIN = frozenset({"_init", "_fini"})
_SKIP_TYPES = ("DW_TAG_typedef", "DW_TAG_const_type", "DW_TAG_volatile_type", "DW_TAG_restrict_type", "DW_TAG_atomic_type")


class InventoryError(ValueError):
    """The object cannot be read as the provider's artifact kind."""


@dataclass(frozen=True)
class PhysicalKernel:
    name: str
    params: tuple[int, ...]  # byte widths
    classes: tuple[str, ...]  # pointer | int | float | struct
    problem: str | None = None  # why the signature is not admissible (variadic, no DWARF, returns a value)


def _elf(data: bytes) -> ELFFile:
    try:
        return ELFFile(io.BytesIO(data))
    except ELFError as exc:
        raise InventoryError(f"not an ELF object ({exc})") from None


def exported_functions(elf: ELFFile) -> list[str]:
    dynsym = elf.get_section_by_name(".dynsym")
    if dynsym is None:
        raise InventoryError("the object has no dynamic symbol table (not a shared object?)")
    names = {s.name for s in dynsym.iter_symbols()
             if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF"
             and s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK") and s["st_other"]["visibility"] == "STV_DEFAULT"}
    return sorted(names - _TOOLCHAIN)


def _type_class(die) -> tuple[int, str]:  # noqa: ANN001 - pyelftools DIE
    seen = 0
    while die is not None and die.tag in _SKIP_TYPES and seen < 32:
        die = die.get_DIE_from_attribute("DW_AT_type") if "DW_AT_type" in die.attributes else None
        seen += 1
    if die is None:
        return 0, "void"
    size = die.attributes["DW_AT_byte_size"].value if "DW_AT_byte_size" in die.attributes else 0
    if die.tag in ("DW_TAG_pointer_type", "DW_TAG_reference_type", "DW_TAG_rvalue_reference_type"):
        return size or die.cu.structs.address_size, "pointer"
    if die.tag == "DW_TAG_base_type":
        enc = die.attributes["DW_AT_encoding"].value if "DW_AT_encoding" in die.attributes else 0
        return size, "float" if enc in (0x04, 0x03) else "int"  # DW_ATE_float, DW_ATE_complex_float
    if die.tag == "DW_TAG_enumeration_type":
        return size, "int"
    if die.tag in ("DW_TAG_structure_type", "DW_TAG_union_type", "DW_TAG_class_type"):
        return size, "struct"
    return size, die.tag.removeprefix("DW_TAG_")


def _origin(die):  # noqa: ANN001
    for attr in ("DW_AT_abstract_origin", "DW_AT_specification"):
        if attr in die.attributes:
            return die.get_DIE_from_attribute(attr)
    return die


def _subprograms(elf: ELFFile, names: set[str]) -> dict[str, PhysicalKernel]:
    found: dict[str, PhysicalKernel] = {}
    if not elf.has_dwarf_info():
        return found
    for cu in elf.get_dwarf_info().iter_CUs():
        for die in cu.iter_DIEs():
            if die.tag != "DW_TAG_subprogram" or "DW_AT_declaration" in die.attributes:
                continue
            head = _origin(die)
            name_attr = head.attributes.get("DW_AT_name")
            name = name_attr.value.decode(errors="replace") if name_attr else None
            if name not in names or name in found:
                continue
            params, classes, problem = [], [], None
            for child in head.iter_children():
                if child.tag == "DW_TAG_unspecified_parameters":
                    problem = "is variadic"
                elif child.tag == "DW_TAG_formal_parameter":
                    w, c = _type_class(child.get_DIE_from_attribute("DW_AT_type")) if "DW_AT_type" in child.attributes else (0, "?")
                    params.append(w)
                    classes.append(c)
            if "DW_AT_type" in head.attributes and _type_class(head.get_DIE_from_attribute("DW_AT_type"))[1] != "void":
                problem = problem or "returns a value (kernels return void; results go into the outputs)"
            found[name] = PhysicalKernel(name, tuple(params), tuple(classes), problem)
    return found


def native_inventory(data: bytes) -> list[PhysicalKernel]:
    """Every exported function of a shared object with its DWARF-observed parameter widths."""
    elf = _elf(data)
    if elf["e_type"] != "ET_DYN":
        raise InventoryError(f"not a shared object (e_type {elf['e_type']})")
    names = exported_functions(elf)
    subs = _subprograms(elf, set(names))
    return [subs.get(n, PhysicalKernel(n, (), (), "has no DWARF debug information")) for n in names]


def init_entries(data: bytes) -> int:
    """How many load-time constructors the object runs (``.init_array`` entries, plus ``.ctors``)."""
    elf = _elf(data)
    n = 0
    for name in (".init_array", ".ctors", ".preinit_array"):
        sec = elf.get_section_by_name(name)
        if sec is not None:
            n += sec.data_size // (elf.elfclass // 8)
    return n


_EIFMT_SVAL, _EIATTR_KPARAM_INFO = 0x04, 0x17


def cubin_inventory(data: bytes) -> list[PhysicalKernel]:
    """Every kernel of a CUBIN with its parameter sizes (``EIATTR_KPARAM_INFO``), sorted by name."""
    elf = _elf(data)
    if elf["e_machine"] not in ("EM_CUDA", 190):
        raise InventoryError(f"not a CUBIN (e_machine {elf['e_machine']})")
    kernels = []
    for sec in elf.iter_sections():
        if not sec.name.startswith(".nv.info."):
            continue
        raw, at, params = sec.data(), 0, {}
        while at + 4 <= len(raw):
            fmt, attr, size = struct.unpack_from("<BBH", raw, at)
            if fmt != _EIFMT_SVAL:
                at += 4
                continue
            if attr == _EIATTR_KPARAM_INFO and size >= 12:
                _, ordinal, _, flags = struct.unpack_from("<IHHI", raw, at + 4)
                params[ordinal] = (flags >> 18) & 0x3FFF
            at += 4 + size
        widths = tuple(params[i] for i in sorted(params))
        problem = None if sorted(params) == list(range(len(params))) else "has gaps in its parameter ordinals"
        kernels.append(PhysicalKernel(sec.name.removeprefix(".nv.info."), widths, (), problem))
    return sorted(kernels, key=lambda k: k.name)


def static_inventory(provider: str, data: bytes) -> list[dict]:
    """The inventory recorded in the seal index (for ``kernelslot scan``; admission observes it again)."""
    if PROVIDERS[provider].device == "cuda":
        return [{"name": k.name, "params": list(k.params)} for k in cubin_inventory(data)]
    return [{"name": k.name, "params": list(k.params), "classes": list(k.classes), **({"problem": k.problem} if k.problem else {})}
            for k in native_inventory(data)]
