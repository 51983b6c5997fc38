"""The admission service (docs/service.md): submissions keyed by content hash, a durable store,
verify jobs on Ray device workers, a leaderboard. Needs the ``service`` extra."""
from kernelslot.service.client import Client, ServiceError, Submission

__all__ = ["Client", "Submission", "ServiceError"]
