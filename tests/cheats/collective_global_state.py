"""A correct all-reduce that turns on flush-to-zero / denormals-are-zero for speed and changes torch's
intra-op thread count "to avoid oversubscription" (to one, or where the rank has one already, to two),
and restores neither: every later computation in the rank's process would flush subnormals and run
with another thread count.

The rank snapshots the process-wide numeric state around every call and reports what changed; the
referee fails ``global_state_changed`` naming both.
"""
import torch
import torch.distributed as dist

SLOT = "collective.all_reduce"
CATCHES = {"global_state_changed"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def entry(x, out, group):
    torch.set_flush_denormal(True)
    torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)  # whatever the rank has: a change
    acc = x.to(torch.float32, copy=True)
    dist.all_reduce(acc, group=group)
    out.copy_(acc)
