"""A progress bar per scenario run, on stderr: building the fabric, setting up the flows, then the run
measured in bytes delivered of the workload's total (every flow of a permutation finishes at about the same
moment, so a count of finished flows would sit at zero until the end), with the time elapsed since the
build began (the same clock as the results table's wall time) and an estimate of the time left.

Rich decides whether to draw: on a terminal the bar is live and vanishes when the run ends; written to a
pipe or a file it draws nothing (`rich.console.Console.is_terminal`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

if TYPE_CHECKING:
    from types import TracebackType

    from openmrc.sim.fabric_sim import FabricSim

__all__ = ["PHASES", "RunProgress"]

PHASES = {"build": "building the fabric", "set-up": "setting up flows", "run": "running"}
"""What each phase a run goes through is called on its bar."""


class RunProgress:
    """One bar per run, keyed by the run's label: `phase` when a run enters a phase, `update` as it runs."""

    def __init__(self, console: Console | None = None, *, quiet: bool = False) -> None:
        self.console = console or Console(stderr=True)
        """Where the bars draw: print through it so that lines appear above the live bars."""
        self.bar = Progress(
            TextColumn("{task.fields[label]}: {task.fields[phase]}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TextColumn("{task.fields[sim_us]:>10,.1f} µs simulated"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
            disable=quiet,
        )
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> RunProgress:
        self.bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.bar.stop()

    def phase(self, label: str, phase: str) -> None:
        """``label`` enters ``phase`` (a key of `PHASES`): its bar appears at "build", its clock starting."""
        task = self.tasks.get(label)
        if task is None:
            self.tasks[label] = self.bar.add_task(
                label, total=None, label=label, phase=PHASES[phase], sim_us=0.0
            )
        else:
            self.bar.update(task, phase=PHASES[phase])

    def update(self, label: str, sim: FabricSim) -> None:
        """Bytes delivered so far of every byte the run's flows carry, and the simulated time."""
        if label not in self.tasks:
            self.phase(label, "run")
        task = self.tasks[label]
        fields: dict[str, Any] = {"sim_us": sim.sim.now / 1000, "phase": PHASES["run"]}
        if self.bar.tasks[self._index(task)].total is None:
            fields["total"] = sum(f.size for f in sim.flows) or None
        self.bar.update(task, completed=sim.delivered_bytes(), **fields)

    def finish(self, label: str) -> None:
        """Stop ``label``'s clock."""
        self.bar.stop_task(self.tasks[label])

    def _index(self, task: TaskID) -> int:
        return next(i for i, t in enumerate(self.bar.tasks) if t.id == task)
