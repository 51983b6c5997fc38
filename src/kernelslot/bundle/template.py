"""``kernelslot new SLOT DIR``: a bundle that passes ``kernelslot verify`` as written.

The bundle holds ``manifest.toml`` (commented), one plain-torch source with ``entry`` (and
``prepare`` where the slot has one) and, for a model-specific slot, ``metadata.json`` naming the
model profile. The source comes from, in order of preference: a hand-written template in
``templates/`` (``moe.fused_experts``: both prepare forms, the model's activation filled in;
``moe.block_tkg``: every expert format and model, from the layer view),
the built-in kernel's own module when it needs nothing but torch (copied, so the author edits
real, passing code), or a thin module calling the built-in kernel (the starting point to
replace). Every generated file starts with comments saying what to change.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import json
from pathlib import Path

from kernelslot.slots import CATALOG, SlotDef
from kernelslot.slots.models import MODELS

TEMPLATES = Path(__file__).with_name("templates")
# slot -> (template file, entry name, prepare name or None)
HAND_WRITTEN = {"moe.fused_experts": ("moe_fused_experts.py", "fused_experts", "prepare"),
                "moe.block_tkg": ("moe_block_tkg.py", "block_tkg", "prepare")}
MODEL_SPECIFIC = {"moe.fused_experts"}  # the entry cannot see the model, so the bundle pins one
_TORCH_ONLY = ("torch", "math", "typing", "__future__")


class TemplateError(ValueError):
    """The template cannot be written (one line: what and why)."""


def _header(defn: SlotDef, model: str | None) -> str:
    args = ", ".join(a.name for a in defn.slot.args)
    lines = [
        f'"""A {defn.name} kernel for kernelslot, written by `kernelslot new` as a starting point.',
        "",
        f"The contract: `kernelslot slots {defn.name}` (docs/slots/{defn.slot.family}.md).",
        f"    {defn.slot.signature()}",
        f"    entry({args}) -> None",
        "",
        "What to change: replace the bodies with your kernel; keep the names and the argument order.",
        "Rules the referee checks: write every cell of each output in place, through its strides",
        "(outputs are strided views at a non-zero offset; never rebind or replace them); leave every",
        "input bit-exactly unchanged; return None; keep no reference to an argument after returning.",
    ]
    if model:
        lines.append(f"This bundle targets the {model} model profile (metadata.json + the manifest's domain).")
    lines += ['Then run `kernelslot verify DIR` (add --time to compare against the built-in kernel).', '"""']
    return "\n".join(lines) + "\n"


def _strip_docstring(source: str) -> str:
    tree = ast.parse(source)
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(getattr(tree.body[0], "value", None), ast.Constant):
        lines = source.splitlines(keepends=True)
        return "".join(lines[tree.body[0].end_lineno:]).lstrip("\n")
    return source


