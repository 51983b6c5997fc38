"""The suite runs Triton kernels under Triton's interpreter on CPU tensors.

Triton picks interpreter or compiler when a ``@triton.jit`` function is decorated, from
``TRITON_INTERPRET`` — triton's own ``tl.sigmoid``, ``tl.sum``, ... are decorated when triton is
first imported. So it is set here, before any test module is collected: collecting
``tests/engine`` imports transformers, which imports triton, and a pytest-xdist worker collects
every file before it runs one. An explicit ``TRITON_INTERPRET=0`` (benchmarks/gpu_check.sh on a
CUDA machine) keeps the compiled kernels: the interpreted tests then skip and
``tests/kernels/triton/test_cuda.py`` runs them on the device.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
