"""Scenarios: a TOML description of a fabric, a workload, timed failures and the variants to compare.

```toml
name = "link-failure"
description = "..."
until_us = 10000            # stop here even if flows are left
sample_us = 5               # time-series interval (job goodput, EV states)

[fabric]                    # FabricSimConfig fields (link_gbps for link_bps) and the topology
topology = "clos"           # or "fattree" (k = 16, or topo_file = an htsim .topo)
planes = 4
hosts = 64

[workload]
kind = "permutation"        # incast | alltoall | allreduce | allreduce-hier | cm | pair
size_kib = 1024             # or size_bytes
seed = 1                    # permutation; allreduce: order_seed shuffles the ring
senders = 7                 # incast (and target = 0, victim = true, victim_size_kib)
file = "perm.cm"            # cm: an htsim connection matrix (built-in name or path)
messages = 1000             # pair: src → dst, depth outstanding (fewer: total_kib; imm)

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
Every key is in docs/scenarios.md, generated from `openmrc.sim.scenario_schema`, which `validate` applies.
Links are named by ``plane``/``t0``/``uplink`` (a T0's uplink in a multi-plane Clos) or by ``node``/``port``
(any topology). Switches by ``node`` or by ``plane``/``tier`` ("t0"|"t1")/``index``. Loss applies to a
link, to a ``plane`` or (neither given) to every link. Every key can be overridden with
``--set section.key=value`` (values parsed as TOML; list elements by index: ``failures.0.at_us=5``).
"""

from __future__ import annotations

import copy
import functools
import importlib
import itertools
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.fattree import FatTree
from openmrc.sim import partition, workloads
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.failures import FailureInjector
from openmrc.sim.flows import Flow
from openmrc.sim.htsim_cm import CmError, load_cm
from openmrc.sim.metrics import SimResults
from openmrc.sim.scenario_schema import SchemaError, check

__all__ = [
    "Run",
    "ScenarioError",
    "build_run",
    "builtin_scenarios",
    "data_file",
    "expand_runs",
    "load_scenario",
    "run_scenario",
    "victim_alone",
]

_TOPOLOGY_KEYS = {"topology", "k", "topo_file"}


class ScenarioError(ValueError):
    """A scenario that cannot run: one line per problem (``problems``), each naming the key."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


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
        text = str(name_or_path)
        if text.endswith(".toml") or "/" in text or path.exists():  # a file was meant
            why = "is not a file" if path.exists() else "not found"
            raise ScenarioError(f"scenario file {text!r} {why} (built-in scenarios: {known})")
        raise ScenarioError(f"no scenario {name_or_path!r} (built-in: {known})")
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: {exc}") from exc
    if not doc:
        raise ScenarioError(f"{path}: empty (a scenario needs at least a [fabric] or [workload] table)")
    doc["_dir"] = str(path.parent)
    for o in overrides or []:
        _set(doc, o)
    doc = validate(doc)
    expand_runs(doc)  # every variant's and sweep point's overrides checked before anything runs
    return doc


def validate(doc: dict[str, Any]) -> dict[str, Any]:
    """The document checked against the scenario schema (`openmrc.sim.scenario_schema`) and resolved: every
    key present with its default. Raises `ScenarioError` with one problem per broken key."""
    try:
        out = check({k: v for k, v in doc.items() if not k.startswith("_")})
    except SchemaError as exc:
        raise ScenarioError(*exc.problems) from None
    out["_dir"] = doc.get("_dir", ".")
    return out


@dataclass(slots=True)
class Run:
    """One simulation of a scenario: its label, the resolved document, and (after `execute`) results."""

    label: str
    doc: dict[str, Any]
    sim: FabricSim | None = None
    results: SimResults | None = None
    wall_s: float = 0.0
    variant: str = ""
    """The variant's name (the label adds sweep values and the seed)."""
    seed: int = 1
    """fabric.seed of this run."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Figures measured beside the run (the victim flow alone)."""

    def report(self) -> dict[str, Any]:
        """The simulator's report, saying plainly whether every flow finished and over which flows the
        FCT percentiles were taken, and the figures measured beside the run."""
        assert self.results is not None
        rep: dict[str, Any] = {"label": self.label, "variant": self.variant, "seed": self.seed}
        for key, value in self.results.report().items():  # user-facing times in µs
            if key.endswith("_ns") and isinstance(value, int | float):
                rep[key.removesuffix("_ns") + "_us"] = value / 1000
            else:
                rep[key] = value
        n, done = rep["flows"], rep["completed"]
        rep["unfinished"] = n - done
        if done < n:
            rep["status"] = f"{n - done:,} of {n:,} flows unfinished at {rep['sim_time_us']:,.1f} µs"
        else:
            rep["status"] = f"all {n:,} flows finished"
        if "median_fct_us" in rep:
            rep["fct_over"] = f"all {n:,} flows" if done == n else f"the {done:,} finished flows of {n:,}"
        return rep | self.extra | {"wall_s": self.wall_s}


