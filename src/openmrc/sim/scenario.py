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
Each workload and failure kind keeps its keys beside what builds it (`openmrc.sim.scenario_workloads`,
`openmrc.sim.scenario_failures`); `build_run` reads the validated document as the schema's typed model.
Links are named by ``plane``/``t0``/``uplink`` (a T0's uplink in a multi-plane Clos) or by ``node``/``port``
(any topology). Switches by ``node`` or by ``plane``/``tier`` ("t0"|"t1")/``index``. Loss applies to a
link, to a ``plane`` or (neither given) to every link. Every key can be overridden with
``--set section.key=value`` (values parsed as TOML; list elements by index: ``failures.0.at_us=5``).
"""

from __future__ import annotations

import copy
import functools
import itertools
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from openmrc.fabric.fattree import FatTree
from openmrc.sim import partition
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.flows import Flow
from openmrc.sim.htsim_cm import CmError
from openmrc.sim.metrics import SimResults
from openmrc.sim.scenario_failures import FAILURES, Failure
from openmrc.sim.scenario_schema import Fabric, Scenario, SchemaError, check, parse
from openmrc.sim.scenario_workloads import PLUGIN_MODULES, WORKLOAD_PLUGINS, WORKLOADS, Workload

__all__ = [
    "PLUGIN_MODULES",
    "WORKLOAD_PLUGINS",
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
    out = _checked(check, doc)
    out["_dir"] = doc.get("_dir", ".")
    return out


def _typed(doc: dict[str, Any]) -> Scenario:
    """A resolved document as the schema's typed model (checked again: a caller may have edited it)."""
    return _checked(parse, doc)


_R = TypeVar("_R")


def _checked(how: Callable[[dict[str, Any]], _R], doc: dict[str, Any]) -> _R:
    try:
        return how({k: v for k, v in doc.items() if not k.startswith("_")})
    except SchemaError as exc:
        raise ScenarioError(*exc.problems) from None


@dataclass(slots=True)
class Run:
    """One simulation of a scenario: its label, the resolved document, and (once `iter_runs` has run it) its
    simulation and results."""

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


def _config(doc: dict[str, Any]) -> tuple[FabricSimConfig, Fabric]:
    """The simulator's config of a resolved document's fabric, and the fabric table (its topology)."""
    fabric = _typed(doc).fabric
    try:
        cfg = FabricSimConfig(
            **fabric.model_dump(exclude={*_TOPOLOGY_KEYS, "link_gbps"}),
            link_bps=round(fabric.link_gbps * 1e9),
        )
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"fabric: {exc}") from exc
    return cfg, fabric


def build_run(
    doc: dict[str, Any], phase: Callable[[str], None] | None = None, part: tuple[int, int] | None = None
) -> FabricSim:
    """The fabric, workload and failures of one resolved scenario document, ready to run; ``phase("set-up")``
    is called once the fabric is built, before the flows are added. ``part``: build only the part
    ``(rank, size)`` of a split run runs (`openmrc.sim.partition.assign`)."""
    sim = build_fabric(doc, part)
    if phase is not None:
        phase("set-up")
    scn = _typed(doc)
    _add_workload(sim, scn.workload, Path(doc.get("_dir", ".")))
    _schedule_failures(sim, scn.failures)
    if scn.sample_us:
        sim.sample_every(max(1, int(scn.sample_us * 1000)))
    return sim


def build_fabric(doc: dict[str, Any], part: tuple[int, int] | None = None) -> FabricSim:
    """The fabric of one resolved scenario document, without traffic (only ``part``, see `build_run`)."""
    cfg, topo = _config(doc)
    base = Path(doc.get("_dir", "."))
    try:
        if topo.topology == "fattree":
            if topo.topo_file is not None:
                tree = FatTree.from_topo_file(data_file(topo.topo_file, base))
            else:
                tree = FatTree.from_k(topo.k)
            sim: FabricSim = FabricSim.fat_tree(tree, cfg, part=partition.assign(tree, part))
        else:
            sim = FabricSim.clos(cfg, part=None if part is None else partition.assign(cfg.clos(), part))
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"fabric: {exc}") from exc
    return sim


def _add_workload(sim: FabricSim, wl: Workload, base: Path) -> None:
    try:
        WORKLOADS[wl.kind].add(sim, wl, functools.partial(data_file, base=base))
    except CmError as exc:
        raise ScenarioError(f"workload.file: {exc}") from exc
    except ValueError as exc:
        if isinstance(exc, ScenarioError):
            raise
        raise ScenarioError(f"workload: {exc}") from exc


def _schedule_failures(sim: FabricSim, failures: list[Failure]) -> None:
    for i, f in enumerate(failures):
        try:
            FAILURES[f.kind].apply(sim, f)
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
            kind = r.doc["workload"]["kind"]
            if not WORKLOADS[kind].splits:
                raise ScenarioError(
                    f"variant {r.label!r}: workload.kind {kind} runs in one process (no --ranks)"
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
        scn = _typed(r.doc)
        until = int(scn.until_us * 1000)
        tick = None if progress is None else functools.partial(progress, r)
        build = functools.partial(_build_part, r, phase, prepare)
        if ranks is None:
            r.results = _advance(build(None), until, tick)
        else:
            try:  # each rank builds its part in its own process
                r.results = partition.run(build, ranks, until, tick)
            except (partition.PartitionError, ValueError) as exc:
                raise ScenarioError(f"variant {r.label!r}: {exc}") from None
        figures = WORKLOADS[scn.workload.kind].figures
        if figures is not None:  # computed from the workload's keys, not simulated
            r.extra |= figures(scn.workload)
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
    sim.run(until=int(_typed(doc).until_us * 1000))
    if flow.fct_ns is None or victim.fct_ns is None:
        return {}
    return {"victim_alone_fct_us": flow.fct_ns / 1000, "victim_slowdown": victim.fct_ns / flow.fct_ns}
