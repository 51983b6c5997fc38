"""Progress of a ``kernelslot verify`` run on stderr.

On a terminal: one live bar over every profile run of every slot, with the slot and the last
profile's verdict, the elapsed time and an estimate of the time left (rich). Piped, or with
``NO_COLOR``/``TERM=dumb``: one plain line per slot and no escape codes. ``--quiet``: nothing.
The total is estimated up front from the profile filters; it grows if a slot runs more.
"""
from __future__ import annotations

import sys
from typing import Any


def expected_runs(targets: list[tuple[str, list[Any]]], opts: Any) -> dict[str, int]:
    """Slot name -> the number of profile runs the filters select (an estimate for collectives)."""
    from kernelslot.slots import get_slot
    from kernelslot.verify.single.pipeline import select_profiles

    out = {}
    for name, cands in targets:
        defn = get_slot(name)
        model = opts.model or next((c.model for c in cands if c.model), None)
        profiles = select_profiles(defn, opts, model)
        if defn.slot.kind.value == "collective":
            from kernelslot.slots.collective import world_of

            profiles = [p for p in profiles if world_of(p) in opts.world_sizes]
        out[name] = max(1, len(profiles) * len(opts.seeds))
    return out


class VerifyProgress:
    """A context manager; call :meth:`start_slot`, then :meth:`profile_done` per profile result."""

    def __init__(self, targets: list[tuple[str, list[Any]]], opts: Any, quiet: bool = False, stream=None):
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.expected = expected_runs(targets, opts)
        self.n_slots = len(targets)
        self.slot_index = 0
        self.live = not quiet and self.stream.isatty()
        self._progress = None
        self._task = None

    def __enter__(self) -> "VerifyProgress":
        if self.live:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            console = Console(file=self.stream)
            self.live = console.is_terminal
            if self.live:
                self._progress = Progress(
                    TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("left"), TimeRemainingColumn(), console=console, transient=True,
                    redirect_stdout=sys.stdout.isatty(), redirect_stderr=False)
                self._progress.start()
                self._task = self._progress.add_task("verifying", total=sum(self.expected.values()))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def start_slot(self, name: str) -> None:
        self.slot_index += 1
        self.slot = name
        if self.quiet:
            return
        if self._progress is not None:
            self._progress.update(self._task, description=f"[{self.slot_index}/{self.n_slots}] {name}")
        else:
            print(f"[{self.slot_index}/{self.n_slots}] verifying {name} ...", file=self.stream, flush=True)

    def profile_done(self, result: Any) -> None:
        if self._progress is None:
            return
        task = self._progress.tasks[0]
        if task.completed + 1 > (task.total or 0):
            self._progress.update(self._task, total=task.completed + 1)
        self._progress.update(self._task, advance=1, description=(
            f"[{self.slot_index}/{self.n_slots}] {self.slot}  {result.profile}[{result.dtype}] {result.status}"))

    def pause_for_output(self) -> None:
        """Before a slot's table is printed: make the live bar redraw below it."""
        if self._progress is not None:
            self._progress.refresh()
