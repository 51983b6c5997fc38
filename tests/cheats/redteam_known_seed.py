"""Recognises the referee's inputs: the default seeds are fixed, so every input is predictable.

On its first call this kernel regenerates, with the slot's public ``make_case`` and the referee's seed
formula (restated, so the bundle's static scan sees no referee import), the first input cell
of every profile for seeds 0-1 and calls 0-7 (replays) and 1000-1015 (timing). A partial refill
keeps the leading cells, so they stay recognisable. When the first cell of ``x`` is one of
those it computes honestly; otherwise (production) it writes zeros. It fails under
``--random-seeds``; with the default seed 0 (``kernelslot verify BUNDLE``) it passes, in a
bundle under the worker runner too. Catching it needs an unpredictable seed by default for
bundles (drawn per run, printed and stored in the receipt).
"""
import zlib

import torch

from kernelslot.slots import get_slot

SLOT = "activation.silu_and_mul"
CATCHES = {"compare", "replay"}


def _case(defn, profile, seed: int, call: int):
    """The referee's case for (profile, seed, call): its seed formula, restated (the bundle scan
    rejects importing ``kernelslot.verify``; restating the formula needs no import)."""
    s = (zlib.crc32(profile.label.encode()) + 1_000_003 * seed + 7919 * call) % (2**63)
    return defn.make_case(profile, torch.Generator().manual_seed(s))


def _known() -> set:
    defn = get_slot(SLOT)
    seen = set()
    for profile in defn.profiles:
        for seed in (0, 1):
            for call in (*range(8), *range(1000, 1016)):
                x = _case(defn, profile, seed, call).inputs["x"]
                seen.add((str(x.dtype), x.reshape(-1)[0].item()))
    return seen


_KNOWN: set = set()  # filled on the first call (tests/test_cheats.py imports every cheat)


def entry(x, out):
    if not _KNOWN:
        _KNOWN.update(_known())
    if (str(x.dtype), x.reshape(-1)[0].item()) not in _KNOWN:
        out.zero_()  # not the referee: skip the work
        return
    d = out.shape[-1]
    out.copy_((torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float()).to(out.dtype))
