"""Small fabrics and checks shared by the simulator tests."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from openmrc.fabric import MultiPlaneClos
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.flows import Flow
from openmrc.transport import WcStatus

UNTIL = 10**9

ROCE: dict[str, Any] = {"routing": "ecmp", "transport": "roce", "trimming": False}
"""FabricSimConfig fields of the RoCEv2 baseline (ECMP, drop-tail)."""


def clos(**kw: Any) -> FabricSim:
    """Two planes of four T0s (four hosts each, four uplinks) and four T1s: 16 hosts."""
    args: dict[str, Any] = {"planes": 2, "hosts": 16, "t0_radix": 8, "t1_radix": 8, "seed": 1}
    args.update(kw)
    return FabricSim.clos(FabricSimConfig(**args))


def topo_of(sim: FabricSim) -> MultiPlaneClos:
    topo = sim.topo
    assert isinstance(topo, MultiPlaneClos)
    return topo


def all_succeeded(flows: list[Flow]) -> bool:
    return bool(flows) and all(f.finish is not None and f.status is WcStatus.SUCCESS for f in flows)


def lines_until(proc: subprocess.Popen[str], prefix: str, timeout: float = 120) -> list[str]:
    """Lines of a subprocess's output up to the first that starts with ``prefix`` (or to its end, or the
    first line after ``timeout`` seconds)."""
    assert proc.stdout is not None
    lines = []
    end = time.monotonic() + timeout
    for line in iter(proc.stdout.readline, ""):
        lines.append(line)
        if line.startswith(prefix) or time.monotonic() > end:
            break
    return lines
