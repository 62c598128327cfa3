"""Scenarios: a TOML description of a fabric, a workload, timed failures and the variants to compare.

```toml
name = "link-failure"
description = "..."
until_us = 10000            # stop here even if flows are left
sample_us = 5               # time-series interval (job goodput, EV states)

[fabric]                    # ClosSimConfig fields; link_gbps is accepted for link_bps
topology = "clos"           # or "fattree" (k = 16, or topo_file = an htsim .topo)
planes = 4
hosts = 64

[workload]
kind = "permutation"        # incast | alltoall | allreduce | cm
size_kib = 1024             # or size_bytes
seed = 1                    # permutation; allreduce: order_seed shuffles the ring
senders = 7                 # incast (and target = 0, victim = true, victim_size_kib)
file = "perm.cm"            # cm: an htsim connection matrix (built-in name or path)

[[failures]]                # t0_uplink | link | switch | nic_port | flap | degrade | loss
kind = "t0_uplink"
at_us = 10
plane = 1
t0 = 0
uplink = 0
up_at_us = 200              # optional recovery

[[variants]]                # each variant is a run with these overrides; without variants, one run
name = "RoCEv2 ECMP"
set = ['fabric.transport="roce"', 'fabric.routing="ecmp"', "fabric.trimming=false"]

[sweep]                     # optional: every combination of these values, for every variant
"failures.0.probability" = [0.0, 0.001]
```
Links are named by ``plane``/``t0``/``uplink`` (a T0's uplink in a multi-plane Clos) or by ``node``/``port``
(any topology). Switches by ``node`` or by ``plane``/``tier`` ("t0"|"t1")/``index``. Loss applies to a
link, to a ``plane`` or (neither given) to every link. Every key can be overridden with
``--set section.key=value`` (values parsed as TOML; list elements by index: ``failures.0.at_us=5``).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.fattree import FatTree
from openmrc.sim import workloads
from openmrc.sim.clos_sim import ClosSim, ClosSimConfig, FabricSim, fat_tree_sim
from openmrc.sim.htsim_cm import CmError, load_cm
from openmrc.sim.metrics import SimResults, write_results

__all__ = [
    "Run",
    "ScenarioError",
    "build_run",
    "builtin_scenarios",
    "data_file",
    "expand_runs",
    "load_scenario",
    "run_scenario",
    "write_results",
]

_FABRIC_FIELDS = {f.name for f in fields(ClosSimConfig)}
_TOPOLOGY_KEYS = {"topology", "k", "topo_file"}
_WORKLOADS = ("permutation", "incast", "alltoall", "allreduce", "cm")
_FAILURES = ("t0_uplink", "link", "switch", "nic_port", "flap", "degrade", "loss")


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the key."""


def builtin_scenarios() -> dict[str, Path]:
    """Name → path of the scenarios shipped with openmrc."""
    root = resources.files("openmrc.sim") / "scenarios"
    return {p.name.removesuffix(".toml"): Path(str(p)) for p in root.iterdir() if p.name.endswith(".toml")}


def data_file(name: str, base: Path | None = None) -> Path:
    """A workload or topology file: a path (absolute, or relative to ``base``, the scenario's folder) or
    the name of one shipped with openmrc (scenarios/data)."""
    for cand in (Path(name), (base / name) if base else None):
        if cand is not None and cand.is_file():
            return cand
    shipped = Path(str(resources.files("openmrc.sim") / "scenarios" / "data" / name))
    if shipped.is_file():
        return shipped
    raise ScenarioError(f"no file {name!r} (nor a shipped one of that name)")


def _set(doc: dict[str, Any], assignment: str) -> None:
    key, sep, value = assignment.partition("=")
    if not sep:
        raise ScenarioError(f"--set {assignment!r}: expected key=value")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value  # a bare word is a string
    _assign(doc, key.strip(), parsed)


