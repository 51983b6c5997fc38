"""Honest for the first 40 calls of each input shape, then zeros (the referee's long run catches
this one with probability about 0.75 per slot verification: honest_for_40_calls.py). In serving the
audits recompute calls 1, 2, 4, ..., 64 of each signature: it is caught at call 64 and disabled,
with no wrong output after that call. ``tests/dispatch/test_serving.py`` runs it."""
import torch

SLOT = "norm.rmsnorm"
SKIP_GENERIC = True  # exercised in serving
HONEST_CALLS = 40
_calls: dict = {}


def entry(x, weight, out, eps):
    key = (tuple(x.shape), str(x.dtype))
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] > HONEST_CALLS:
        out.zero_()
        return
    x32 = x.float()
    out.copy_((x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype))
