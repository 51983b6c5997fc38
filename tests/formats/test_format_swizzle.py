"""128x4 blocked scale swizzle: the offset formula, torchao's to_blocked/from_blocked, inverse,
expert stacks, and errors."""
from __future__ import annotations

import pytest
import torch

from kernelslot.formats import swizzle_scales_128x4, swizzled_shape, unswizzle_scales_128x4


def _by_formula(scales: torch.Tensor) -> torch.Tensor:
    """Place every entry at tile*(512) + r1*16 + r0*4 + c with plain integer arithmetic."""
    rows, cols = scales.shape
    r_pad, c_pad = swizzled_shape(rows, cols)
    flat = torch.zeros(r_pad * c_pad, dtype=scales.dtype)
    tiles_per_row = c_pad // 4
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * tiles_per_row + c // 4
            r0, r1 = (r % 128) // 32, r % 32
            flat[tile * 512 + r1 * 16 + r0 * 4 + c % 4] = scales[r, c]
    return flat.view(r_pad, c_pad)


def test_offsets_follow_the_formula() -> None:
    g = torch.Generator().manual_seed(30)
    scales = torch.randint(1, 256, (130, 6), dtype=torch.uint8, generator=g)
    swz = swizzle_scales_128x4(scales)
    assert swz.shape == (256, 8)
    assert torch.equal(swz, _by_formula(scales))
    # a single tile: entry (r=32*r0+r1, c) at r1*16 + r0*4 + c
    one = torch.arange(512, dtype=torch.int32).view(128, 4)
    flat = swizzle_scales_128x4(one).flatten()
    assert flat[5 * 16 + 2 * 4 + 3].item() == one[2 * 32 + 5, 3].item()


@pytest.mark.parametrize("shape", [(128, 4), (256, 12), (100, 3), (7, 33), (384, 1)])
def test_matches_torchao_and_inverts(torchao_mx, shape) -> None:
    g = torch.Generator().manual_seed(31)
    scales = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    swz = swizzle_scales_128x4(scales)
    assert swz.shape == swizzled_shape(*shape) and swz.is_contiguous()
    assert torch.equal(swz.flatten(), torchao_mx["utils"].to_blocked(scales))
    assert torch.equal(unswizzle_scales_128x4(swz, *shape), scales)
    assert torch.equal(torchao_mx["utils"].from_blocked(swz.flatten(), *shape), scales)
    pad = torch.ones(swizzled_shape(*shape), dtype=torch.bool)
    pad.view(-1)[swizzle_scales_128x4(torch.ones(shape, dtype=torch.uint8)).view(-1).bool()] = False
    assert int(swz[pad].sum()) == 0  # padding is zero bytes


def test_e4m3_expert_stack_swizzles_each_matrix() -> None:
    g = torch.Generator().manual_seed(32)
    scales = (torch.rand(3, 200, 10, generator=g) * 400).to(torch.float8_e4m3fn)
    swz = swizzle_scales_128x4(scales)
    assert swz.dtype == torch.float8_e4m3fn and swz.shape == (3, 256, 12)
    for e in range(3):
        assert torch.equal(swz[e].view(torch.uint8), swizzle_scales_128x4(scales[e]).view(torch.uint8))
    back = unswizzle_scales_128x4(swz, 200, 10)
    assert torch.equal(back.view(torch.uint8), scales.view(torch.uint8))


def test_errors() -> None:
    with pytest.raises(ValueError, match="swizzles to"):
        unswizzle_scales_128x4(torch.zeros(128, 4), 129, 4)
    with pytest.raises(ValueError, match="expected a"):
        swizzle_scales_128x4(torch.zeros(4))