def _torch_only(source: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(n.split(".")[0] not in _TORCH_ONLY for n in names):
            return False
    return True


def _delegating_source(defn: SlotDef, module: str, entry: str, prepare: str | None) -> str:
    args = [a.name for a in defn.slot.args]
    imports = ", ".join(n for n in (entry, prepare) if n)
    body = [f"# Starting point: kernelslot's own plain-torch kernel ({module}). Replace these calls with yours.",
            f"from {module} import {imports}", "", ""]
    if prepare:
        p_args = ", ".join(defn.slot.prepare_args)
        body += [f"def prepare({p_args}):", f"    return {prepare}({p_args})", "", ""]
    body += [f"def entry({', '.join(args)}):", f"    {entry}({', '.join(args)})", ""]
    return "\n".join(body)


def _source(defn: SlotDef, model: str | None) -> tuple[str, str, str | None]:
    """(source text without header, entry name, prepare name)."""
    if defn.name in HAND_WRITTEN:
        file, entry, prepare = HAND_WRITTEN[defn.name]
        text = (TEMPLATES / file).read_text(encoding="utf-8")
        if defn.name not in MODEL_SPECIFIC:
            return text, entry, prepare
        act = MODELS[model or "generic"].activation
        generated = {"alpha": act.alpha, "up_bias": act.up_bias, "gate_clamp": tuple(act.gate_clamp),
                     "up_clamp": tuple(act.up_clamp)}
        text = "\n".join(f"ACTIVATION = {generated!r}  # {act.kind} of the {model or 'generic'} model profile"
                         if line.startswith("ACTIVATION = ") else line for line in text.splitlines()) + "\n"
        return text, entry, prepare
    origin = defn.incumbent.origin()
    if origin.module is None:
        raise TemplateError(f"{defn.name}: its built-in kernel has no importable module to start from")
    module_src = inspect.getsource(importlib.import_module(origin.module))
    if _torch_only(module_src) and "." not in origin.entry:
        return _strip_docstring(module_src), origin.entry, origin.prepare
    return _delegating_source(defn, origin.module, origin.entry, origin.prepare), "entry", \
        "prepare" if origin.prepare else None


def _manifest(defn: SlotDef, source: str, entry: str, prepare: str | None, model: str | None) -> str:
    row = lambda code, comment="": f"{code + ' ':<36}# {comment}" if comment else code
    see = f"see `kernelslot slots {defn.name}`"
    lines = [
        f"# A bundle for {defn.name}, written by `kernelslot new`. Change bundle_id, then edit {source}.",
        row(f'bundle_id = "my-{defn.name.replace(".", "-").replace("_", "-")}"', "a name for your bundle"),
        row('abi_version = "cacheon-op-abi-v0"', "the slot ABI this bundle is written against"),
        "",
        "[[ops]]",
        row(f'slot = "{defn.name}"'),
        row(f'source = "{source}"', "inside the bundle"),
        row(f'entry = "{entry}"', f'entry({", ".join(a.name for a in defn.slot.args)}) -> None'),
    ]
    if prepare:
        lines.append(row(f'prepare = "{prepare}"', f"{defn.slot.signature().split(';')[0]}, once at load (every form: {see})"))
    lines += [row('# dtypes = ["bfloat16"]', "only these dtypes (default: every dtype the slot verifies)"),
              row("# graph_safe = true", "only if entry is CUDA-graph capturable (checked on CUDA)")]
    if model:
        lines += [row('metadata = "metadata.json"', 'its "model" selects the model profile verified'),
                  row("[ops.domain]", f"the calls this kernel accepts ({see}: CallDescriptor fields)"),
                  row(f'model = {{ exact = "{model}" }}', "the activation in the source is this model's"),
                  "# num_tokens = { range = [1, 64] }"]
    else:
        lines += [row("# [ops.domain]", f"the calls this kernel accepts ({see}: CallDescriptor fields)"),
                  "# num_tokens = { range = [1, 64] }"]
    return "\n".join(lines) + "\n"


def write_bundle(slot: str, directory: Path, model: str | None = None, force: bool = False) -> list[Path]:
    """Write the bundle; refuses a non-empty directory unless ``force``. Returns the files written."""
    if slot not in CATALOG:
        raise TemplateError(f"unknown slot {slot!r}; valid: {', '.join(sorted(CATALOG))}")
    defn = CATALOG[slot]
    models = sorted({p.model for p in defn.profiles})
    if model is not None and model not in models:
        raise TemplateError(f"--model {model!r}: {slot} has no profiles for it; valid: {', '.join(models)}")
    if model is None and defn.name in MODEL_SPECIFIC and len(models) > 1:
        model = "generic"  # a model-specific template: pin the generic profile unless told otherwise
    if directory.exists() and not directory.is_dir():
        raise TemplateError(f"{directory}: exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()) and not force:
        raise TemplateError(f"{directory}: not empty; choose a new directory (or --force to overwrite the template's files)")
    if not directory.parent.is_dir():
        raise TemplateError(f"{directory}: parent directory {directory.parent} does not exist")
    text, entry, prepare = _source(defn, model)
    source = f"{defn.name.split('.', 1)[1]}.py"
    files = {source: _header(defn, model) + "\n" + text,
             "manifest.toml": _manifest(defn, source, entry, prepare, model)}
    if model:
        files["metadata.json"] = json.dumps({"model": model}, indent=2) + "\n"
    directory.mkdir(exist_ok=True)
    written = []
    for name, body in files.items():
        (directory / name).write_text(body, encoding="utf-8")
        written.append(directory / name)
    return written
