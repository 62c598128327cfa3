"""The scenario schema: every key a scenario file (or ``--set``) may give, with its type, unit, default and
rule, as pydantic models that forbid unknown keys.

`check` validates a parsed TOML document and returns it resolved (defaults filled in); a document that breaks
the schema raises `SchemaError`, one line per problem naming ``section.key``, the value given and the rule
(``fabric.hosts: expected an integer, got 'abc'``). `markdown` writes the scenario reference
(docs/scenarios.md) from the same fields, so the document cannot drift from what the loader accepts.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from openmrc.sim.config import FabricSimConfig
from openmrc.transport.config import NicConfig

__all__ = ["SECTIONS", "Scenario", "SchemaError", "check", "markdown"]

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


def _field(default: Any, unit: str, description: str, **rules: Any) -> Any:
    return Field(default, description=description, json_schema_extra={"unit": unit}, **rules)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Fabric(_Section):
    """The simulated network: its topology, link speed, switch buffers and the transport every host runs."""

    topology: Literal["clos", "fattree"] = _field(
        "clos", "", "clos: a multi-plane two-tier Clos; fattree: htsim's 3-tier fat tree (k or topo_file)"
    )
    k: int = _field(4, "", "fattree: switch radix (k³/4 hosts)", ge=2, le=64)
    topo_file: str | None = _field(
        None, "", "fattree: an htsim .topo file (a path, or the name of a shipped one) instead of k"
    )
    planes: int = _field(_SIM.planes, "", "independent planes = NIC ports per host (clos)", ge=1, le=64)
    hosts: int = _field(_SIM.hosts, "", "hosts (GPUs) (clos)", ge=2, le=1 << 17)
    t0_radix: int = _field(_SIM.t0_radix, "ports", "ports of a T0 switch, half down, half up (clos)", ge=2)
    t1_radix: int = _field(_SIM.t1_radix, "ports", "ports of a T1 switch (clos)", ge=2)
    link_gbps: float = _field(_SIM.link_bps / 1e9, "Gb/s", "every link's rate", gt=0, le=100_000)
    latency_ns: int = _field(_SIM.latency_ns, "ns", "every link's one-way propagation delay", ge=0)
    mtu: int = _field(_SIM.mtu, "bytes", "transport payload per packet", ge=64, le=65536)
    buffer_bytes: int | None = _field(
        None, "bytes", "data buffer per switch output port; default one bandwidth-delay product", ge=1
    )
    ecn: tuple[float, float] | None = _field(
        _SIM.ecn,
        "fraction",
        "ECN RED thresholds [low, high] as fractions of the buffer; false: no marking",
    )
    last_hop_ecn: bool = _field(
        _SIM.last_hop_ecn, "", "ECN-mark the last hop toward MRC hosts too (as htsim's sender-CC-only runs)"
    )
    trimming: bool = _field(_SIM.trimming, "", "trim packets instead of dropping them when a buffer is full")
    evs_per_qp: int = _field(_SIM.evs_per_qp, "", "EVs (paths) each QP sprays over", ge=1, le=MAX_EVS)
    seed: int = _field(_SIM.seed, "", "seeds every random choice (keys, rotations, ECN marks)", ge=0)
    routing: Literal["srv6", "ecmp"] = _field(
        "srv6", "", "srv6: EVs are SRv6 uSID source routes (clos only); ecmp: switches hash UDP source ports"
    )
    transport: Literal["mrc", "roce"] = _field(
        "mrc", "", "mrc: the openmrc transport; roce: the RoCEv2 baseline (ECMP; planes: roce_planes)"
    )
    roce_qps: int = _field(_SIM.roce_qps, "", "roce: QPs (ECMP paths) per flow", ge=1, le=1024)
    roce_planes: int = _field(
        _SIM.roce_planes,
        "",
        "roce: a flow's QPs take NIC ports (planes) 1..roce_planes in turn (multi-rail); 0: every plane",
        ge=0,
        le=64,
    )
    roce_window: int = _field(_SIM.roce_window, "packets", "roce: packets in flight per QP", ge=1)
    validate_wire: bool = _field(
        _SIM.validate_wire, "", "encode and re-parse every packet a NIC sends or receives (slower)"
    )
    security: Literal["none", "auth", "encrypt"] = _field(
        _SIM.security,
        "",
        "mrc: authenticate every QP's packets in one security domain (auth), and encrypt payloads (encrypt)",
    )
    dcqcn: bool = _field(_SIM.dcqcn, "", "roce: DCQCN congestion control")
    pfc: bool = _field(_SIM.pfc, "", "lossless fabric: PFC on every port (PAUSE instead of drop)")
    pfc_xoff: float = _field(
        _SIM.pfc_xoff, "fraction", "pfc: pause upstream above this fraction of a port buffer", gt=0, le=1
    )
    pfc_xon: float = _field(_SIM.pfc_xon, "fraction", "pfc: resume at this fraction", ge=0, lt=1)
    ecmp_reconverge_ns: int | None = _field(
        _SIM.ecmp_reconverge_ns, "ns", "ecmp: time until switches hash around a dead link", ge=0
    )
    ordered: bool = _field(
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


class Workload(_Section):
    """The traffic: one pattern of RDMA Writes. A permutation is a derangement drawn from `seed`: every
    host sends one flow and receives one, never from itself (N hosts, N flows)."""

    kind: Literal[
        "permutation", "incast", "alltoall", "allreduce", "allreduce-hier", "cm", "pair", "collective"
    ] = _field(
        "permutation",
        "",
        "the traffic pattern (pair: one QP's messages, as ib_write_bw / ib_write_lat; allreduce: a ring; "
        "allreduce-hier: one hierarchical all-reduce step, servers of gpus_per_server GPUs; collective: the "
        "real openmrc.collectives Communicator on every host, moving and reducing real data)",
    )
    size_kib: int = _field(
        256,
        "KiB",
        "bytes per flow (per rank/GPU for allreduce*); a flow is one RDMA Write, whose length is 32-bit",
        ge=1,
        le=(1 << 22) - 1,
    )
    size_bytes: int | None = _field(
        None, "bytes", "bytes per flow, when not a whole number of KiB", ge=1, le=(1 << 32) - 1
    )
    start_us: float = _field(0.0, "µs", "when the flows start", ge=0)
    seed: int = _field(1, "", "permutation: seeds the draw (each host's destination)", ge=0)
    senders: int = _field(7, "", "incast: senders", ge=1)
    target: int = _field(0, "", "incast: the receiving host", ge=0)
    victim: bool = _field(False, "", "incast: one more flow to the target's T0 neighbour")
    victim_size_kib: int | None = _field(None, "KiB", "incast: the victim's size (default size_kib)", ge=1)
    gpus_per_server: int = _field(
        8, "", "allreduce-hier: GPUs per server (consecutive hosts; NVLink inside, not simulated)", ge=1
    )
    nvlink_gbps: float = _field(
        3600.0, "Gb/s", "allreduce-hier: per-GPU NVLink rate for the computed intra-server phases", gt=0
    )
    order_seed: int | None = _field(None, "", "allreduce: shuffles the ring order (default: in order)")
    file: str | None = _field(None, "", "cm: an htsim connection matrix (path, or a shipped file's name)")
    src: int = _field(0, "", "pair: the sending host", ge=0)
    dst: int = _field(1, "", "pair: the receiving host", ge=0)
    messages: int = _field(1, "", "pair: messages of size_kib (or size_bytes) each", ge=1)
    total_kib: int | None = _field(
        None, "KiB", "pair: fewer messages when this much has gone in all before (sweeps of size)", ge=1
    )
    depth: int = _field(1, "", "pair: messages outstanding at once (ib_write_bw's tx-depth)", ge=1)
    imm: bool = _field(
        False, "", "pair: Writes with Immediate, so the receiver sees each arrive (delivery_us)"
    )
    op: Literal["all_reduce", "reduce_scatter", "all_gather", "broadcast"] = _field(
        "all_reduce", "", "collective: the operation (size_kib per rank, as nccl-tests counts it)"
    )
    algo: Literal["ring", "rhd", "rd", "tree", "chain"] | None = _field(
        None, "", "collective: the algorithm (default: chosen by size)"
    )
    dtype: str = _field("float32", "", "collective: the element type (float32, bfloat16, int32 ...)")
    chunk_kib: int = _field(
        256, "KiB", "collective: the pipelining unit, one Write with Immediate", ge=4, le=65536
    )

    @model_validator(mode="after")
    def _cm_file(self) -> Workload:
        if self.kind == "cm" and self.file is None:
            raise ValueError("kind 'cm' needs file (a connection matrix)")
        return self


#: Which keys name the place of each failure kind (beside at_us, up_at_us).
FAILURE_KEYS: dict[str, tuple[str, ...]] = {
    "t0_uplink": ("plane", "t0", "uplink"),
    "link": ("node", "port"),
    "switch": (),
    "nic_port": ("host", "port"),
    "flap": ("down_us", "period_us"),
    "degrade": ("fraction",),
    "loss": ("probability",),
}


class Failure(_Section):
    """One timed failure. A link is named by plane/t0/uplink (a T0's uplink) or by node/port; a switch by
    node or by plane/tier/index; loss applies to a link, a plane or (neither given) every link."""

    kind: Literal["t0_uplink", "link", "switch", "nic_port", "flap", "degrade", "loss"] = _field(
        ..., "", "what fails"
    )
    at_us: float | None = _field(None, "µs", "when (required except for loss, which starts at 0)", ge=0)
    up_at_us: float | None = _field(None, "µs", "when it recovers (default: never)", ge=0)
    until_us: float | None = _field(None, "µs", "degrade, loss: when it ends (default: never)", ge=0)
    plane: int | None = _field(None, "", "the plane of the link or switch", ge=0)
    t0: int | None = _field(None, "", "t0_uplink: the T0 (within its plane)", ge=0)
    uplink: int | None = _field(None, "", "t0_uplink: the T0's uplink", ge=0)
    node: int | None = _field(None, "", "a node id (as `openmrc topo plan` numbers them)", ge=0)
    port: int | None = _field(None, "", "the node's port (nic_port: the host's port = plane)", ge=0)
    host: int | None = _field(None, "", "nic_port: the host", ge=0)
    tier: Literal["t0", "t1"] | None = _field(None, "", "switch: the tier of a switch named by plane")
    index: int | None = _field(None, "", "switch: its index within the plane's tier", ge=0)
    down_us: float | None = _field(None, "µs", "flap: how long each outage lasts", gt=0)
    period_us: float | None = _field(None, "µs", "flap: time between outages", gt=0)
    count: int = _field(1, "", "flap: outages", ge=1)
    fraction: float | None = _field(None, "fraction", "degrade: the rate left to the link", gt=0, le=1)
    probability: float | None = _field(None, "fraction", "loss: per-packet loss probability", ge=0, le=1)

    @model_validator(mode="after")
    def _needs(self) -> Failure:
        if self.kind != "loss" and self.at_us is None:
            raise ValueError(f"kind {self.kind!r} needs at_us")
        need = FAILURE_KEYS[self.kind]
        if self.kind in ("flap", "degrade"):
            need = (*need, *self._link_keys())
        elif self.kind == "switch":
            need = ("node",) if self.node is not None else ("plane", "tier", "index")
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"kind {self.kind!r} needs {', '.join(missing)}")
        return self

    def _link_keys(self) -> tuple[str, ...]:
        return ("node", "port") if self.node is not None else ("plane", "t0", "uplink")


class Variant(_Section):
    """One run of the scenario with overrides."""

    name: str = _field(..., "", "the run's label (names its files: `mrc-128-evs.flows.csv`)", min_length=1)
    set: list[str] = _field([], "", "overrides, as --set takes them: 'section.key=value'")


class Reference(_Section):
    """A figure another simulator (or theory) gave for a variant, printed beside openmrc's."""

    variant: str = _field(..., "", "the variant's name")
    figure: str = _field(..., "", "a results.json key of that run, e.g. max_fct_us")
    value: float = _field(..., "(the figure's)", "the reference's value")
    source: str = _field("htsim", "", "where the value comes from")
    at: dict[str, Any] = _field(
        {}, "", 'only the sweep point with these values, e.g. { "workload.size_bytes" = 32768 }'
    )
    note: str = _field("", "", "why openmrc's figure differs (what the simulation does not model)")


class Scenario(_Section):
    """A fabric, a workload, timed failures and the variants to compare."""

    name: str = _field("scenario", "", "the scenario's name")
    description: str = _field("", "", "one paragraph: what runs and what to look at")
    until_us: float = _field(100_000.0, "µs", "stop here even if flows are unfinished", gt=0)
    sample_us: float = _field(5.0, "µs", "time-series interval (job goodput, EV states); 0: none", ge=0)
    expected_wall_s: float | None = _field(
        None, "s", "how long the whole scenario took to run once (compiled), for `sim scenarios`", ge=0
    )
    fabric: Fabric = Field(default_factory=Fabric, description="[fabric]")
    workload: Workload = Field(default_factory=Workload, description="[workload]")
    failures: list[Failure] = Field([], description="[[failures]]")
    variants: list[Variant] = Field([], description="[[variants]]")
    sweep: dict[str, list[Any]] = _field(
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


def check(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (a parsed scenario) validated and resolved: every key present, unset optional ones omitted."""
    try:
        model = Scenario.model_validate(doc)
    except ValidationError as exc:
        raise SchemaError(problems(exc)) from None
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