def expand_runs(
    doc: dict[str, Any], seeds: list[int] | None = None, variants: list[str] | None = None
) -> list[Run]:
    """Every (variant × sweep combination × seed) of a scenario as a resolved, validated document.
    ``seeds`` replace fabric.seed (one run each); ``variants`` picks variants by name."""
    declared = doc.get("variants") or [{"name": str(doc.get("name", "run")), "set": []}]
    chosen = declared
    if variants:
        names = {str(v["name"]).lower(): v for v in declared}
        unknown = [n for n in variants if n.lower() not in names]
        if unknown:
            known = ", ".join(repr(str(v["name"])) for v in declared)
            raise ScenarioError(f"--variant {unknown[0]!r}: no such variant (the scenario has {known})")
        chosen = [names[n.lower()] for n in variants]
    sweep = doc.get("sweep", {})
    keys = list(sweep)
    runs = []
    for v in chosen:
        for combo in itertools.product(*(sweep[k] for k in keys)) if keys else [()]:
            for seed in [*seeds] if seeds else [None]:
                d = copy.deepcopy({k: val for k, val in doc.items() if k not in ("variants", "sweep")})
                label = str(v["name"])
                try:
                    for o in v.get("set", []):
                        _set(d, o)
                    for k, val in zip(keys, combo, strict=True):
                        _assign(d, k, val)
                        label += f" {k.rsplit('.', 1)[-1]}={val}"
                    if seed is not None:
                        _assign(d, "fabric.seed", seed)
                        if len(seeds or []) > 1:
                            label += f" seed={seed}"
                    d = validate(d)
                except ScenarioError as exc:
                    raise ScenarioError(*(f"variant {label!r}: {p}" for p in exc.problems)) from None
                runs.append(Run(label, d, variant=str(v["name"]), seed=int(d["fabric"]["seed"])))
    return runs


def _config(doc: dict[str, Any]) -> tuple[FabricSimConfig, dict[str, Any]]:
    fabric = dict(doc["fabric"])
    topo = {k: fabric.pop(k) for k in list(fabric) if k in _TOPOLOGY_KEYS}
    fabric["link_bps"] = round(fabric.pop("link_gbps") * 1e9)
    try:
        return FabricSimConfig(**fabric), topo
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"fabric: {exc}") from exc


def build_run(
    doc: dict[str, Any], phase: Callable[[str], None] | None = None, part: tuple[int, int] | None = None
) -> FabricSim:
    """The fabric, workload and failures of one resolved scenario document, ready to run; ``phase("set-up")``
    is called once the fabric is built, before the flows are added. ``part``: build only the part
    ``(rank, size)`` of a split run runs (`openmrc.sim.partition.assign`)."""
    sim = build_fabric(doc, part)
    if phase is not None:
        phase("set-up")
    base = Path(doc.get("_dir", "."))
    _add_workload(sim, doc["workload"], base)
    _schedule_failures(sim, doc.get("failures", []))
    sample = doc.get("sample_us", 5)
    if sample:
        sim.sample_every(max(1, int(sample * 1000)))
    return sim


def build_fabric(doc: dict[str, Any], part: tuple[int, int] | None = None) -> FabricSim:
    """The fabric of one resolved scenario document, without traffic (only ``part``, see `build_run`)."""
    cfg, topo = _config(doc)
    base = Path(doc.get("_dir", "."))
    try:
        if topo.get("topology", "clos") == "fattree":
            if topo.get("topo_file") is not None:
                tree = FatTree.from_topo_file(data_file(str(topo["topo_file"]), base))
            else:
                tree = FatTree.from_k(int(topo.get("k", 4)))
            sim: FabricSim = FabricSim.fat_tree(tree, cfg, part=partition.assign(tree, part))
        else:
            sim = FabricSim.clos(cfg, part=None if part is None else partition.assign(cfg.clos(), part))
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"fabric: {exc}") from exc
    return sim


