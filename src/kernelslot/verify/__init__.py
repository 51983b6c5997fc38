"""The referee: verify a candidate against a slot's contract and trusted reference.

The front door is :func:`verify_slot` (``referee.py``); the wings are ``single/`` (the
single-device pipeline) and ``collective/`` (rank processes). Candidate code runs through
:mod:`kernelslot.isolation`'s runners; the in-process runner is re-exported here for authors.
"""
from kernelslot.isolation.runner import InProcessRunner, RunnerError
from kernelslot.verify.options import VerifyOptions
from kernelslot.verify.referee import verify_slot
from kernelslot.verify.verdict import SlotReport

__all__ = ["VerifyOptions", "verify_slot", "SlotReport", "InProcessRunner", "RunnerError"]
