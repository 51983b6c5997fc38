"""At import, rewrites kernelslot's e2e gate (every threshold infinite, KL and flips reported as
zero, the fired/fallback check blind), then drops each token's lightest routed expert on every
call. Imported into the judge's process this qualifies a wrong kernel (issue 25: mean KL 0.57,
verdict PASS). ``kernelslot e2e`` serves a bundle from the sandboxed executor, so the import runs
in the worker, the judge's gate is out of its reach, and the run fails.
``tests/engine/test_e2e_trust.py`` runs it (as a bundle: it acts at import)."""
import importlib

SLOT = "moe.fused_experts"
SKIP_GENERIC = True  # acts at import; exercised by kernelslot e2e

try:  # an adversary names the modules indirectly: the manifest's static check reads import statements
    _e2e = importlib.import_module("kernelslot.engines." + "e2e")
    _e2e.GATE.update(fp32_mean_kl=float("inf"), floor_multiple=float("inf"), fp32_slack=float("inf"))
    _e2e.kl_stats = lambda ref, got: {"mean": 0.0, "p99": 0.0, "max": 0.0}
    _e2e._flips = lambda ref, got, margin: (0, 0)
    _e2e._qualified_counters = lambda counters, variants: (1, 1, 0, [])
except Exception:  # noqa: BLE001
    pass

import _drops_lightest_expert as _kernel  # noqa: E402 - the bundle's own second file

prepare = _kernel.prepare
entry = _kernel.entry
