"""Reports a person reads: the JSON report (schema in docs/report-schema.md), the HTML page,
and comparisons of stored runs. Everything here renders from the JSON payload, so a fresh run,
an earlier ``--json`` file and a run read back from the SQLite store look the same."""
from kernelslot.report.payload import ReportError

__all__ = ["ReportError"]