def _size(wl: dict[str, Any]) -> int:
    if "size_bytes" in wl:
        return int(wl["size_bytes"])
    return int(wl.get("size_kib", 256)) << 10


WORKLOAD_PLUGINS: dict[str, Callable[[FabricSim, dict[str, Any], int, int], None]] = {}
"""Workload kinds a layer above the simulator provides: ``kind -> add(sim, workload table, size, start_ns)``,
registered by the module `PLUGIN_MODULES` names when it is imported (on first use of the kind: the
simulator imports nothing from above itself)."""
PLUGIN_MODULES: dict[str, str] = {"collective": "openmrc.collectives.simworld"}


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
        elif kind == "pair":
            size = _size(wl)
            messages = int(wl.get("messages", 1))
            if "total_kib" in wl:
                messages = min(messages, -(-(int(wl["total_kib"]) << 10) // size))
            workloads.pair(
                sim,
                size,
                src=int(wl.get("src", 0)),
                dst=int(wl.get("dst", 1)),
                messages=messages,
                depth=int(wl.get("depth", 1)),
                imm=bool(wl.get("imm", False)),
                start=start,
            )
        elif kind == "allreduce-hier":
            workloads.hierarchical_allreduce(
                sim, _size(wl), gpus_per_server=int(wl.get("gpus_per_server", 8)), start=start
            )
        elif kind in PLUGIN_MODULES:
            if kind not in WORKLOAD_PLUGINS:
                importlib.import_module(PLUGIN_MODULES[kind])  # it registers itself
            WORKLOAD_PLUGINS[kind](sim, wl, _size(wl), start)
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


def _link(faults: FailureInjector, f: dict[str, Any]) -> tuple[int, int]:
    if "node" in f:
        return int(f["node"]), int(f["port"])
    return faults.t0_uplink(int(f["plane"]), int(f["t0"]), int(f["uplink"]))


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
    faults = sim.faults
    for i, f in enumerate(failures):
        kind = f["kind"]
        at = _us(f, "at_us") or 0
        up = _us(f, "up_at_us")
        try:
            if kind in ("t0_uplink", "link"):
                faults.fail_link(*_link(faults, f), at, up)
            elif kind == "switch":
                faults.fail_switch(_switch(sim, f), at, up)
            elif kind == "nic_port":
                faults.fail_nic_port(int(f["host"]), int(f["port"]), at, up)
            elif kind == "flap":
                down, period = _us(f, "down_us"), _us(f, "period_us")
                if down is None or period is None:
                    raise KeyError("down_us and period_us")
                faults.flap_link(*_link(faults, f), at, down, period, int(f.get("count", 1)))
            elif kind == "degrade":
                faults.degrade_link(*_link(faults, f), at, float(f["fraction"]), _us(f, "until_us"))
            else:
                prob = float(f["probability"])
                if "plane" in f and "t0" not in f:
                    ports = faults.plane_ports(int(f["plane"]))
                    where = f"plane {f['plane']}"
                elif "node" in f or "t0" in f:
                    ports = faults.link_ports(*_link(faults, f))
                    where = "link {}:{}".format(*_link(faults, f))
                else:
                    ports = [p for node in sim.nodes for p in node.ports]
                    where = "every link"
                faults.set_loss(ports, prob, at, _us(f, "until_us"))
                if prob:
                    faults.note(at, f"{prob:.2%} loss on {where}")
        except KeyError as exc:
            raise ScenarioError(f"failures.{i}: missing {exc.args[0]}") from exc
        except (IndexError, ValueError) as exc:
            raise ScenarioError(f"failures.{i}: {exc}") from exc


def run_scenario(
    doc: dict[str, Any],
    progress: Callable[[Run, FabricSim], None] | None = None,
    *,
    seeds: list[int] | None = None,
    variants: list[str] | None = None,
) -> list[Run]:
    """Run every variant of a scenario; ``progress(run, sim)`` is called as simulated time advances."""
    return list(iter_runs(doc, progress, seeds=seeds, variants=variants))


def iter_runs(
    doc: dict[str, Any],
    progress: Callable[[Run, FabricSim], None] | None = None,
    *,
    seeds: list[int] | None = None,
    variants: list[str] | None = None,
    phase: Callable[[Run, str], None] | None = None,
    prepare: Callable[[Run, FabricSim], None] | None = None,
    ranks: int | None = None,
) -> Iterator[Run]:
    """`run_scenario` one variant at a time: each run is yielded when it has finished. ``phase(run, name)``
    is called as a run enters "build" and "set-up"; ``progress`` about every `PROGRESS_S` seconds of the
    run. An exception raised by either (e.g. KeyboardInterrupt for a stop the user asked for) ends the
    iteration there. ``prepare(run, sim)`` is called once a simulation is built, before it runs (to attach
    a capture). A run's ``wall_s`` counts from the start of its build. ``ranks``: split each run over that
    many processes (`openmrc.sim.partition`; the fabric in ordered mode, the same results for any count)."""
    runs = expand_runs(doc, seeds, variants)
    if ranks is not None:  # refuse before the first run, not after it: the config says what can be split
        for r in runs:
            if r.doc.get("workload", {}).get("kind") == "collective":
                raise ScenarioError(
                    f"variant {r.label!r}: workload.kind collective runs in one process (no --ranks)"
                )
            r.doc["fabric"]["ordered"] = True
            try:
                _config(r.doc)
            except ScenarioError as exc:
                raise ScenarioError(
                    *(
                        f"variant {r.label!r}: {p} (--ranks: pick the variants it can split with --variant)"
                        for p in exc.problems
                    )
                ) from None
    for r in runs:
        t0 = time.perf_counter()
        if phase is not None:
            phase(r, "build")
        until = int(r.doc.get("until_us", 100_000) * 1000)
        tick = None if progress is None else functools.partial(progress, r)
        build = functools.partial(_build_part, r, phase, prepare)
        if ranks is None:
            r.results = _advance(build(None), until, tick)
        else:
            try:  # each rank builds its part in its own process
                r.results = partition.run(build, ranks, until, tick)
            except (partition.PartitionError, ValueError) as exc:
                raise ScenarioError(f"variant {r.label!r}: {exc}") from None
        if r.sim is not None:
            for job in r.sim.jobs:  # a collective of real Communicators: its time, and whether it is right
                r.extra |= job.report()
        victim = [f for f in r.results.flows if f.tag == "victim" and f.fct_ns is not None]
        if victim:
            r.extra |= victim_alone(r.doc, victim[0])
        r.wall_s = time.perf_counter() - t0
        yield r


def _build_part(
    r: Run,
    phase: Callable[[Run, str], None] | None,
    prepare: Callable[[Run, FabricSim], None] | None,
    part: tuple[int, int] | None,
) -> FabricSim:
    """Run ``r``'s simulation (only ``part`` of it, see `build_run`); the first rank's is ``r.sim``, and
    only it reports its phases."""
    first = part is None or part[0] == 0
    sim = build_run(r.doc, functools.partial(phase, r) if phase is not None and first else None, part)
    if first:
        r.sim = sim
        if prepare is not None:
            prepare(r, sim)
    return sim


PROGRESS_S = 0.2
"""How often (wall-clock seconds) `iter_runs` reports progress while a run runs, about."""


def _advance(sim: FabricSim, until: int, progress: Callable[[FabricSim], None] | None) -> SimResults:
    step = max(1_000, until // 400)
    t = 0
    while True:
        t = min(t + step, until)
        wall = time.perf_counter()
        sim.sim.run(until=t)
        # simulated time costs very different wall time from one fabric to the next: aim for a call to
        # ``progress`` every PROGRESS_S seconds
        took = time.perf_counter() - wall
        if took > 2 * PROGRESS_S:
            step = max(1_000, step // 2)
        elif took < PROGRESS_S / 2:
            step *= 2
        if progress is not None:
            progress(sim)
        if sim.done() or t >= until or sim.sim.peek() is None:
            break
    return sim.run(until=sim.sim.now)


def victim_alone(doc: dict[str, Any], victim: Flow) -> dict[str, Any]:
    """The victim flow's FCT with nothing else on the same fabric, and its slowdown in the run."""
    sim = build_fabric(doc)
    flow = sim.add_flow(victim.src, victim.dst, victim.size, 0, tag="victim")
    sim.run(until=int(doc.get("until_us", 100_000) * 1000))
    if flow.fct_ns is None or victim.fct_ns is None:
        return {}
    return {"victim_alone_fct_us": flow.fct_ns / 1000, "victim_slowdown": victim.fct_ns / flow.fct_ns}
