"""GPT-OSS MXFP4 on the CPU: lossless re-quantisation of a dequantised checkpoint.

``from_pretrained(..., quantization_config=Mxfp4Config(dequantize=True))`` turns each MXFP4
block (32 E2M1 codes sharing an E8M0 scale) into ``code·2^s`` in bf16. Every such value is
exact in bf16, and quantising a block again with the OCP rule (``s = floor(log2 amax) − 2``,
:func:`kernelslot.formats.quantize_mx` in ``floor`` mode) recovers codes and scale that
reproduce it bit for bit (a block whose largest code is below 4 gets a smaller scale and
proportionally larger codes, still exact). :func:`requantize_mxfp4` does this per expert and
*asserts* exactness, so the native MXFP4 kernels serve exactly the checkpoint's weights.
"""
from __future__ import annotations

import torch

from kernelslot.formats import dequantize_mx, quantize_mx
from kernelslot.kernels.experts_spec import ExpertWeights

WEIGHT_FORMATS = ("auto", "dense", "mxfp4")


class NotMxfp4Error(ValueError):
    """The weights are not exactly representable in MXFP4 (not a dequantised MXFP4 checkpoint)."""


def wants_mxfp4(module: torch.nn.Module, weight_format: str) -> bool:
    """``mxfp4``: always; ``dense``: never; ``auto``: when the model was loaded from an MXFP4
    checkpoint (its config carries an ``mxfp4`` quantization_config)."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format={weight_format!r}; allowed: {', '.join(WEIGHT_FORMATS)}")
    if weight_format != "auto":
        return weight_format == "mxfp4"
    qc = getattr(getattr(module, "config", None), "quantization_config", None)
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return str(getattr(method, "value", method)).lower() == "mxfp4"


def _requantize(t: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    codes, scales = [], []
    for e in range(t.shape[0]):
        c, s = quantize_mx(t[e].float(), "fp4")
        back = dequantize_mx(c, s, "fp4", torch.float32)
        if not torch.equal(back, t[e].float()):
            bad = int((back != t[e].float()).sum())
            raise NotMxfp4Error(f"{what}: expert {e} has {bad} value(s) MXFP4 cannot represent exactly; "
                                "these weights are not a dequantised MXFP4 checkpoint (use weight_format='dense')")
        codes.append(c)
        scales.append(s)
    return torch.stack(codes), torch.stack(scales)


def requantize_mxfp4(weights: ExpertWeights) -> ExpertWeights:
    """Dense experts (values on the MXFP4 grid) -> ``format='mxfp4'`` with the same biases.

    Raises :class:`NotMxfp4Error` unless the round trip is bit-exact for every element.
    """
    if weights.format != "dense":
        raise ValueError(f"requantize_mxfp4: expected dense weights, got format {weights.format!r}")
    gu, gu_s = _requantize(weights.gate_up, "gate_up")
    dn, dn_s = _requantize(weights.down, "down")
    return ExpertWeights("mxfp4", gu, dn, gate_up_scale=gu_s, down_scale=dn_s,
                         gate_up_bias=weights.gate_up_bias, down_bias=weights.down_bias)


def snap_to_mxfp4(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded onto the MXFP4 grid along its last dim (what a dequantised checkpoint holds)."""
    c, s = quantize_mx(t.float(), "fp4")
    return dequantize_mx(c, s, "fp4", torch.float32).to(t.dtype)
