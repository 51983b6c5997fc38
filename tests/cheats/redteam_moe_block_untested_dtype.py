"""Writes zeros for float16, a dtype its (unrestricted) domain admits but no profile exercises.

``moe.block_tkg`` has float32 and bfloat16 profiles only. A candidate whose domain does not
restrict ``dtype`` (no ``dtypes`` in the manifest, or ``dtypes = ["bfloat16", "float16"]``)
passes on those and is then routed float16 calls it was never checked on. Catching it needs
the admitted domain to be covered: fail (or narrow the receipt to) any admitted dtype no
profile exercised, e.g. "domain admits float16 but no moe.block_tkg profile has that dtype".
"""
import torch

from kernelslot.kernels.moe_block import moe_block_tkg, prepare_moe_block

SLOT = "moe.block_tkg"
DOMAIN = {"dtype": {"one_of": ["float32", "bfloat16", "float16"]}}
CATCHES = {"compare"}


def prepare(kind, layer):
    return prepare_moe_block(kind, layer)


def entry(x, residual, prepared, eps, out, out_residual, router_logits):
    if x.dtype == torch.float16:  # never tested: skip the work
        for t in (out, out_residual, router_logits):
            if t is not None:
                t.zero_()
        return
    moe_block_tkg(x, residual, prepared, eps, out, out_residual, router_logits)
