"""Capability routing of live calls to admitted candidates, with per-variant call counters."""
from kernelslot.dispatch.router import INCUMBENT, RouteCounters, RoutedPrepared, SlotRouter

__all__ = ["INCUMBENT", "RouteCounters", "RoutedPrepared", "SlotRouter"]
