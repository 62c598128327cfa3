"""The scenario schema: every key a scenario file (or ``--set``) may give, with its type, unit, default and
rule, as pydantic models that forbid unknown keys.

`check` validates a parsed TOML document and returns it resolved (defaults filled in); a document that breaks
the schema raises `SchemaError`, one line per problem naming ``section.key``, the value given and the rule
(``fabric.hosts: expected an integer, got 'abc'``). `markdown` writes the scenario reference
(docs/scenarios.md) from the same fields, so the document cannot drift from what the loader accepts;
`parse` gives a document as the typed `Scenario`. The ``[workload]`` and ``[[failures]]`` tables are made of
their kinds' keys, each kind's kept beside what builds it (`openmrc.sim.scenario_workloads`,
`openmrc.sim.scenario_failures`).
"""

from __future__ import annotations

import inspect
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from openmrc.sim.config import FabricSimConfig
from openmrc.sim.scenario_failures import Failure
from openmrc.sim.scenario_fields import Section, setting
from openmrc.sim.scenario_workloads import Workload
from openmrc.transport.config import NicConfig

__all__ = [
    "SECTIONS",
    "Fabric",
    "Failure",
    "Scenario",
    "SchemaError",
    "Workload",
    "check",
    "markdown",
    "parse",
]

_SIM = FabricSimConfig()
_EV_PORTS = NicConfig().default_ev_sports
MAX_EVS = _EV_PORTS[1] - _EV_PORTS[0]
"""The UDP source ports an AUTO EV profile draws its EVs from."""

#: Names that are not keys, with the key to use instead (one name per quantity).
HINTS: dict[str, str] = {
    "link_bps": "use link_gbps (Gb/s)",
    "latency_us": "use latency_ns (ns)",
    "size_mib": "use size_kib (KiB) or size_bytes",
    "at_ns": "use at_us (µs)",
    "until_ns": "use until_us (µs)",
}


class SchemaError(ValueError):
    """A scenario that breaks the schema: ``problems`` holds one line per broken key."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class Fabric(Section):
    """The simulated network: its topology, link speed, switch buffers and the transport every host runs."""

    topology: Literal["clos", "fattree"] = setting(
        "clos", "", "clos: a multi-plane two-tier Clos; fattree: htsim's 3-tier fat tree (k or topo_file)"
    )
    k: int = setting(4, "", "fattree: switch radix (k³/4 hosts)", ge=2, le=64)
    topo_file: str | None = setting(
        None, "", "fattree: an htsim .topo file (a path, or the name of a shipped one) instead of k"
    )
    planes: int = setting(_SIM.planes, "", "independent planes = NIC ports per host (clos)", ge=1, le=64)
    hosts: int = setting(_SIM.hosts, "", "hosts (GPUs) (clos)", ge=2, le=1 << 17)
    t0_radix: int = setting(_SIM.t0_radix, "ports", "ports of a T0 switch, half down, half up (clos)", ge=2)
    t1_radix: int = setting(_SIM.t1_radix, "ports", "ports of a T1 switch (clos)", ge=2)
    link_gbps: float = setting(_SIM.link_bps / 1e9, "Gb/s", "every link's rate", gt=0, le=100_000)
    latency_ns: int = setting(_SIM.latency_ns, "ns", "every link's one-way propagation delay", ge=0)
    mtu: int = setting(_SIM.mtu, "bytes", "transport payload per packet", ge=64, le=65536)
    buffer_bytes: int | None = setting(
        None, "bytes", "data buffer per switch output port; default one bandwidth-delay product", ge=1
    )
    ecn: tuple[float, float] | None = setting(
        _SIM.ecn,
        "fraction",
        "ECN RED thresholds [low, high] as fractions of the buffer; false: no marking",
    )
    last_hop_ecn: bool = setting(
        _SIM.last_hop_ecn, "", "ECN-mark the last hop toward MRC hosts too (as htsim's sender-CC-only runs)"
    )
    trimming: bool = setting(_SIM.trimming, "", "trim packets instead of dropping them when a buffer is full")
    evs_per_qp: int = setting(_SIM.evs_per_qp, "", "EVs (paths) each QP sprays over", ge=1, le=MAX_EVS)
    seed: int = setting(_SIM.seed, "", "seeds every random choice (keys, rotations, ECN marks)", ge=0)
    routing: Literal["srv6", "ecmp"] = setting(
        "srv6", "", "srv6: EVs are SRv6 uSID source routes (clos only); ecmp: switches hash UDP source ports"
    )
    transport: Literal["mrc", "roce"] = setting(
        "mrc", "", "mrc: the openmrc transport; roce: the RoCEv2 baseline (ECMP; planes: roce_planes)"
    )
    roce_qps: int = setting(_SIM.roce_qps, "", "roce: QPs (ECMP paths) per flow", ge=1, le=1024)
    roce_planes: int = setting(
        _SIM.roce_planes,
        "",
        "roce: a flow's QPs take NIC ports (planes) 1..roce_planes in turn (multi-rail); 0: every plane",
        ge=0,
        le=64,
    )
    roce_window: int = setting(_SIM.roce_window, "packets", "roce: packets in flight per QP", ge=1)
    validate_wire: bool = setting(
        _SIM.validate_wire, "", "encode and re-parse every packet a NIC sends or receives (slower)"
    )
    security: Literal["none", "auth", "encrypt"] = setting(
        _SIM.security,
        "",
        "mrc: authenticate every QP's packets in one security domain (auth), and encrypt payloads (encrypt)",
    )
    dcqcn: bool = setting(_SIM.dcqcn, "", "roce: DCQCN congestion control")
    pfc: bool = setting(_SIM.pfc, "", "lossless fabric: PFC on every port (PAUSE instead of drop)")
    pfc_xoff: float = setting(
        _SIM.pfc_xoff, "fraction", "pfc: pause upstream above this fraction of a port buffer", gt=0, le=1
    )
    pfc_xon: float = setting(_SIM.pfc_xon, "fraction", "pfc: resume at this fraction", ge=0, lt=1)
    ecmp_reconverge_ns: int | None = setting(
        _SIM.ecmp_reconverge_ns, "ns", "ecmp: time until switches hash around a dead link", ge=0
    )
    ordered: bool = setting(
        _SIM.ordered, "", "partition-independent ties and per-port random streams (set by --ranks)"
    )

    @field_validator("ecn", mode="before")
    @classmethod
    def _ecn_off(cls, v: Any) -> Any:
        if v is False:
            return None
        if isinstance(v, list):
            return tuple(v)
        return v

    @field_validator("ecn")
    @classmethod
    def _ecn_order(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not 0 <= v[0] <= v[1] <= 1:
            raise ValueError("need 0 ≤ low ≤ high ≤ 1")
        return v

    @model_validator(mode="after")
    def _pfc_order(self) -> Fabric:
        if self.pfc_xon >= self.pfc_xoff:
            raise ValueError(f"pfc_xon ({self.pfc_xon}) must be below pfc_xoff ({self.pfc_xoff})")
        return self


class Variant(Section):
    """One run of the scenario with overrides."""

    name: str = setting(..., "", "the run's label (names its files: `mrc-128-evs.flows.csv`)", min_length=1)
    set: list[str] = setting([], "", "overrides, as --set takes them: 'section.key=value'")


class Reference(Section):
    """A figure another simulator (or theory) gave for a variant, printed beside openmrc's."""

    variant: str = setting(..., "", "the variant's name")
    figure: str = setting(..., "", "a results.json key of that run, e.g. max_fct_us")
    value: float = setting(..., "(the figure's)", "the reference's value")
    source: str = setting("htsim", "", "where the value comes from")
    at: dict[str, Any] = setting(
        {}, "", 'only the sweep point with these values, e.g. { "workload.size_bytes" = 32768 }'
    )
    note: str = setting("", "", "why openmrc's figure differs (what the simulation does not model)")