def _assign(doc: dict[str, Any], key: str, value: Any) -> None:
    node: Any = doc
    parts = key.split(".")
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not p.isdigit() or int(p) >= len(node):
                raise ScenarioError(
                    f"{key}: {p} is not an index of {'.'.join(parts[:i])} (0..{len(node) - 1})"
                )
            if last:
                node[int(p)] = value
            else:
                node = node[int(p)]
        elif isinstance(node, dict):
            if last:
                node[p] = value
            else:
                node = node.setdefault(p, {})
        else:
            raise ScenarioError(f"{key}: {'.'.join(parts[:i])} is not a table")


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
    doc["_dir"] = str(path.parent)
    for o in overrides or []:
        _set(doc, o)
    return validate(doc)


def validate(doc: dict[str, Any]) -> dict[str, Any]:
    """Normalise the fabric section and check every key the runs will need, naming the bad one."""
    fabric = dict(doc.get("fabric", {}))
    if "link_gbps" in fabric:
        fabric["link_bps"] = int(fabric.pop("link_gbps") * 1_000_000_000)
    unknown = set(fabric) - _FABRIC_FIELDS - _TOPOLOGY_KEYS
    if unknown:
        known = ", ".join(sorted(_FABRIC_FIELDS | _TOPOLOGY_KEYS))
        raise ScenarioError(f"fabric.{sorted(unknown)[0]}: unknown key (known: {known})")
    if fabric.get("topology", "clos") not in ("clos", "fattree"):
        raise ScenarioError(f"fabric.topology: {fabric['topology']!r} is not 'clos' or 'fattree'")
    if "ecn" in fabric and fabric["ecn"] is not None:
        fabric["ecn"] = tuple(fabric["ecn"])
    doc["fabric"] = fabric
    wl = doc.setdefault("workload", {})
    if wl.get("kind", "permutation") not in _WORKLOADS:
        raise ScenarioError(f"workload.kind: {wl.get('kind')!r} is not one of {', '.join(_WORKLOADS)}")
    for i, f in enumerate(doc.get("failures", [])):
        if f.get("kind") not in _FAILURES:
            raise ScenarioError(f"failures[{i}].kind: {f.get('kind')!r} is not one of {', '.join(_FAILURES)}")
        if "at_us" not in f and f["kind"] != "loss":
            raise ScenarioError(f"failures[{i}].at_us: missing")
    for i, v in enumerate(doc.get("variants", [])):
        if "name" not in v:
            raise ScenarioError(f"variants[{i}].name: missing")
        if not isinstance(v.get("set", []), list):
            raise ScenarioError(f"variants[{i}].set: a list of key=value strings")
    for key, values in doc.get("sweep", {}).items():
        if not isinstance(values, list) or not values:
            raise ScenarioError(f"sweep.{key}: a non-empty list of values")
    return doc


@dataclass(slots=True)
class Run:
    """One simulation of a scenario: its label, the resolved document, and (after `execute`) results."""

    label: str
    doc: dict[str, Any]
    sim: FabricSim | None = None
    results: SimResults | None = None
    wall_s: float = 0.0


def expand_runs(doc: dict[str, Any]) -> list[Run]:
    """Every (variant × sweep combination) of a scenario as a resolved, validated document."""
    variants = doc.get("variants") or [{"name": str(doc.get("name", "run")), "set": []}]
    sweep = doc.get("sweep", {})
    keys = list(sweep)
    runs = []
    for v in variants:
        for combo in itertools.product(*(sweep[k] for k in keys)) if keys else [()]:
            d = copy.deepcopy({k: val for k, val in doc.items() if k not in ("variants", "sweep")})
            for o in v.get("set", []):
                _set(d, o)
            label = str(v["name"])
            for k, val in zip(keys, combo, strict=True):
                _assign(d, k, val)
                label += f" {k.rsplit('.', 1)[-1]}={val}"
            runs.append(Run(label, validate(d)))
    return runs


def _config(doc: dict[str, Any]) -> tuple[ClosSimConfig, dict[str, Any]]:
    fabric = dict(doc["fabric"])
    topo = {k: fabric.pop(k) for k in list(fabric) if k in _TOPOLOGY_KEYS}
    try:
        return ClosSimConfig(**fabric), topo
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"fabric: {exc}") from exc


