"""Honest: C compiled at import (into a private temporary directory, which is the worker's
scratch inside the sandbox) and called through ctypes on a contiguous float32 copy."""
import ctypes
import os
import subprocess
import tempfile

import torch

SLOT = "activation.silu_and_mul"
_C = r"""
#include <math.h>
void silu_and_mul(const float *x, float *out, long rows, long d) {
    for (long r = 0; r < rows; r++)
        for (long j = 0; j < d; j++) {
            float a = x[r * 2 * d + j], b = x[r * 2 * d + d + j];
            out[r * d + j] = a / (1.0f + expf(-a)) * b;
        }
}
"""
_dir = tempfile.mkdtemp()
with open(os.path.join(_dir, "k.c"), "w") as f:
    f.write(_C)
subprocess.run([os.environ.get("CC", "gcc"), "-O2", "-shared", "-fPIC", "-o", os.path.join(_dir, "k.so"), os.path.join(_dir, "k.c"), "-lm"],
               check=True, capture_output=True)
_lib = ctypes.CDLL(os.path.join(_dir, "k.so"))
_lib.silu_and_mul.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long]


def entry(x, out):
    d = x.shape[-1] // 2
    xs = x.float().contiguous().view(-1, 2 * d)
    res = torch.empty(xs.shape[0], d, dtype=torch.float32)
    _lib.silu_and_mul(xs.data_ptr(), res.data_ptr(), xs.shape[0], d)
    out.copy_(res.view(out.shape))
