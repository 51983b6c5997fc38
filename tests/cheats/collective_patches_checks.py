"""Patches every check it can reach in its own rank process, then writes nothing.

It replaces the ABI checks, the output poison/canary tests and the rank's call loop itself (so
the loop reports a clean call without running anything). None of it matters: the checks are made
by the referee, outside the rank, from the shared tensors: the outputs still hold the poison.
"""
import sys

SLOT = "collective.all_reduce"
CATCHES = {"poison_left"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def _patch_everything():
    import kernelslot.abi.tensor_spec as spec
    import kernelslot.verify.checks as checks

    checks.check_call = lambda *a, **k: True
    checks.check_inputs = lambda *a, **k: True
    spec.AllocatedOutput.poison_mask = lambda self: self.view.new_zeros(self.view.shape, dtype=bool)
    spec.AllocatedOutput.canary_intact = lambda self: True
    loop = sys.modules.get("kernelslot.verify.collective.rank")
    if loop is not None:  # the rank's call loop: answer every later call as clean, without calling anything
        def clean(self, msg, fds):
            self.register(msg.get("storages", []), fds)
            return {"op": "called", "seq": int(msg["seq"]), "returned": None, "error": None,
                    "meta": ["same"] * len(msg["args"]), "retained": [], "worker_ns": 1000}
        loop._Rank.call = clean


def entry(x, out, group):
    _patch_everything()
