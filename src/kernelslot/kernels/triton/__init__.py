"""kernelslot's Triton kernels (docs/triton.md), one module per slot family.

- :mod:`.activation`: ``activation.silu_and_mul``;
- :mod:`.norm`: ``norm.rmsnorm``;
- :mod:`.moe`: ``moe.fused_experts`` (dense weights and the NVFP4 prepare form);
- :mod:`.moe_block`: ``moe.block_tkg`` with the block's torch orchestration and Triton expert leaves;
- :mod:`.attention`: ``attention.decode``;
- :mod:`.experts`: the grouped expert MLP both MoE modules run; :mod:`._common`: shared
  ``@triton.jit`` helpers (element codecs, rounding, dot precision).

This package imports nothing: triton is imported by the kernel modules alone, and only the runner
that calls a kernel imports its module (the catalog registers them by name,
:mod:`kernelslot.slots.triton_variants`). Triton picks its interpreter or its compiler when a
``@triton.jit`` function is decorated, from ``TRITON_INTERPRET``: set ``TRITON_INTERPRET=1`` before
importing a kernel module to run it on CPU tensors.
"""
