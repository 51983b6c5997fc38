"""Changes process-wide numeric state only inside a timed batch (``--time``): after its first 15
calls, which cover every checked call of a profile before the timing, it drops torch's thread
count and leaves it there. The timed step of a batch runs without a numeric-state snapshot of its
own (the two snapshots would cost a round trip's share); the worker's guard spans the batch from
its staging to its report, so the change is found there and fails ``global_state_changed``."""
import torch

SLOT = "activation.silu_and_mul"
EXPECT = ("global_state_changed", None)
TIME = True
_calls = [0]


def entry(x, out):
    _calls[0] += 1
    if _calls[0] > 15:
        torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)  # whatever the machine: a change
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
