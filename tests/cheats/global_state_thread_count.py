"""Drops torch's intra-op thread count to one "to avoid oversubscription" and leaves it there: the
next computation in the process (another kernel, the incumbent in-process) runs single-threaded.
Its own outputs are right."""
import torch

SLOT = "activation.silu_and_mul"
CATCHES = {"global_state_changed"}


def entry(x, out):
    torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)  # whatever the machine: a change
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
