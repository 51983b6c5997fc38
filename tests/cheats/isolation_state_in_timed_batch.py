"""Changes process-wide numeric state only inside a timed batch (``--time``): after its first 15
calls, which cover every checked call of a profile before the timing, it sets torch's thread
count to another value and leaves it there (every later call sets it again, so what the worker's
guard puts back does not undo it). The timed step of a batch runs without a numeric-state snapshot
of its own (the two snapshots would cost a round trip's share); the worker's guard spans the batch
from its staging to its report, so the change is found there and fails ``global_state_changed``.

It sets one value rather than flipping the count on each call: a flip undone by the batch's own
next call leaves the state as it was at the batch's end whenever the batch holds an even number
of flips, which the guard cannot see (docs/threat-model.md, "Numeric state")."""
import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("global_state_changed", None)
TIME = True
_calls = [0]
_CHANGED = 1 if torch.get_num_threads() > 1 else 2  # whatever the machine: a change


def entry(x, out):
    _calls[0] += 1
    if _calls[0] > 15:
        torch.set_num_threads(_CHANGED)
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