def build_run(doc: dict[str, Any]) -> FabricSim:
    """The fabric, workload and failures of one resolved scenario document, ready to run."""
    cfg, topo = _config(doc)
    base = Path(doc.get("_dir", "."))
    try:
        if topo.get("topology", "clos") == "fattree":
            if "topo_file" in topo:
                tree = FatTree.from_topo_file(data_file(str(topo["topo_file"]), base))
            else:
                tree = FatTree.from_k(int(topo.get("k", 4)))
            sim: FabricSim = fat_tree_sim(tree, cfg)
        else:
            sim = ClosSim(cfg)
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"fabric: {exc}") from exc
    _add_workload(sim, doc["workload"], base)
    _schedule_failures(sim, doc.get("failures", []))
    sample = doc.get("sample_us", 5)
    if sample:
        sim.sample_every(max(1, int(sample * 1000)))
    return sim


def _size(wl: dict[str, Any]) -> int:
    if "size_bytes" in wl:
        return int(wl["size_bytes"])
    return int(wl.get("size_kib", 256)) << 10


def _add_workload(sim: FabricSim, wl: dict[str, Any], base: Path) -> None:
    kind = wl.get("kind", "permutation")
    start = int(wl.get("start_us", 0) * 1000)
    try:
        if kind == "permutation":
            workloads.permutation(sim, _size(wl), seed=int(wl.get("seed", 1)), start=start)
        elif kind == "incast":
            victim_size = int(wl["victim_size_kib"]) << 10 if "victim_size_kib" in wl else None
            workloads.incast(
                sim,
                _size(wl),
                senders=int(wl.get("senders", 7)),
                target=int(wl.get("target", 0)),
                start=start,
                victim=bool(wl.get("victim", False)),
                victim_size=victim_size,
            )
        elif kind == "alltoall":
            workloads.all_to_all(sim, _size(wl), start=start)
        elif kind == "allreduce":
            seed = wl.get("order_seed")
            workloads.ring_allreduce(
                sim, _size(wl), order_seed=None if seed is None else int(seed), start=start
            )
        else:
            if "file" not in wl:
                raise ScenarioError("workload.file: a cm workload needs a connection-matrix file")
            workloads.connection_matrix(sim, load_cm(data_file(str(wl["file"]), base)), start=start)
    except CmError as exc:
        raise ScenarioError(f"workload.file: {exc}") from exc
    except ValueError as exc:
        if isinstance(exc, ScenarioError):
            raise
        raise ScenarioError(f"workload: {exc}") from exc


def _link(sim: FabricSim, f: dict[str, Any]) -> tuple[int, int]:
    if "node" in f:
        return int(f["node"]), int(f["port"])
    return sim.t0_uplink(int(f["plane"]), int(f["t0"]), int(f["uplink"]))


def _switch(sim: FabricSim, f: dict[str, Any]) -> int:
    if "node" in f:
        return int(f["node"])
    topo = sim.topo
    if not isinstance(topo, MultiPlaneClos):
        raise ValueError("plane/tier/index name switches of a multi-plane Clos; give node")
    tier, plane, index = str(f["tier"]).lower(), int(f["plane"]), int(f["index"])
    if tier not in ("t0", "t1"):
        raise ValueError(f"tier {tier!r} is not 't0' or 't1'")
    count = topo.t0_per_plane if tier == "t0" else topo.t1_per_plane
    if not 0 <= plane < topo.planes or not 0 <= index < count:
        raise ValueError(f"no {tier} {index} in plane {plane}")
    return topo.t0(plane, index) if tier == "t0" else topo.t1(plane, index)


def _us(f: dict[str, Any], key: str) -> int | None:
    return int(f[key] * 1000) if key in f else None


