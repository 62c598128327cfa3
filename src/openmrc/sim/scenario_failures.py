"""The failure kinds of a scenario's ``[[failures]]``: for each kind, the schema of its keys, which of them
it needs, and, beside them, what it schedules on the fabric's `openmrc.sim.failures.FailureInjector`.
`FAILURES` holds them by kind; `Failure`, one entry as the schema validates it, is every kind's keys
together. Where a failure strikes is named the same way for every kind (`Place`): a link by
``plane``/``t0``/``uplink`` (a T0's uplink in a multi-plane Clos) or by ``node``/``port`` (any topology), a
switch by ``node`` or by ``plane``/``tier``/``index``, a NIC port by ``host``/``port``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import model_validator

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.failures import FailureInjector
from openmrc.sim.scenario_fields import Section, setting

__all__ = [
    "FAILURES",
    "DegradeKeys",
    "Failure",
    "FailureKeys",
    "FailureKind",
    "FlapKeys",
    "LossKeys",
    "Place",
]


def _ns(us: float | None) -> int | None:
    return None if us is None else int(us * 1000)


T = TypeVar("T")


def _given(value: T | None, key: str) -> T:
    """``value``, a key a failure needs here (KeyError naming it when the entry left it out)."""
    if value is None:
        raise KeyError(key)
    return value


class FailureKeys(Section):
    """The keys of every failure kind: what fails, and when."""

    kind: Literal["t0_uplink", "link", "switch", "nic_port", "flap", "degrade", "loss"] = setting(
        ..., "", "what fails"
    )
    at_us: float | None = setting(None, "µs", "when (required except for loss, which starts at 0)", ge=0)
    up_at_us: float | None = setting(None, "µs", "when it recovers (default: never)", ge=0)
    until_us: float | None = setting(None, "µs", "degrade, loss: when it ends (default: never)", ge=0)

    def at_ns(self) -> int:
        return _ns(self.at_us) or 0

    def up_ns(self) -> int | None:
        return _ns(self.up_at_us)


class Place(FailureKeys):
    """Where a failure strikes: a link, a switch, a NIC port (see the module notes)."""

    plane: int | None = setting(None, "", "the plane of the link or switch", ge=0)
    t0: int | None = setting(None, "", "t0_uplink: the T0 (within its plane)", ge=0)
    uplink: int | None = setting(None, "", "t0_uplink: the T0's uplink", ge=0)
    node: int | None = setting(None, "", "a node id (as `openmrc topo plan` numbers them)", ge=0)
    port: int | None = setting(None, "", "the node's port (nic_port: the host's port = plane)", ge=0)
    host: int | None = setting(None, "", "nic_port: the host", ge=0)
    tier: Literal["t0", "t1"] | None = setting(None, "", "switch: the tier of a switch named by plane")
    index: int | None = setting(None, "", "switch: its index within the plane's tier", ge=0)

    def link_keys(self) -> tuple[str, ...]:
        """The keys that name a link: node/port when a node is given, else plane/t0/uplink."""
        return ("node", "port") if self.node is not None else ("plane", "t0", "uplink")

    def link(self, faults: FailureInjector) -> tuple[int, int]:
        """The link as (node, port)."""
        if self.node is not None:
            return self.node, _given(self.port, "port")
        return faults.t0_uplink(
            _given(self.plane, "plane"), _given(self.t0, "t0"), _given(self.uplink, "uplink")
        )

    def switch(self, sim: FabricSim) -> int:
        """The switch's node id."""
        if self.node is not None:
            return self.node
        topo = sim.topo
        if not isinstance(topo, MultiPlaneClos):
            raise ValueError("plane/tier/index name switches of a multi-plane Clos; give node")
        tier, plane, index = (
            _given(self.tier, "tier"),
            _given(self.plane, "plane"),
            _given(self.index, "index"),
        )
        count = topo.t0_per_plane if tier == "t0" else topo.t1_per_plane
        if not 0 <= plane < topo.planes or not 0 <= index < count:
            raise ValueError(f"no {tier} {index} in plane {plane}")
        return topo.t0(plane, index) if tier == "t0" else topo.t1(plane, index)


K = TypeVar("K", bound=FailureKeys)
Apply = Callable[[FabricSim, K], None]


@dataclass(frozen=True, slots=True)
class FailureKind:
    """One kind of failure."""

    keys: type[FailureKeys]
    """The schema of its keys (a part of `Failure`)."""
    needs: Callable[[Any], tuple[str, ...]]
    """The keys an entry of this kind must give, besides ``at_us`` (they may depend on the others given)."""
    apply: Callable[[FabricSim, Any], None]
    """Schedules it: ``apply(sim, failure)``."""
    timed: bool = True
    """Whether it needs ``at_us`` (else it starts at 0)."""


