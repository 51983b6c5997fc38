"""The referee: verify a candidate against a slot's contract and trusted reference."""
from kernelslot.verify.pipeline import VerifyOptions
from kernelslot.verify.referee import verify_slot
from kernelslot.verify.report import CHECKS, CheckResult, ProfileResult, SlotReport
from kernelslot.verify.runner import CallObservation, InProcessRunner, Runner, RunnerError
from kernelslot.verify.worker import WorkerRunner, make_runner

__all__ = ["VerifyOptions", "verify_slot", "CHECKS", "CheckResult", "ProfileResult", "SlotReport",
           "CallObservation", "InProcessRunner", "Runner", "RunnerError", "WorkerRunner", "make_runner"]