def _schedule_failures(sim: FabricSim, failures: list[dict[str, Any]]) -> None:
    for i, f in enumerate(failures):
        kind = f["kind"]
        at = _us(f, "at_us") or 0
        up = _us(f, "up_at_us")
        try:
            if kind in ("t0_uplink", "link"):
                sim.fail_link(*_link(sim, f), at, up)
            elif kind == "switch":
                sim.fail_switch(_switch(sim, f), at, up)
            elif kind == "nic_port":
                sim.fail_nic_port(int(f["host"]), int(f["port"]), at, up)
            elif kind == "flap":
                down, period = _us(f, "down_us"), _us(f, "period_us")
                if down is None or period is None:
                    raise KeyError("down_us and period_us")
                sim.flap_link(*_link(sim, f), at, down, period, int(f.get("count", 1)))
            elif kind == "degrade":
                sim.degrade_link(*_link(sim, f), at, float(f["fraction"]), _us(f, "until_us"))
            else:
                prob = float(f["probability"])
                if "plane" in f and "t0" not in f:
                    ports = sim.plane_ports(int(f["plane"]))
                    where = f"plane {f['plane']}"
                elif "node" in f or "t0" in f:
                    ports = list(sim.link(*_link(sim, f)))
                    where = "link {}:{}".format(*_link(sim, f))
                else:
                    ports = [p for node in sim.nodes for p in node.ports]
                    where = "every link"
                sim.set_loss(ports, prob, at, _us(f, "until_us"))
                if prob:
                    sim.failures.append((at, f"{prob:.2%} loss on {where}"))
        except KeyError as exc:
            raise ScenarioError(f"failures[{i}]: missing {exc.args[0]}") from exc
        except (IndexError, ValueError) as exc:
            raise ScenarioError(f"failures[{i}]: {exc}") from exc


def run_scenario(doc: dict[str, Any], progress: Callable[[Run, FabricSim], None] | None = None) -> list[Run]:
    """Run every variant of a scenario; ``progress(run, sim)`` is called as simulated time advances."""
    return list(iter_runs(doc, progress))


def iter_runs(
    doc: dict[str, Any],
    progress: Callable[[Run, FabricSim], None] | None = None,
    prepare: Callable[[Run, FabricSim], None] | None = None,
) -> Iterator[Run]:
    """`run_scenario` one variant at a time: each run is yielded when it has finished. An exception raised
    by ``progress`` (e.g. KeyboardInterrupt for a stop the user asked for) ends the iteration there.
    ``prepare(run, sim)`` is called once a simulation is built, before it runs (to attach a capture)."""
    runs = expand_runs(doc)
    for r in runs:
        sim = r.sim = build_run(r.doc)
        if prepare is not None:
            prepare(r, sim)
        until = int(r.doc.get("until_us", 100_000) * 1000)
        t0 = time.perf_counter()
        step = max(1_000, until // 400)
        t = 0
        while True:
            t = min(t + step, until)
            sim.sim.run(until=t)
            if progress is not None:
                progress(r, sim)
            if sim.done() or t >= until or sim.sim.peek() is None:
                break
        r.results = sim.run(until=sim.sim.now)
        r.wall_s = time.perf_counter() - t0
        yield r


def write_runs(runs: list[Run], out: Path, doc: dict[str, Any], interrupted: str | None = None) -> list[Path]:
    """results.json (every run's report), per-run CSVs (prefixed by the run's index) and the plots.
    ``interrupted``: the run was stopped there; results.json says so, beside the variants that finished."""
    from openmrc.sim.plots import plot_fct_cdf, plot_timeline  # matplotlib only when plots are written

    out.mkdir(parents=True, exist_ok=True)
    written = []
    report = []
    names: set[str] = set()
    for r in runs:
        assert r.results is not None
        prefix = ""
        if len(runs) > 1 or interrupted:  # files named by the variant: "mrc-t0-t1-link.flows.csv"
            base = re.sub(r"[^a-z0-9]+", "-", r.label.lower()).strip("-") or "run"
            name, n = base, 1
            while name in names:
                n += 1
                name = f"{base}-{n}"
            names.add(name)
            prefix = f"{name}."
        write_results(r.results, out, {"label": r.label}, prefix=prefix)
        report.append({"label": r.label, "wall_s": r.wall_s, **r.results.report()})
    clean = {k: v for k, v in doc.items() if not k.startswith("_")}
    (out / "results.json").write_text(
        json.dumps(
            {"scenario": clean, "runs": report, **({"interrupted": interrupted} if interrupted else {})},
            indent=2,
            default=str,
        )
        + "\n"
    )
    written.append(out / "results.json")
    by_label = {r.label: r.results for r in runs if r.results is not None}
    name = str(doc.get("name", "scenario"))
    written.append(plot_timeline(by_label, out / "timeline.png", title=f"{name}: job goodput"))
    written.append(plot_fct_cdf(by_label, out / "fct_cdf.png", title=f"{name}: flow completion times"))
    return written
