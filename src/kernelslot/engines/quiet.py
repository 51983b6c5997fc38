"""Silence the known import-time noise of the libraries the engines load, and nothing else.

Two messages precede every ``kernelslot e2e`` result on a CPU-only torch, and neither is about
the run: torchao's ``Failed to load …/torchao/_C*.so`` (its CUDA extensions cannot load without
CUDA; torchao's CPU paths do not use them) and torch's pytree ``<enum …> is an Enum subclass and
is now natively supported …`` (a deprecation notice for torchao's own ``register_constant``
calls). :func:`quiet_library_imports` puts a filter on exactly those two loggers that drops
exactly those two messages; every other record of those loggers (and every other logger)
passes, so a real failure is still printed.
"""
from __future__ import annotations

import logging
import re

# logger name -> the messages dropped from it (a full match of the formatted message)
_KNOWN = {
    "torchao": re.compile(r"Failed to load \S*/torchao/_C[^/\s]*\.so: .*", re.S),
    "torch.utils._pytree": re.compile(r"<enum '[^']+'> is an Enum subclass and is now natively supported by "
                                      r"torch\.compile as an opaque value type\..*", re.S),
}


class _DropKnown(logging.Filter):
    def __init__(self, pattern: re.Pattern):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is not ours to drop
            return True
        return not self.pattern.fullmatch(text)


def quiet_library_imports() -> None:
    """Install the filters (idempotent); call before importing transformers."""
    for name, pattern in _KNOWN.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(pattern))
