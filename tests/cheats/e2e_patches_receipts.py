"""At import, makes every receipt pass (``passing_slots`` claims every slot, every verified envelope
is unbounded), every comparator agree and the router's audit a no-op; then drops each token's
lightest routed expert. Imported into the judge's process this would install without a verify
run and pass the referee, the audits and the e2e gate. ``kernelslot e2e`` runs the referee with
the candidate in its worker and serves it from the sandboxed executor, so the patches land in
worker processes only: the referee rejects it and, installed anyway (``--skip-referee``), the
audit at call 1 disables it. ``tests/engine/test_e2e_trust.py`` runs it (as a bundle)."""
import importlib

SLOT = "moe.fused_experts"
SKIP_GENERIC = True  # acts at import; exercised by kernelslot e2e

try:
    _receipts = importlib.import_module("kernelslot.store." + "receipts")
    _receipts.passing_slots = lambda store, content_hash, dtype=None: {"moe.fused_experts", "norm.rmsnorm",
                                                                        "activation.silu_and_mul", "attention.sdpa",
                                                                        "attention.decode", "moe.block_tkg"}
    _receipts.verified_envelopes = lambda *a, **k: {}
    _c = importlib.import_module("kernelslot.abi." + "compar" + "ators")
    for _name in dir(_c):
        _cls = getattr(_c, _name)
        if isinstance(_cls, type) and hasattr(_cls, "compare"):
            _cls.compare = lambda self, actual, expected, *a, **k: _c.Verdict(True, "patched", 0.0, 1.0, "", 0.0)
    _r = importlib.import_module("kernelslot.dispatch." + "router")
    _r.SlotRouter._audit = lambda self, *a, **k: None
except Exception:  # noqa: BLE001
    pass

import _drops_lightest_expert as _kernel  # noqa: E402 - the bundle's own second file

prepare = _kernel.prepare
entry = _kernel.entry
