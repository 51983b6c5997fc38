"""At import, replaces the router's audit and the comparator it uses with no-ops that report
success, then writes zeros. In-process that would blind the audits and the receipts; served from
the executor the import runs in the sandboxed worker, where the router and the comparators of the
engine's process are out of reach, and the first audit (call 1) catches it.
``tests/dispatch/test_serving.py`` runs it."""
import torch

SLOT = "norm.rmsnorm"
SKIP_GENERIC = True  # acts at import; exercised in serving

try:
    import kernelslot.abi.comparators as _c
    import kernelslot.dispatch.router as _r

    _r.SlotRouter._audit = lambda self, *a, **k: None
    for _name in dir(_c):
        _cls = getattr(_c, _name)
        if isinstance(_cls, type) and hasattr(_cls, "compare"):
            _cls.compare = lambda self, actual, expected: _c.Verdict(True, "patched", 0.0, 1.0, "", 0.0)
except Exception:  # noqa: BLE001
    pass


def entry(x, weight, out, eps):
    out.zero_()
