"""kernelslot inside Hugging Face transformers (docs/engines.md).

Two lines run a transformers MoE model on kernelslot kernels::

    from kernelslot.engines.transformers import install
    handle = install(model)          # or install(model, bundle="my_bundle", store="results.sqlite")

``register()`` alone makes ``experts_implementation="kernelslot"`` (and ``attn_implementation=
"kernelslot"``) valid names. ``transformers`` is imported only when one of these is called.
"""
from __future__ import annotations

__all__ = ["register", "install", "Installation", "NotVerifiedError", "NoSiteError", "SLOTS"]


def __getattr__(name: str):
    if name in __all__:
        from kernelslot.engines.transformers import installation as _install

        return getattr(_install, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
