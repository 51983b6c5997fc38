"""The data contract shared by moe_block/, native/ and the engine adapters (experts, scaling mode).

Every MoE expert path reads these types: the torch stages in :mod:`kernelslot.kernels.moe_block`,
the native CPU kernels in :mod:`kernelslot.kernels.native`, the engine adapters in
:mod:`kernelslot.engines.transformers`, and the slots. The module is data only and imports no
other kernel module, so ``native/`` reads it without importing ``moe_block/`` (it was
``moe_block/spec.py``; :class:`ScalingMode` moved here from ``moe_block/config.py``).

Dimensions:
    E (= E_L, the local experts held), H hidden, I intermediate.

Layout convention (seed 003 / ``moe.fused_experts``, docs/slots/moe.md; seed 003 is the MoE
decode megakernel source document the project was created from,
``../shared/seeds/003_fbad06efb3d9daf3.txt``): ``gate_up`` holds, per local expert, the gate
rows then the up rows, ``(E_L, 2I, H)``; ``down`` is ``(E_L, H, I)``; biases ``gate_up_bias``
``(E, 2I)`` (gate then up) and ``down_bias`` ``(E, H)``. Quantised formats keep the same
logical row order; block scales run along the last (contraction) dimension:

====== ===================== =========================== ===========================
format gate_up / down data   gate_up_scale / down_scale  outer (per expert)
====== ===================== =========================== ===========================
dense  float (E,2I,H)/(E,H,I) None                        None
fp8_row float8_e4m3fn         fp32 (E,2I) / (E,H) per row None
mxfp4  uint8 (E,2I,H/2) ...   uint8 E8M0 (E,2I,H/32) ...  None
mxfp8  uint8 (E,2I,H)  ...    uint8 E8M0 (E,2I,H/32) ...  None
nvfp4  uint8 (E,2I,H/2) ...   float8_e4m3fn (E,2I,H/16)   fp32 (E,) = g_alpha·a_inv
====== ===================== =========================== ===========================

FP4 bytes hold the even-index element in the low nibble (docs/formats.md). NVFP4 block scales
are stored *unswizzled* here; the 128×4 swizzle is a property of the slot's view, undone
once at prepare time.

Arguments / Returns: :class:`ExpertWeights` (fields above; ``num_experts``, ``hidden_size``,
``intermediate_size``), :class:`ExpertActivation` (kind, α, up bias β, clamps),
:class:`ScalingMode` (``parse`` accepts a member or its name). Construction validates.

Pseudocode (what the types mean, per expert ``e`` and token row ``h``)::

    g, u = split(h·gate_up[e]ᵀ + gate_up_bias[e])        # gate rows then up rows
    a    = act(clamp(g, gate_clamp)) · (clamp(u, up_clamp) + up_bias)
    y_e  = a·down[e]ᵀ + down_bias[e]
    out  = Σ_routed y_e (NO_SCALE)  |  Σ_routed affinity_e · y_e (POST_SCALE)
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import torch

EXPERT_FORMATS = ("dense", "fp8_row", "mxfp4", "mxfp8", "nvfp4")
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_tanh", "swigluoai")


@dataclass(frozen=True)
class ExpertWeights:
    """Weights of ``E_L`` local experts in one of :data:`EXPERT_FORMATS` (see module doc)."""

    format: str
    gate_up: torch.Tensor
    down: torch.Tensor
    gate_up_scale: Optional[torch.Tensor] = None
    down_scale: Optional[torch.Tensor] = None
    gate_up_outer: Optional[torch.Tensor] = None
    down_outer: Optional[torch.Tensor] = None
    gate_up_bias: Optional[torch.Tensor] = None  # (E, 2I) gate bias then up bias
    down_bias: Optional[torch.Tensor] = None  # (E, H)

    def __post_init__(self) -> None:
        if self.format not in EXPERT_FORMATS:
            raise ValueError(f"ExpertWeights.format={self.format!r}; allowed: {EXPERT_FORMATS}")
        if self.gate_up.dim() != 3 or self.down.dim() != 3:
            raise ValueError("ExpertWeights: gate_up and down must be 3-D (E, rows, cols)")
        if self.gate_up.shape[0] != self.down.shape[0]:
            raise ValueError(
                f"ExpertWeights: expert counts differ: gate_up {tuple(self.gate_up.shape)}, down {tuple(self.down.shape)}"
            )

    @property
    def num_experts(self) -> int:
        return self.gate_up.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.down.shape[1]

    @property
    def intermediate_size(self) -> int:
        return self.gate_up.shape[1] // 2


@dataclass(frozen=True)
class ExpertActivation:
    """The gated activation between gate/up and down: ``act(clamp(g)) · (clamp(u) + up_bias)``.

    ``alpha`` scales the sigmoid argument where the activation has one (``swish``/``swigluoai``:
    ``g·σ(α·g)``; ``silu`` is ``α = 1``). Clamps are ``(lower, upper)`` with either bound optional
    and are applied whenever given. ``swigluoai(α, limit)`` is ``alpha=α, up_bias=1,
    gate_clamp=(None, limit), up_clamp=(-limit, limit)``.
    """

    kind: str = "silu"
    alpha: float = 1.0
    up_bias: float = 0.0
    gate_clamp: tuple[Optional[float], Optional[float]] = (None, None)
    up_clamp: tuple[Optional[float], Optional[float]] = (None, None)

    def __post_init__(self) -> None:
        if self.kind not in ACTIVATIONS:
            raise ValueError(f"ExpertActivation.kind={self.kind!r}; allowed: {ACTIVATIONS}")

    @staticmethod
    def swigluoai(alpha: float = 1.702, limit: float = 7.0) -> "ExpertActivation":
        return ExpertActivation("swigluoai", alpha, 1.0, (None, limit), (-limit, limit))


class ScalingMode(enum.Enum):
    """How routed affinities weight the expert outputs (seed ``ExpertAffinityScaleMode``).

    Only NO_SCALE and POST_SCALE exist in decode; the other two are named so that a caller who
    asks for them gets a precise rejection rather than a silent fallback.
    """

    NO_SCALE = 0  # out = Σ_routed expert(h)            (unweighted, over each token's routed set)
    POST_SCALE = 1  # out = Σ_routed affinity·expert(h)
    PRE_SCALE = 2  # rejected: scales the expert *input*; not a decode mode
    PRE_SCALE_DELAYED = 3  # rejected: prefill (CTE) only

    @classmethod
    def parse(cls, value: "ScalingMode | str") -> "ScalingMode":
        if isinstance(value, ScalingMode):
            return value
        try:
            return cls[str(value).upper()]
        except KeyError:
            raise ValueError(f"unknown scaling mode {value!r}; allowed: NO_SCALE, POST_SCALE") from None
