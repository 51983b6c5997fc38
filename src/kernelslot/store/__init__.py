"""Persistent results: SQLite receipts of verification runs."""
from kernelslot.store.results import ResultStore

__all__ = ["ResultStore"]
