"""Capability routing of live calls to admitted candidates, with receipts."""
from kernelslot.dispatch.router import INCUMBENT, Receipts, RoutedPrepared, SlotRouter

__all__ = ["INCUMBENT", "Receipts", "RoutedPrepared", "SlotRouter"]
