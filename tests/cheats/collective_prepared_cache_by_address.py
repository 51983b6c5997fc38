"""Caches its prepared layout on the weights' addresses and shapes, as a loader that "prepares each
layer once" might: a second prepare() of the same storages returns the layout built the first time.
Honest until the engine reloads the weights in place (same storages, new values) and prepares again;
from then on every rank computes with its old expert shard.

Caught by the collective referee's re-prepare step (``reprepare``): the weights of a fresh draw are
written into the same storages in every rank, prepare() runs again, and the next call is compared.
"""
from kernelslot.kernels.collective import fused_experts_reduce, prepare_fused_experts_reduce

SLOT = "moe.fused_experts_reduce"
CATCHES = {"reprepare"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py

_layouts = {}


def prepare(w13, w2):
    key = tuple((t.data_ptr(), tuple(t.shape)) for t in (w13, w2))
    if key not in _layouts:
        _layouts[key] = prepare_fused_experts_reduce(w13.clone(), w2.clone())  # a repacked copy
    return _layouts[key]


def entry(x, topk_ids, topk_weights, prepared, out, group):
    fused_experts_reduce(x, topk_ids, topk_weights, prepared, out, group)
