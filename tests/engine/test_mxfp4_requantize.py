"""GPT-OSS MXFP4: dequantised checkpoints are re-quantised bit-exactly for the native kernels."""
from __future__ import annotations

import pytest
import torch

from kernelslot.engines.transformers import install
from kernelslot.engines.transformers.installation import experts_modules
from kernelslot.engines.transformers.layout import expert_weights
from kernelslot.engines.transformers.mxfp4 import NotMxfp4Error, requantize_mxfp4, snap_to_mxfp4
from kernelslot.engines.transformers.models import build_model
from kernelslot.kernels.moe_block.expert_weights import dequantize_experts

from tests.engine.conftest import logits_of, prompts


def _mxfp4_checkpoint(dtype=torch.bfloat16):
    """GPT-OSS whose expert weights hold what Mxfp4Config(dequantize=True) produces: MXFP4
    values (blocks of 32 along each contraction dim) in bf16."""
    model = build_model("gpt-oss").to(dtype)
    with torch.no_grad():
        for _, m in experts_modules(model):
            m.gate_up_proj.copy_(snap_to_mxfp4(m.gate_up_proj.transpose(1, 2)).transpose(1, 2))
            m.down_proj.copy_(snap_to_mxfp4(m.down_proj.transpose(1, 2)).transpose(1, 2))
    return model


def test_requantisation_is_bit_exact_and_refuses_off_grid_weights() -> None:
    model = _mxfp4_checkpoint()
    dense = expert_weights(experts_modules(model)[0][1])
    mx = requantize_mxfp4(dense)
    assert mx.format == "mxfp4" and mx.gate_up.dtype == torch.uint8
    gu, dn = dequantize_experts(mx)
    assert torch.equal(gu, dense.gate_up.float()) and torch.equal(dn, dense.down.float())
    with pytest.raises(NotMxfp4Error, match="cannot represent exactly"):
        requantize_mxfp4(expert_weights(experts_modules(build_model("gpt-oss"))[0][1]))


@pytest.mark.parametrize("how", ["explicit", pytest.param("auto", marks=pytest.mark.slow)])
def test_native_mxfp4_serves_a_dequantised_checkpoint(how: str) -> None:
    model = _mxfp4_checkpoint(torch.float32)
    ids = prompts(model.config.vocab_size)
    want = logits_of(model, ids)
    if how == "auto":
        model.config.quantization_config = {"quant_method": "mxfp4", "dequantize": True}
    handle = install(model, weight_format="mxfp4" if how == "explicit" else "auto")
    got = logits_of(model, ids)
    assert all(st.weights.format == "mxfp4" for st in handle.states.values())
    assert handle.counters()["moe.fused_experts"]["builtin"]["fallback"] == 0
    handle.uninstall()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_what_mxfp4config_dequantize_loads_is_served_by_native_mxfp4() -> None:
    """The parameters are produced by transformers' own MXFP4 dequantiser (the conversion
    ``Mxfp4Config(dequantize=True)`` applies at load) from checkpoint-layout blocks and scales."""
    from transformers import Mxfp4Config
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    model = build_model("gpt-oss", sizes=dict(hidden=64, inter=64))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, m in experts_modules(model):
            e, h, two_i = m.gate_up_proj.shape
            for param, rows, cols in ((m.gate_up_proj, two_i, h), (m.down_proj, h, two_i // 2)):
                blocks = torch.randint(0, 256, (e, rows, cols // 32, 16), dtype=torch.uint8, generator=gen)
                scales = torch.randint(119, 125, (e, rows, cols // 32), dtype=torch.uint8, generator=gen)
                param.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    model.config.quantization_config = Mxfp4Config(dequantize=True)
    ids = prompts(model.config.vocab_size)
    want = logits_of(model, ids)
    handle = install(model)  # weight_format="auto": the config says the checkpoint was MXFP4
    got = logits_of(model, ids)
    assert all(st.weights.format == "mxfp4" for st in handle.states.values())
    handle.uninstall()
    torch.testing.assert_close(got, want, atol=5e-5, rtol=1e-5)
