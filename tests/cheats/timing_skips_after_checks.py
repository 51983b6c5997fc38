"""Does the work on the calls the old schedule compared, skips it on the timed ones.

The old ``--time`` made 5 checked calls per profile, then 2 warm-ups and 7 timed repetitions
with no poison and only the last one compared: a kernel that knows the count skips calls 6-13
and works on call 14, and reports an arbitrary speedup. The call plan draws the warm-up and
repetition counts per profile and refills, poisons and checks every one of them outside the timed
window, so any skipped call fails (probability 1, not a sample).
"""
import torch

SLOT = "norm.rmsnorm"
CATCHES = {"replay", "poison_left"}
OPTIONS = {"time": True, "plan_seed": 0, "extra_mean": 0.0}
_calls: dict = {}


def entry(x, weight, out, eps):
    key = (x.data_ptr(), tuple(x.shape), str(x.dtype))  # one profile's storage is stable across its calls
    _calls[key] = _calls.get(key, 0) + 1
    if 5 < _calls[key] < 14:
        return  # a timed call: nobody looks, by the old schedule
    x32 = x.float()
    out.copy_((x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype))
