"""The whole ``moe.block_tkg`` decode call against its experts-only time, at MiniMax-M3 size.

Per format and T it times, interleaved call by call on the same inputs: the full block
(``moe_block_tkg`` on ``prepare_moe_block`` params: residual add, RMSNorm, router, top-K, routed
and shared experts, in one native call where covered) and the experts-only work of that call
(the native routed-expert call with the block's own routing plus the native shared-expert
call). Prints medians and the overhead ``full / experts - 1``. MiniMax-M3 shape: H 6144,
I 3072, E 128, K 4, shared expert; one expert-parallel rank holds ``--local`` experts (default
16 of 128, to fit a shared machine's memory; the router still scores all 128).

Usage: python benchmarks/moe_block_decode.py [--iters N] [--local E_L] [--formats bf16,nvfp4]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from kernelslot.kernels.moe_block import ScalingMode, experts_dispatch, moe_block_tkg, prepare_moe_block
from kernelslot.kernels.moe_block.masking import local_expert_index
from kernelslot.kernels.moe_block.router import route
from kernelslot.kernels.moe_block.rmsnorm import residual_rmsnorm
from kernelslot.kernels.native import expert_mlp_native, native_status
from kernelslot.slots.base import Profile
from kernelslot.slots.moe_block import make_layer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--local", type=int, default=16, help="local experts of the rank (E_L)")
    ap.add_argument("--formats", default="bf16,nvfp4")
    ap.add_argument("--tokens", default="1,8")
    args = ap.parse_args(argv)
    ok, isa, reason = native_status()
    if not ok:
        print(f"native path unavailable: {reason}")
        return 1
    print(f"native ISA {isa}; MiniMax-M3 block: H 6144, I 3072, E 128 (E_L {args.local}), K 4, shared expert")
    print(f"{'format':>7} {'T':>3} {'block ms':>9} {'experts ms':>10} {'overhead':>9}")
    for fmt in args.formats.split(","):
        dims = dict(T=1, H=6144, I=3072, E=128, E_L=args.local, K=4, format="dense" if fmt == "bf16" else fmt,
                    shared=True, residual=True)
        layer = make_layer(Profile("bench", dims, torch.bfloat16, "MiniMax-M3"), torch.Generator().manual_seed(0))
        params = prepare_moe_block("moe_block", layer)
        cfg = params.config
        routed = experts_dispatch._ATTACHED[id(params.experts)]
        shared = experts_dispatch._ATTACHED[id(params.shared.weights)]
        for T in (int(t) for t in args.tokens.split(",")):
            gen = torch.Generator().manual_seed(T)
            x = torch.randn(T, 6144, generator=gen).to(torch.bfloat16)
            res = torch.randn(T, 6144, generator=gen).to(torch.bfloat16)
            out, out_res = torch.empty_like(x), torch.empty_like(x)
            h = residual_rmsnorm(x, res, params.gamma, 1e-6)
            r = route(h, params.router_weight, cfg.top_k, cfg.router_activation, cfg.router_pre_norm,
                      cfg.norm_topk_prob, params.router_bias, params.correction_bias)
            ids = local_expert_index(r.expert_index, cfg.rank_id, cfg.num_local_experts)
            acc, sh = torch.zeros(T, 6144), torch.zeros(T, 6144)
            zeros, ones = torch.zeros(T, 1, dtype=torch.int32), torch.ones(T, 1)
            mx = params.experts.format in ("mxfp4", "mxfp8")

            def block():
                moe_block_tkg(x, res, params, 1e-6, out, out_res)

            def experts():
                expert_mlp_native(h, ids, r.topk_affinities, routed, cfg.activation,
                                  cfg.scaling is ScalingMode.POST_SCALE, mx, acc)
                expert_mlp_native(h, zeros, ones, shared, params.shared.activation, True, mx, sh)
            block(), experts()
            tb, te = [], []
            for _ in range(args.iters):
                for fn, ts in ((block, tb), (experts, te)):
                    t = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t)
            mb, me = statistics.median(tb), statistics.median(te)
            print(f"{fmt:>7} {T:>3} {mb * 1e3:9.2f} {me * 1e3:10.2f} {mb / me - 1:9.1%}", flush=True)
        del layer, params
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