FAILURES: dict[str, FailureKind] = {}
"""Every failure kind by name (``[[failures]] kind``)."""


def _kind(
    name: str, keys: type[K], needs: Callable[[K], tuple[str, ...]], *, timed: bool = True
) -> Callable[[Apply[K]], Apply[K]]:
    def register(apply: Apply[K]) -> Apply[K]:
        FAILURES[name] = FailureKind(keys, needs, apply, timed)
        return apply

    return register


# -- the kinds, each its keys then what it schedules --------------------------------------------------------


@_kind("t0_uplink", Place, lambda f: ("plane", "t0", "uplink"))
def _t0_uplink(sim: FabricSim, f: Place) -> None:
    sim.faults.fail_link(*f.link(sim.faults), f.at_ns(), f.up_ns())


@_kind("link", Place, lambda f: ("node", "port"))
def _link(sim: FabricSim, f: Place) -> None:
    sim.faults.fail_link(*f.link(sim.faults), f.at_ns(), f.up_ns())


@_kind("switch", Place, lambda f: ("node",) if f.node is not None else ("plane", "tier", "index"))
def _switch(sim: FabricSim, f: Place) -> None:
    sim.faults.fail_switch(f.switch(sim), f.at_ns(), f.up_ns())


@_kind("nic_port", Place, lambda f: ("host", "port"))
def _nic_port(sim: FabricSim, f: Place) -> None:
    sim.faults.fail_nic_port(_given(f.host, "host"), _given(f.port, "port"), f.at_ns(), f.up_ns())


class FlapKeys(Place):
    down_us: float | None = setting(None, "µs", "flap: how long each outage lasts", gt=0)
    period_us: float | None = setting(None, "µs", "flap: time between outages", gt=0)
    count: int = setting(1, "", "flap: outages", ge=1)


@_kind("flap", FlapKeys, lambda f: ("down_us", "period_us", *f.link_keys()))
def _flap(sim: FabricSim, f: FlapKeys) -> None:
    down, period = _given(_ns(f.down_us), "down_us"), _given(_ns(f.period_us), "period_us")
    sim.faults.flap_link(*f.link(sim.faults), f.at_ns(), down, period, f.count)


class DegradeKeys(Place):
    fraction: float | None = setting(None, "fraction", "degrade: the rate left to the link", gt=0, le=1)


@_kind("degrade", DegradeKeys, lambda f: ("fraction", *f.link_keys()))
def _degrade(sim: FabricSim, f: DegradeKeys) -> None:
    sim.faults.degrade_link(*f.link(sim.faults), f.at_ns(), _given(f.fraction, "fraction"), _ns(f.until_us))


class LossKeys(Place):
    probability: float | None = setting(None, "fraction", "loss: per-packet loss probability", ge=0, le=1)


@_kind("loss", LossKeys, lambda f: ("probability",), timed=False)
def _loss(sim: FabricSim, f: LossKeys) -> None:
    """On a link, on every link of a ``plane`` (no t0 given), or (neither given) on every link."""
    faults = sim.faults
    prob = _given(f.probability, "probability")
    at = f.at_ns()
    if f.plane is not None and f.t0 is None:
        ports = faults.plane_ports(f.plane)
        where = f"plane {f.plane}"
    elif f.node is not None or f.t0 is not None:
        link = f.link(faults)
        ports = faults.link_ports(*link)
        where = "link {}:{}".format(*link)
    else:
        ports = [p for node in sim.nodes for p in node.ports]
        where = "every link"
    faults.set_loss(ports, prob, at, _ns(f.until_us))
    if prob:
        faults.note(at, f"{prob:.2%} loss on {where}")


class Failure(
    # pydantic puts the keys of the last base first: the kinds' keys read in the order they are defined above
    LossKeys,
    DegradeKeys,
    FlapKeys,
):
    """One timed failure. A link is named by plane/t0/uplink (a T0's uplink) or by node/port; a switch by
    node or by plane/tier/index; loss applies to a link, a plane or (neither given) every link."""

    @model_validator(mode="after")
    def _needs(self) -> Failure:
        kind = FAILURES[self.kind]
        if kind.timed and self.at_us is None:
            raise ValueError(f"kind {self.kind!r} needs at_us")
        missing = [k for k in kind.needs(self) if getattr(self, k) is None]
        if missing:
            raise ValueError(f"kind {self.kind!r} needs {', '.join(missing)}")
        return self
