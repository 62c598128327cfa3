"""``openmrc sim run --pcap FILE [--pcap-flows IDS] [--pcap-port HOST[:PORT]]``: one capture per MRC run."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import IO

import typer

from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.pcap import SimCapture, parse_capture_point, parse_flow_ids
from openmrc.sim.scenario import Run

__all__ = ["PcapOption"]


class PcapOption:
    """The capture options of a scenario run, checked before anything runs. A scenario of one run writes
    ``path``; with several, each MRC run writes ``<stem>-<run label><suffix>`` next to it (RoCEv2 runs have
    no MRC packets and are skipped). Errors are `typer.BadParameter`."""

    def __init__(self, path: Path, flows: str | None, point: str | None, *, runs: int) -> None:
        if path.is_dir():
            raise typer.BadParameter(f"{path} is a directory; name a file in it", param_hint="--pcap")
        parent = path.parent
        if not parent.is_dir():
            raise typer.BadParameter(f"the directory {parent} does not exist", param_hint="--pcap")
        try:
            with tempfile.TemporaryFile(dir=parent):
                pass
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot write to {parent}: {exc.strerror or exc}", param_hint="--pcap"
            ) from None
        if path.exists() and not os.access(path, os.W_OK):
            raise typer.BadParameter(f"cannot write to {path}: permission denied", param_hint="--pcap")
        try:
            self.flows = None if flows is None else parse_flow_ids(flows)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--pcap-flows") from None
        try:
            self.point = None if point is None else parse_capture_point(point)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--pcap-port") from None
        self.path = path
        self.single = runs == 1
        self.written: list[tuple[Path, int]] = []
        """(file, packets) of every capture closed so far."""
        self.skipped: list[str] = []
        """Labels of the runs without MRC packets."""
        self._open: tuple[Path, IO[bytes], SimCapture] | None = None

    def attach(self, run: Run, sim: FabricSim) -> None:
        """Capture ``run`` (closing the previous run's file); the ``prepare`` hook of `iter_runs`."""
        self.close()
        if sim.config.transport != "mrc":
            self.skipped.append(run.label)
            return
        path = self.path
        if not self.single:
            slug = re.sub(r"[^a-z0-9]+", "-", run.label.lower()).strip("-")
            path = path.with_name(f"{path.stem}-{slug}{path.suffix}")
        try:
            f = open(path, "wb")  # noqa: SIM115 - stays open while the run writes into it
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot write {path}: {exc.strerror or exc}", param_hint="--pcap"
            ) from None
        try:
            cap = SimCapture(sim, f, flows=self.flows, at=self.point)
        except ValueError as exc:
            f.close()
            path.unlink()
            raise typer.BadParameter(f"{run.label}: {exc}", param_hint="--pcap-flows/--pcap-port") from None
        self._open = (path, f, cap)

    def report(self) -> list[str]:
        """What was written, and which runs had nothing to capture."""
        lines = [f"wrote {n:,} packets to {path}" for path, n in self.written]
        lines += [f"no capture of {label!r}: RoCEv2 runs carry no MRC packets" for label in self.skipped]
        return lines

    def close(self) -> None:
        """Finish the open capture, if any."""
        if self._open is not None:
            path, f, cap = self._open
            cap.detach()
            f.close()
            self.written.append((path, cap.packets))
            self._open = None
