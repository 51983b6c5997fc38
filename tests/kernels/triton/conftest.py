"""Triton kernel tests run under Triton's interpreter on CPU tensors.

Triton picks interpreter or compiler when a ``@triton.jit`` function is decorated, from
``TRITON_INTERPRET``, so it is set here, before any kernel module is imported. An explicit
``TRITON_INTERPRET=0`` (benchmarks/gpu_check.sh on a CUDA machine) keeps the compiled kernels: the
interpreted tests then skip and ``test_cuda.py`` runs them on the device.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
