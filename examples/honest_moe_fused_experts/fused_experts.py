"""A moe.fused_experts kernel for kernelslot, written by `kernelslot new` as a starting point.

The contract: `kernelslot slots moe.fused_experts` (docs/slots/moe.md).
    prepare(w13, w2) -> prepared; entry(x, topk_ids, topk_weights, prepared, out)
    entry(x, topk_ids, topk_weights, prepared, out) -> None

What to change: replace the bodies with your kernel; keep the names and the argument order.
Rules the referee checks: write every cell of each output in place, through its strides
(outputs are strided views at a non-zero offset; never rebind or replace them); leave every
input bit-exactly unchanged; return None; keep no reference to an argument after returning.
This bundle targets the MiniMax-M3 model profile (metadata.json + the manifest's domain).
Then run `kernelslot verify DIR` (add --time to compare against the built-in kernel).
"""

# A plain-torch moe.fused_experts kernel: both prepare forms (dense and the NVFP4 layer view).
# What to change: keep the signatures; replace prepare() with your weight packing and entry()
# with your kernel. ACTIVATION is the model profile's expert activation (kernelslot slots
# moe.fused_experts, "Model profiles"); the entry cannot see the model, so the manifest pins it.
import torch

from kernelslot.formats import Nvfp4MoeLayer, unswizzle_scales_128x4

ACTIVATION = {'alpha': 1.702, 'up_bias': 1.0, 'gate_clamp': (None, 7.0), 'up_clamp': (-7.0, 7.0)}  # swigluoai of the MiniMax-M3 model profile

# E2M1 code -> value (sign bit 3; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6); even index in the low nibble.
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _dequantize(packed, scales_swizzled, outer, rows, cols):
    """uint8 (E, rows, cols/2) + swizzled e4m3 block scales + fp32 outer (E,) -> fp32 (E, rows, cols)."""
    e = packed.shape[0]
    values = torch.stack((_E2M1[(packed & 0xF).long()], _E2M1[(packed >> 4).long()]), dim=-1).reshape(e, rows, cols)
    scales = unswizzle_scales_128x4(scales_swizzled, rows, cols // 16).float()  # (E, rows, cols/16)
    return (values.view(e, rows, cols // 16, 16) * scales.unsqueeze(-1)).reshape(e, rows, cols) * outer.view(e, 1, 1)


def prepare(w13, w2):
    """prepare(w13 (E, 2I, H), w2 (E, H, I)) or prepare("nvfp4_layer", view) -> fp32 weights."""
    if isinstance(w13, str):
        if w13 != "nvfp4_layer" or not isinstance(w2, Nvfp4MoeLayer):
            raise ValueError(f"unsupported prepare form {w13!r}")
        view, i = w2, w2.intermediate_size
        h = view.hidden_size
        gate_up = _dequantize(view.w13_weight, view.w13_weight_scale, view.g1_alphas * view.a1_inv, 2 * i, h)
        down = _dequantize(view.w2_weight, view.w2_weight_scale, view.g2_alphas * view.a2_inv, h, i)
        return gate_up, down
    return w13.float().clone(), w2.float().clone()  # our own copies: the referee's tensors stay untouched


def _act(g, u):
    lo, hi = ACTIVATION["gate_clamp"]
    g = g.clamp(min=lo, max=hi) if (lo is not None or hi is not None) else g
    lo, hi = ACTIVATION["up_clamp"]
    u = u.clamp(min=lo, max=hi) if (lo is not None or hi is not None) else u
    return g * torch.sigmoid(ACTIVATION["alpha"] * g) * (u + ACTIVATION["up_bias"])


def fused_experts(x, topk_ids, topk_weights, prepared, out):
    """out[m] = sum_k topk_weights[m,k] * W2[e] act(W13[e] x[m]), e = topk_ids[m,k]; -1 ids skipped."""
    gate_up, down = prepared
    inter = down.shape[2]
    acc = torch.zeros(out.shape, dtype=torch.float32)
    xf = x.float()
    for e in topk_ids.unique().tolist():
        if e < 0:
            continue  # an expert on another rank: contributes nothing here
        rows, slot = (topk_ids == e).nonzero(as_tuple=True)
        gu = xf[rows] @ gate_up[e].T  # (n, 2I): gate then up
        y = _act(gu[:, :inter], gu[:, inter:]) @ down[e].T  # (n, H)
        acc.index_add_(0, rows, y * topk_weights[rows, slot].float().unsqueeze(1))
    out.copy_(acc)  # copy_ writes through out's strides, whatever they are
