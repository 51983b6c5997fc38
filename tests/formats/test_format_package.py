"""Package boundary: formats/ imports nothing else from kernelslot (DESIGN.md §2), and the
public names the MoE kernels and the slot catalog call are exported."""
from __future__ import annotations

import ast
from pathlib import Path

import kernelslot.formats as formats


def test_formats_imports_nothing_else_from_kernelslot() -> None:
    package_dir = Path(formats.__file__).parent
    for path in sorted(package_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1, f"{path.name} imports from a parent package"
                assert not (node.module or "").startswith("kernelslot"), path.name
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("kernelslot") for a in node.names), path.name


def test_public_api_is_exported() -> None:
    for name in ("quantize_mx", "dequantize_mx", "quantize_nvfp4", "dequantize_nvfp4",
                 "swizzle_scales_128x4", "unswizzle_scales_128x4", "Nvfp4MoeLayer",
                 "quantize_moe_layer_nvfp4", "dequantize_moe_layer_nvfp4"):
        assert callable(getattr(formats, name))
    assert sorted(formats.__all__) == sorted(set(formats.__all__))
    assert all(hasattr(formats, name) for name in formats.__all__)