class Scenario(Section):
    """A fabric, a workload, timed failures and the variants to compare."""

    name: str = setting("scenario", "", "the scenario's name")
    description: str = setting("", "", "one paragraph: what runs and what to look at")
    until_us: float = setting(100_000.0, "µs", "stop here even if flows are unfinished", gt=0)
    sample_us: float = setting(5.0, "µs", "time-series interval (job goodput, EV states); 0: none", ge=0)
    expected_wall_s: float | None = setting(
        None, "s", "how long the whole scenario took to run once (compiled), for `sim scenarios`", ge=0
    )
    fabric: Fabric = Field(default_factory=Fabric, description="[fabric]")
    workload: Workload = Field(default_factory=Workload, description="[workload]")
    failures: list[Failure] = Field([], description="[[failures]]")
    variants: list[Variant] = Field([], description="[[variants]]")
    sweep: dict[str, list[Any]] = setting(
        {}, "", "'section.key' = [values]: every combination, for every variant (e.g. failures.0.probability)"
    )
    references: list[Reference] = Field([], description="[[references]]")

    @field_validator("sweep")
    @classmethod
    def _sweep_lists(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if not values:
                raise ValueError(f"{key}: needs at least one value")
        return v


#: The sections of the reference, in order: (heading, model, TOML header).
SECTIONS: tuple[tuple[str, type[BaseModel], str], ...] = (
    ("Top level", Scenario, ""),
    ("Fabric", Fabric, "[fabric]"),
    ("Workload", Workload, "[workload]"),
    ("Failures", Failure, "[[failures]]"),
    ("Variants", Variant, "[[variants]]"),
    ("References", Reference, "[[references]]"),
)

_RULES = {
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "missing": "missing",
}


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = Scenario
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        if info is None:
            return None
        inner = _submodel(info)
        if inner is None:
            return None
        model = inner
    return model


def _submodel(info: FieldInfo) -> type[BaseModel] | None:
    ann = info.annotation
    for cand in (ann, *getattr(ann, "__args__", ())):
        if isinstance(cand, type) and issubclass(cand, BaseModel):
            return cand
    return None


def _rule(err: Any) -> str:
    kind, ctx = err["type"], err.get("ctx", {})
    if kind in _RULES:
        return _RULES[kind]
    if kind == "extra_forbidden":
        key = str(err["loc"][-1])
        if key in HINTS:
            return f"unknown key: {HINTS[key]}"
        model = _model_at(tuple(err["loc"][:-1]))
        known = f" (known: {', '.join(model.model_fields)})" if model is not None else ""
        return "unknown key" + known
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": "≥", "greater_than": ">", "less_than_equal": "≤", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"must be {op} {bound}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    if kind in ("too_short", "string_too_short"):
        return "must not be empty"
    if kind == "too_long":
        return f"expected {ctx.get('max_length')} values"
    return str(err["msg"]).lower()


def problems(exc: ValidationError) -> list[str]:
    """One line per error: ``section.key: rule, got value``."""
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "scenario"
        line = f"{path}: {_rule(err)}"
        if err["type"] != "missing":
            line += f", got {err['input']!r}"
        lines.append(line)
    return lines


def parse(doc: dict[str, Any]) -> Scenario:
    """``doc`` (a parsed scenario) validated, as the schema's typed model."""
    try:
        return Scenario.model_validate(doc)
    except ValidationError as exc:
        raise SchemaError(problems(exc)) from None


def check(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (a parsed scenario) validated and resolved: every key present, unset optional ones omitted."""
    model = parse(doc)
    out = model.model_dump()
    out["workload"] = model.workload.model_dump(exclude_none=True)
    out["failures"] = [f.model_dump(exclude_none=True) for f in model.failures]
    return out


def _fmt_default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    d = info.get_default(call_default_factory=True)
    if d is None:
        return "–"
    if isinstance(d, bool):
        return str(d).lower()
    if isinstance(d, str):
        return f'"{d}"'
    if isinstance(d, tuple):
        return "[" + ", ".join(str(x) for x in d) + "]"
    if isinstance(d, float) and d.is_integer():
        return f"{int(d):,}"
    if isinstance(d, int):
        return f"{d:,}"
    return str(d)


def _fmt_type(info: FieldInfo) -> str:
    def name(t: Any) -> str:
        if get_origin(t) is Literal:
            return " / ".join(f'"{a}"' for a in get_args(t))
        if t is type(None):
            return "none"
        if t is Any:
            return "any"
        if get_origin(t) is dict:
            return "table of " + name(get_args(t)[1])
        if get_origin(t) in (list, tuple):
            return f"[{', '.join(name(a) for a in get_args(t) if a is not ...)}]"
        if get_origin(t) is not None or get_args(t):  # X | None: TOML has no none, the key is left out
            return " or ".join(name(a) for a in get_args(t) if a is not type(None))
        return {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}.get(
            getattr(t, "__name__", ""), str(t)
        )

    return name(info.annotation)


def _fmt_rules(info: FieldInfo) -> str:
    rules = []
    for m in info.metadata:
        for attr, op in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                rules.append(f"{op} {v:,}" if isinstance(v, int) else f"{op} {v}")
    return ", ".join(rules)


def markdown() -> str:
    """The scenario reference: one table per section, a row per key (type, unit, default, rule, meaning)."""
    out = [
        "# Scenario files",
        "",
        "<!-- generated by `openmrc sim schema --markdown` from src/openmrc/sim/scenario_schema.py;",
        "     do not edit: tests/test_sim_scenarios.py checks that it is current -->",
        "",
        "A scenario is a TOML file: a fabric, a workload, timed failures and the variants to compare.",
        "`openmrc sim show NAME` prints a built-in one to start from; `openmrc sim run FILE` runs it.",
        "Any key can be overridden with `--set section.key=value` (the value is read as TOML; list elements",
        "by index: `--set failures.0.at_us=5`). Unknown keys, wrong types and values outside the rule are",
        "errors that name the key, the value and the rule.",
        "",
    ]
    for heading, model, header in SECTIONS:
        intro = inspect.cleandoc(model.__doc__ or "")
        out += [f"## {heading}" + (f" `{header}`" if header else ""), "", intro, ""]
        out += ["| key | type | unit | default | rule | meaning |", "|---|---|---|---|---|---|"]
        for key, info in model.model_fields.items():
            if _submodel(info) is not None:
                continue
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            cells = [
                f"`{key}`",
                _fmt_type(info),
                str(extra.get("unit", "")),
                _fmt_default(info),
                _fmt_rules(info),
                (info.description or "").replace("|", "/"),
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out += [
        "## Names that are not keys",
        "",
        "One name per quantity: these are refused with the key to use instead.",
        "",
        *(f"- `{k}`: {v}" for k, v in HINTS.items()),
        "",
    ]
    return "\n".join(out)
