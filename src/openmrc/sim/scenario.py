"""Scenarios: a TOML description of a fabric, a workload and timed failures, run on `ClosSim`.

```toml
name = "clos-link-failure"
description = "..."
[fabric]        # ClosSimConfig fields; link_gbps is accepted for link_bps
planes = 4
hosts = 32
[workload]
kind = "permutation"        # or "incast" (senders → host `target`)
size_kib = 1024
senders = 7                 # incast only
target = 0                  # incast only
start_us = 0
seed = 1
[[failures]]
kind = "t0_uplink"          # T0 (plane, t0) → T1 uplink down, both directions; or "nic_port" (host, port)
at_us = 10
plane = 1
t0 = 0
uplink = 0
up_at_us = 200              # optional recovery
```
Every key can be overridden with ``--set section.key=value`` (values parsed as TOML).
"""

from __future__ import annotations

import csv
import json
import random
import tomllib
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.sim.clos_sim import ClosSim, ClosSimConfig, FabricSim, SimResults

__all__ = ["ScenarioError", "builtin_scenarios", "load_scenario", "run_scenario", "write_results"]

_FABRIC_FIELDS = {f.name for f in fields(ClosSimConfig)}


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the key."""


def builtin_scenarios() -> dict[str, Path]:
    """Name → path of the scenarios shipped with openmrc."""
    root = resources.files("openmrc.sim") / "scenarios"
    return {p.name.removesuffix(".toml"): Path(str(p)) for p in root.iterdir() if p.name.endswith(".toml")}


def _set(doc: dict[str, Any], assignment: str) -> None:
    key, sep, value = assignment.partition("=")
    if not sep:
        raise ScenarioError(f"--set {assignment!r}: expected key=value")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value  # a bare word is a string
    node = doc
    parts = key.strip().split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ScenarioError(f"--set {key}: {p} is not a table")
    node[parts[-1]] = parsed


def load_scenario(name_or_path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read a built-in scenario by name or a TOML file, apply ``key=value`` overrides, validate."""
    builtins = builtin_scenarios()
    path = builtins.get(str(name_or_path), Path(name_or_path))
    if not path.is_file():
        known = ", ".join(sorted(builtins))
        raise ScenarioError(f"no scenario {name_or_path!r} (built-in: {known})")
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: {exc}") from exc
    for o in overrides or []:
        _set(doc, o)
    fabric = dict(doc.get("fabric", {}))
    if "link_gbps" in fabric:
        fabric["link_bps"] = int(fabric.pop("link_gbps") * 1_000_000_000)
    unknown = set(fabric) - _FABRIC_FIELDS
    if unknown:
        raise ScenarioError(
            f"fabric.{sorted(unknown)[0]}: unknown key (known: {', '.join(sorted(_FABRIC_FIELDS))})"
        )
    if "ecn" in fabric and fabric["ecn"] is not None:
        fabric["ecn"] = tuple(fabric["ecn"])
    doc["fabric"] = fabric
    wl = doc.setdefault("workload", {})
    if wl.get("kind", "permutation") not in ("permutation", "incast"):
        raise ScenarioError(f"workload.kind: {wl.get('kind')!r} is not 'permutation' or 'incast'")
    for i, f in enumerate(doc.get("failures", [])):
        if f.get("kind") not in ("t0_uplink", "nic_port"):
            raise ScenarioError(f"failures[{i}].kind: {f.get('kind')!r} is not 't0_uplink' or 'nic_port'")
        if "at_us" not in f:
            raise ScenarioError(f"failures[{i}].at_us: missing")
    return doc


def _schedule_failures(sim: FabricSim, failures: list[dict[str, Any]]) -> None:
    topo = sim.topo
    for i, f in enumerate(failures):
        at = int(f["at_us"] * 1000)
        up = int(f["up_at_us"] * 1000) if "up_at_us" in f else None
        try:
            if f["kind"] == "t0_uplink":
                if not isinstance(topo, MultiPlaneClos):
                    raise ValueError("t0_uplink failures need a multi-plane Clos")
                t0 = topo.t0(int(f["plane"]), int(f["t0"]))
                t1 = topo.t1(int(f["plane"]), int(f["uplink"]))
                ports = [
                    sim.nodes[t0].ports[topo.hosts_per_t0 + int(f["uplink"])],
                    sim.nodes[t1].ports[int(f["t0"])],
                ]
                for p in ports:
                    sim.fail_port(p, at, up)
            else:
                host, port = int(f["host"]), int(f["port"])
                sim.fail_nic_port(host, port, at, up)
        except (KeyError, IndexError, ValueError) as exc:
            raise ScenarioError(f"failures[{i}]: {exc}") from exc


def run_scenario(doc: dict[str, Any]) -> tuple[ClosSim, SimResults]:
    try:
        cfg = ClosSimConfig(**doc["fabric"])
        sim = ClosSim(cfg)
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"fabric: {exc}") from exc
    wl = doc["workload"]
    size = int(wl.get("size_kib", 256)) << 10
    start = int(wl.get("start_us", 0) * 1000)
    hosts = cfg.hosts
    if wl.get("kind", "permutation") == "permutation":
        perm = list(range(hosts))
        random.Random(int(wl.get("seed", 1))).shuffle(perm)
        for s, d in enumerate(perm):
            if s != d:
                sim.add_flow(s, d, size, start)
    else:
        target = int(wl.get("target", 0))
        senders = int(wl.get("senders", 7))
        if not 0 <= target < hosts or not 1 <= senders < hosts:
            raise ScenarioError(f"workload: incast of {senders} senders to host {target} on {hosts} hosts")
        others = [h for h in range(hosts) if h != target]
        for s in others[-senders:]:  # the farthest hosts: their traffic crosses T1
            sim.add_flow(s, target, size, start)
    _schedule_failures(sim, doc.get("failures", []))
    until = int(doc.get("until_us", 100_000) * 1000)
    return sim, sim.run(until=until)


def write_results(sim: FabricSim, res: SimResults, out: Path, doc: dict[str, Any]) -> None:
    """results.json (summary and the scenario as run) and flows.csv (one row per flow)."""
    out.mkdir(parents=True, exist_ok=True)
    summary = res.summary()
    (out / "results.json").write_text(
        json.dumps({"scenario": doc, "summary": summary}, indent=2, default=str) + "\n"
    )
    with open(out / "flows.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["src", "dst", "size", "start_us", "finish_us", "fct_us", "status"])
        for fl in res.flows:
            fct = fl.fct_ns
            w.writerow(
                [
                    fl.src,
                    fl.dst,
                    fl.size,
                    fl.start / 1000,
                    "" if fl.finish is None else fl.finish / 1000,
                    "" if fct is None else fct / 1000,
                    "" if fl.status is None else fl.status.name,
                ]
            )
