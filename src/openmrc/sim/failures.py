"""Timed failures of a simulated fabric: `FailureInjector`, one per `openmrc.sim.fabric_sim.FabricSim`.

Links go down and up (what is queued on a port or travelling along its link is lost: the port's epoch
moves on), flap, run degraded, lose packets at random (per link, per plane, everywhere); switches and NIC
ports die (a NIC is told about its own port and tells its peers). Static SRv6 tables never change: MRC
senders bypass dead paths themselves. ECMP routing withdraws dead links only ``reconverge_ns`` after a
change, as a routing protocol converges. Every failure is noted (time, description) for plots, and those
with ports are kept as outages so that a run can report how long traffic still went into them.
"""

from __future__ import annotations

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.topology import PortRef, Topology
from openmrc.sim.engine import Simulator
from openmrc.sim.network import Host, Node, Port
from openmrc.sim.routing import EcmpRouting, Routing

__all__ = ["FailureInjector"]


class FailureInjector:
    """Schedules failures on the ``nodes`` (ports wired as ``topo`` says) of one simulation."""

    def __init__(
        self, sim: Simulator, topo: Topology, nodes: list[Node], routing: Routing, reconverge_ns: int | None
    ) -> None:
        self.sim = sim
        self.topo = topo
        self.nodes = nodes
        self.routing = routing
        self.reconverge_ns = reconverge_ns
        """ECMP routing: how long after a link changes state the switches route around it (None: never)."""
        self.failures: list[tuple[int, str]] = []
        """(time ns, description) of every failure noted so far."""
        self.outages: list[tuple[int, str, list[Port], int | None]] = []
        """Failures with ports: (time, description, the ports, the host whose NIC port failed)."""
        self.watched: int | None = None
        """A host that lost a NIC port (its outgoing goodput is worth watching)."""
        self.reconvergences = 0
        self._reconverge_at: int | None = None
        self.owned: list[bool] | None = None
        """Nodes this process runs when the fabric is split (`openmrc.sim.partition`); None: all. Link
        state changes run everywhere (each process has a copy of every port); a host reacts where it runs."""

    def _ref(self, node: int, port: int) -> PortRef:
        if not 0 <= node < len(self.nodes):
            raise ValueError(f"no node {node} (nodes are 0..{len(self.nodes) - 1})")
        refs = self.topo.ports(node)
        for ref in refs:  # a partly filled T0 has no ports toward the hosts it lacks
            if ref.port == port:
                return ref
        raise ValueError(f"node {node} has no port {port} (it has {len(refs)})")

    def link(self, node: int, port: int) -> tuple[Port, Port]:
        """Both directions of the link on ``port`` (0-based) of ``node``: (node's side, the peer's side)."""
        ref = self._ref(node, port)
        return self.nodes[node].ports[port], self.nodes[ref.peer].ports[ref.peer_port]

    def t0_uplink(self, plane: int, t0: int, uplink: int) -> tuple[int, int]:
        """(node, port) of uplink ``uplink`` of T0 ``t0`` in ``plane`` of a multi-plane Clos."""
        topo = self.topo
        if not isinstance(topo, MultiPlaneClos):
            raise ValueError("T0 uplinks name links of a multi-plane Clos")
        for name, v, hi in (
            ("plane", plane, topo.planes),
            ("t0", t0, topo.t0_per_plane),
            ("uplink", uplink, topo.uplinks),
        ):
            if not 0 <= v < hi:
                raise ValueError(f"{name} {v} outside 0..{hi - 1}")
        return topo.t0(plane, t0), topo.hosts_per_t0 + uplink

    def link_name(self, node: int, port: int) -> str:
        """A link as a reader names it, with the node names `topo plan` gives: "plane 0: T0 3 ↔ T1 1 link
        (p0-t0-3 ↔ p0-t1-1)" between the switches of a multi-plane Clos, else "link N:P"."""
        topo, peer = self.topo, self._ref(node, port).peer
        if isinstance(topo, MultiPlaneClos) and min(node, peer) >= topo.num_hosts:
            (r0, plane, i0), (r1, _, i1) = sorted((topo.switch_info(node), topo.switch_info(peer)))
            a, b = sorted((node, peer), key=topo.switch_info)
            return (
                f"plane {plane}: {r0.name} {i0} ↔ {r1.name} {i1} link "
                f"({topo.node_name(a)} ↔ {topo.node_name(b)})"
            )
        return f"link {node}:{port}"

    def note(self, at: int, what: str, ports: list[Port] | None = None, host: int | None = None) -> None:
        """Record a failure at ``at`` (an outage too when it took ``ports`` down)."""
        self.failures.append((at, what))
        if ports:
            self.outages.append((at, what, ports, host))

    def fail_port(self, port: Port, at: int, up_at: int | None = None) -> None:
        """One direction of a link down at ``at`` (what it queues or carries is lost), up at ``up_at``."""
        if up_at is not None and up_at <= at:
            raise ValueError(f"a link cannot come back up ({up_at} ns) before it fails ({at} ns)")
        port.guarded = True  # from now on arrivals check the link did not fail under them
        self.sim.schedule(at, self._set_port, (port, False))
        if up_at is not None:
            self.sim.schedule(up_at, self._set_port, (port, True))

    def _set_port(self, arg: tuple[Port, bool]) -> None:
        port, up = arg
        port.set_up(up)
        if isinstance(self.routing, EcmpRouting) and self.reconverge_ns is not None:
            at = self.sim.now + self.reconverge_ns
            if at != self._reconverge_at:  # a switch's 1,000 ports going down converge once
                self._reconverge_at = at
                self.sim.schedule(at, self._reconverge)

    def _reconverge(self, _: object = None) -> None:
        assert isinstance(self.routing, EcmpRouting)
        dead = {
            (n, i)
            for n, node in enumerate(self.nodes)
            if n >= self.topo.num_hosts
            for i, p in enumerate(node.ports)
            if not p.up
        }
        if dead != self.routing.dead:
            self.routing.withdraw(dead)
            self.reconvergences += 1

    def fail_link(self, node: int, port: int, at: int, up_at: int | None = None) -> None:
        """Both directions of a link down at ``at`` (and up at ``up_at``)."""
        ports = list(self.link(node, port))
        for p in ports:
            self.fail_port(p, at, up_at)
        name = self.link_name(node, port)
        self.note(at, f"{name} down", ports)
        if up_at is not None:
            self.note(up_at, f"{name} up")

    def flap_link(self, node: int, port: int, at: int, down_ns: int, period_ns: int, count: int) -> None:
        """``count`` times, starting at ``at`` and every ``period_ns``: down for ``down_ns``."""
        if not 0 < down_ns < period_ns or count < 1:
            raise ValueError(f"flap: need 0 < down ({down_ns} ns) < period ({period_ns} ns) and count ≥ 1")
        for i in range(count):
            t = at + i * period_ns
            for p in self.link(node, port):
                self.fail_port(p, t, t + down_ns)
        self.note(at, f"link {node}:{port} flaps ×{count}")

    def fail_switch(self, node: int, at: int, up_at: int | None = None) -> None:
        """Every link of switch ``node`` down at ``at`` (and up at ``up_at``)."""
        if node < self.topo.num_hosts or node >= len(self.nodes):
            raise ValueError(f"node {node} is not a switch")
        ports = [p for ref in self.topo.ports(node) for p in self.link(node, ref.port)]
        for p in ports:
            self.fail_port(p, at, up_at)
        self.note(at, f"switch {node} down", ports)

    def degrade_link(self, node: int, port: int, at: int, fraction: float, until: int | None = None) -> None:
        """Both directions of a link run at ``fraction`` of their rate from ``at`` (until ``until``)."""
        if not 0 < fraction <= 1:
            raise ValueError(f"degrade: fraction {fraction} outside (0, 1]")
        if until is not None and until <= at:
            raise ValueError(f"degrade: until ({until} ns) must come after at ({at} ns)")
        for p in self.link(node, port):
            self.sim.schedule(at, self._set_rate, (p, max(1, int(p.nominal_bps * fraction))))
            if until is not None:
                self.sim.schedule(until, self._set_rate, (p, p.nominal_bps))
        self.note(at, f"link {node}:{port} at {fraction:.0%}")

    @staticmethod
    def _set_rate(arg: tuple[Port, int]) -> None:
        arg[0].set_rate(arg[1])

    def plane_ports(self, plane: int) -> list[Port]:
        """Every port (both directions of every link) of ``plane`` (0-based) of a multi-plane Clos."""
        topo = self.topo
        if not isinstance(topo, MultiPlaneClos):
            raise ValueError("planes exist only in a multi-plane Clos")
        if not 0 <= plane < topo.planes:
            raise ValueError(f"plane {plane} outside 0..{topo.planes - 1}")
        out = [self.nodes[h].ports[plane] for h in range(topo.num_hosts)]
        for n in range(topo.t0(plane, 0), topo.t1(plane, topo.t1_per_plane - 1) + 1):
            ports = self.nodes[n].ports
            out.extend(ports[r.port] for r in topo.ports(n))
        return out

    def set_loss(self, ports: list[Port], probability: float, at: int = 0, until: int | None = None) -> None:
        """Random loss with ``probability`` on ``ports`` from ``at`` (until ``until``)."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"loss probability {probability} is not within [0, 1]")
        if until is not None and until <= at:
            raise ValueError(f"loss: until ({until} ns) must come after at ({at} ns)")
        self.sim.schedule(at, self._set_loss, (ports, probability))
        if until is not None:
            self.sim.schedule(until, self._set_loss, (ports, 0.0))

    @staticmethod
    def _set_loss(arg: tuple[list[Port], float]) -> None:
        for p in arg[0]:
            p.set_loss(arg[1])

    def fail_nic_port(self, host: int, port: int, at: int, up_at: int | None = None) -> None:
        """NIC port ``port`` (1-based plane) of ``host`` dies at ``at``: both link directions go down and the
        host's transport is told (it stops using that plane's EVs)."""
        h = self.nodes[host] if 0 <= host < self.topo.num_hosts else None
        if h is None:
            raise ValueError(f"no host {host}")
        if not 1 <= port <= len(h.ports):
            raise ValueError(f"host {host} has no port {port}")
        ports = list(self.link(host, port - 1))
        for p in ports:
            self.fail_port(p, at, up_at)
        self.note(at, f"host {host} NIC port {port} down", ports, host)
        self.watched = host
        if isinstance(h, Host):
            self.sim.schedule(at, self._nic_port, (h, port, False))
            if up_at is not None:
                self.sim.schedule(up_at, self._nic_port, (h, port, True))

    def _nic_port(self, arg: tuple[Host, int, bool]) -> None:
        h, port, up = arg
        if self.owned is not None and not self.owned[h.id]:
            return
        now = self.sim.now
        if up:
            h.nic.port_up(port, now=now)
        else:
            h.nic.port_down(port, now=now)
        h.pump(now)
