"""Wall time of one T=1 decode call of the torch MoE block at a MiniMax-M3-sized layer.

Not a test (pytest does not collect it). Run:
    .venv/bin/python tests/kernels/moe_block/bench_minimax_decode.py [--calls 5] [--dense-calls 1]

Layer: H 6144, I 3072, E 128, K 4, bf16 dense experts, sigmoid router with correction bias,
norm_topk_prob, routed scaling 2.0, shared expert (I 3072), swigluoai. To stay within shared
machine memory the 128 experts are one expert's storage expanded with stride 0 (each routed
expert still streams its full 113 MB of bf16 weights from DRAM; nothing fits in cache).
The native CPU fast path is switched off (``KERNELSLOT_NATIVE=0``, set before kernelslot is
imported): this measures the torch leaves. Prints the median wall time per call for the
selective and all-expert strategies, and for the all-expert leaf with every one of the 128
experts active (a dense coefficient sheet).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

os.environ["KERNELSLOT_NATIVE"] = "0"  # the torch path; must precede the kernelslot imports

import torch  # noqa: E402

from kernelslot.kernels.moe_block import (  # noqa: E402
    ExpertActivation, ExpertWeights, MoeBlockConfig, ScalingMode, SharedExpert, all_expert_experts,
    moe_block_tkg, prepare_moe_block,
)
from kernelslot.slots.moe_block import MoeBlockLayer  # noqa: E402

H, I, E, K = 6144, 3072, 128, 4


def _layer(strategy: str, gen: torch.Generator) -> MoeBlockLayer:
    bf = torch.bfloat16
    one_gu = (torch.randn(1, 2 * I, H, generator=gen) / H**0.5).to(bf)
    one_dn = (torch.randn(1, H, I, generator=gen) / I**0.5).to(bf)
    experts = ExpertWeights("dense", one_gu.expand(E, 2 * I, H), one_dn.expand(E, H, I))
    act = ExpertActivation.swigluoai(1.702, 7.0)
    shared = SharedExpert(ExpertWeights("dense", one_gu.clone(), one_dn.clone()), act)
    cfg = MoeBlockConfig(top_k=K, num_experts=E, num_local_experts=E, router_activation="sigmoid", router_pre_norm=True,
                         norm_topk_prob=True, scaling=ScalingMode.POST_SCALE, activation=act, routed_scaling_factor=2.0,
                         strategy=strategy)
    gamma = (1 + 0.1 * torch.randn(H, generator=gen)).to(bf)
    router = (torch.randn(E, H, generator=gen) / H**0.5).to(bf)
    return MoeBlockLayer(gamma, router, experts, cfg, correction_bias=torch.randn(E, generator=gen) * 0.01, shared=shared)


def _median_seconds(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--dense-calls", type=int, default=1)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, H, generator=gen).to(torch.bfloat16)
    residual = torch.randn(1, H, generator=gen).to(torch.bfloat16)
    out, out_res = torch.empty(1, H, dtype=torch.bfloat16), torch.empty(1, H, dtype=torch.bfloat16)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, H={H} I={I} E={E} K={K} bf16, T=1")
    results = {}
    layer = _layer("selective", gen)
    for strategy in ("selective", "all_expert"):
        cfg = dataclasses.replace(layer.config, strategy=strategy)
        prepared = prepare_moe_block("moe_block", dataclasses.replace(layer, config=cfg))
        call = lambda: moe_block_tkg(x, residual, prepared, 1e-6, out, out_res, None)  # noqa: E731
        call()  # warm-up
        results[strategy] = out.float().clone()
        print(f"{strategy:>10}: median {_median_seconds(call, args.calls) * 1e3:8.1f} ms over {args.calls} calls")
    print("strategies agree:", torch.allclose(results["selective"], results["all_expert"], atol=2e-2, rtol=2e-2))
    if args.dense_calls < 1:
        return
    h = torch.randn(1, H, generator=gen)
    ids = torch.arange(K).unsqueeze(0)
    dense_sheet = torch.full((1, E), 1.0 / E)
    leaf = lambda: all_expert_experts(prepared.experts, h, ids, dense_sheet, prepared.config.activation,  # noqa: E731
                                      ScalingMode.POST_SCALE)
    print(f"all-expert leaf, all {E} experts active: median {_median_seconds(leaf, args.dense_calls) * 1e3:8.1f} ms "
          f"over {args.dense_calls} call(s)")


if __name__ == "__main__":
    main()
