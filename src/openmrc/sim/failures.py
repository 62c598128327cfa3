"""Timed failures of a simulated fabric: `FailureInjector`, one per `openmrc.sim.fabric_sim.FabricSim`.

Links go down and up (what is queued on a port or travelling along its link is lost: the port's epoch
moves on), flap, run degraded, lose packets at random (per link, per plane, everywhere); switches and NIC
ports die (a NIC is told about its own port and tells its peers). Static SRv6 tables never change: MRC
senders bypass dead paths themselves. ECMP routing withdraws dead links only ``reconverge_ns`` after a
change, as a routing protocol converges. Every failure is noted (time, description) for plots, and those
with ports are kept as outages so that a run can report how long traffic still went into them.

A fabric built in parts (`openmrc.sim.partition`) schedules every failure in every process, as one built
whole does (the same events, so the same event counts and order), and each event changes only the ports
that exist here: this process's nodes' ports (a shared switch's: those it runs here) and the stand-ins of
ports that lead into them (``ghosts``).
Which switch ports are down, all that ECMP reconvergence needs, is kept by (node, port), everywhere.
"""

from __future__ import annotations

import bisect

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.topology import PortRef, Topology
from openmrc.sim.engine import Simulator
from openmrc.sim.network import Host, Node, Port, Remote
from openmrc.sim.routing import EcmpRouting, Routing

__all__ = ["FailureInjector"]


class FailureInjector:
    """Schedules failures on the ``nodes`` (ports wired as ``topo`` says) of one simulation."""

    def __init__(
        self,
        sim: Simulator,
        topo: Topology,
        nodes: list[Node],
        routing: Routing,
        reconverge_ns: int | None,
        ghosts: dict[tuple[int, int], Port] | None = None,
        elsewhere: Port | None = None,
    ) -> None:
        self.sim = sim
        self.topo = topo
        self.nodes = nodes
        self.routing = routing
        self.reconverge_ns = reconverge_ns
        """ECMP routing: how long after a link changes state the switches route around it (None: never)."""
        self.failures: list[tuple[int, str]] = []
        """(time ns, description) of every failure noted so far."""
        self.outages: list[tuple[int, str, list[tuple[int, int]], int | None]] = []
        """Failures with ports: (time, description, the ports as (node, port), the host whose NIC port
        failed)."""
        self.watched: int | None = None
        """A host that lost a NIC port (its outgoing goodput is worth watching)."""
        self.reconvergences = 0
        self._reconverge_at: int | None = None
        self._ghosts = ghosts or {}
        self.reroutes: list[int] = []
        """When the routing may change (ECMP reconverging after a link changed state), in order: a split
        run routes a packet sent into a shared switch ahead only when no change falls before it arrives
        (`openmrc.sim.parallel.exchange._Splitter`)."""
        self._elsewhere = elsewhere
        """What holds the place of a shared switch's port another process runs (`Partition.elsewhere`)."""
        self._down: set[tuple[int, int]] = set()  # switch ports down, as (node, port)
        self._refs: dict[int, tuple[int, int]] | None = None  # id(port) -> (node, port), for `fail_port`
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

    def link_ports(self, node: int, port: int) -> list[Port]:
        """The directions of the link on ``port`` of ``node`` that this process sends on (both, unless the
        fabric is built in parts): where loss is drawn."""
        ports = [
            self.nodes[n].ports[i]
            for n, i in self._link_refs(node, port)
            if not isinstance(self.nodes[n], Remote)
        ]
        return [p for p in ports if p is not self._elsewhere]

    def _link_refs(self, node: int, port: int) -> list[tuple[int, int]]:
        """Both directions of a link as (node, port), whether this process built them or not."""
        ref = self._ref(node, port)
        return [(node, port), (ref.peer, ref.peer_port)]

    def _port(self, ref: tuple[int, int]) -> Port | None:
        """The port (node, port) if this process has it (or a stand-in of it), else None."""
        node = self.nodes[ref[0]]
        if isinstance(node, Remote):
            return self._ghosts.get(ref)
        p = node.ports[ref[1]]
        return None if p is self._elsewhere else p

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

    def note(
        self, at: int, what: str, ports: list[tuple[int, int]] | None = None, host: int | None = None
    ) -> None:
        """Record a failure at ``at`` (an outage too when it took ``ports``, as (node, port), down)."""
        self.failures.append((at, what))
        if ports:
            self.outages.append((at, what, ports, host))

    def fail_port(self, port: Port, at: int, up_at: int | None = None) -> None:
        """One direction of a link down at ``at`` (what it queues or carries is lost), up at ``up_at``."""
        refs = self._refs
        if refs is None:
            refs = self._refs = {
                id(p): (n, i) for n, nd in enumerate(self.nodes) for i, p in enumerate(nd.ports)
            }
        self._fail(refs[id(port)], at, up_at)

    def _fail(self, ref: tuple[int, int], at: int, up_at: int | None) -> None:
        if up_at is not None and up_at <= at:
            raise ValueError(f"a link cannot come back up ({up_at} ns) before it fails ({at} ns)")
        port = self._port(ref)
        if port is not None:
            port.guarded = True  # from now on arrivals check the link did not fail under them
        self.sim.schedule(at, self._set_port, (port, ref, False))
        if up_at is not None:
            self.sim.schedule(up_at, self._set_port, (port, ref, True))
        if isinstance(self.routing, EcmpRouting) and self.reconverge_ns is not None:
            for t in (at, up_at):
                if t is not None:
                    bisect.insort(self.reroutes, t + self.reconverge_ns)

    def _set_port(self, arg: tuple[Port | None, tuple[int, int], bool]) -> None:
        port, ref, up = arg
        if port is not None:
            port.set_up(up)
        if ref[0] >= self.topo.num_hosts:
            if up:
                self._down.discard(ref)
            else:
                self._down.add(ref)
        if isinstance(self.routing, EcmpRouting) and self.reconverge_ns is not None:
            at = self.sim.now + self.reconverge_ns
            if at != self._reconverge_at:  # a switch's 1,000 ports going down converge once
                self._reconverge_at = at
                self.sim.schedule(at, self._reconverge)

    def _reconverge(self, _: object = None) -> None:
        assert isinstance(self.routing, EcmpRouting)
        dead = set(self._down)
        if dead != self.routing.dead:
            self.routing.withdraw(dead)
            self.reconvergences += 1

    def fail_link(self, node: int, port: int, at: int, up_at: int | None = None) -> None:
        """Both directions of a link down at ``at`` (and up at ``up_at``)."""
        refs = self._link_refs(node, port)
        for r in refs:
            self._fail(r, at, up_at)
        name = self.link_name(node, port)
        self.note(at, f"{name} down", refs)
        if up_at is not None:
            self.note(up_at, f"{name} up")

    def flap_link(self, node: int, port: int, at: int, down_ns: int, period_ns: int, count: int) -> None:
        """``count`` times, starting at ``at`` and every ``period_ns``: down for ``down_ns``."""
        if not 0 < down_ns < period_ns or count < 1:
            raise ValueError(f"flap: need 0 < down ({down_ns} ns) < period ({period_ns} ns) and count ≥ 1")
        for i in range(count):
            t = at + i * period_ns
            for r in self._link_refs(node, port):
                self._fail(r, t, t + down_ns)
        self.note(at, f"link {node}:{port} flaps ×{count}")

    def fail_switch(self, node: int, at: int, up_at: int | None = None) -> None:
        """Every link of switch ``node`` down at ``at`` (and up at ``up_at``)."""
        if node < self.topo.num_hosts or node >= len(self.nodes):
            raise ValueError(f"node {node} is not a switch")
        refs = [r for ref in self.topo.ports(node) for r in self._link_refs(node, ref.port)]
        for r in refs:
            self._fail(r, at, up_at)
        self.note(at, f"switch {node} down", refs)

    def degrade_link(self, node: int, port: int, at: int, fraction: float, until: int | None = None) -> None:
        """Both directions of a link run at ``fraction`` of their rate from ``at`` (until ``until``)."""
        if not 0 < fraction <= 1:
            raise ValueError(f"degrade: fraction {fraction} outside (0, 1]")
        if until is not None and until <= at:
            raise ValueError(f"degrade: until ({until} ns) must come after at ({at} ns)")
        for r in self._link_refs(node, port):
            p = self._port(r)  # (None: another process's; the events are the same everywhere)
            bps = 0 if p is None else p.nominal_bps
            self.sim.schedule(at, self._set_rate, (p, max(1, int(bps * fraction))))
            if until is not None:
                self.sim.schedule(until, self._set_rate, (p, bps))
        self.note(at, f"link {node}:{port} at {fraction:.0%}")

    @staticmethod
    def _set_rate(arg: tuple[Port | None, int]) -> None:
        p = arg[0]
        if p is not None:
            p.set_rate(arg[1])

    def plane_ports(self, plane: int) -> list[Port]:
        """Every port (both directions of every link) of ``plane`` (0-based) of a multi-plane Clos (built in
        parts: those of this process's nodes, the only ones that send here)."""
        topo = self.topo
        if not isinstance(topo, MultiPlaneClos):
            raise ValueError("planes exist only in a multi-plane Clos")
        if not 0 <= plane < topo.planes:
            raise ValueError(f"plane {plane} outside 0..{topo.planes - 1}")
        nodes = self.nodes
        out = [nodes[h].ports[plane] for h in range(topo.num_hosts) if not isinstance(nodes[h], Remote)]
        for n in range(topo.t0(plane, 0), topo.t1(plane, topo.t1_per_plane - 1) + 1):
            if isinstance(nodes[n], Remote):
                continue
            ports = nodes[n].ports
            out.extend(ports[r.port] for r in topo.ports(n) if ports[r.port] is not self._elsewhere)
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
        if not 1 <= port <= len(self.topo.ports(host)):
            raise ValueError(f"host {host} has no port {port}")
        refs = self._link_refs(host, port - 1)
        for r in refs:
            self._fail(r, at, up_at)
        self.note(at, f"host {host} NIC port {port} down", refs, host)
        self.watched = host
        if isinstance(h, (Host, Remote)):  # (a remote host of a fabric built in parts is an MRC host)
            self.sim.schedule(at, self._nic_port, (host, port, False))
            if up_at is not None:
                self.sim.schedule(up_at, self._nic_port, (host, port, True))

    def _nic_port(self, arg: tuple[int, int, bool]) -> None:
        host, port, up = arg
        h = self.nodes[host]
        if not isinstance(h, Host) or (self.owned is not None and not self.owned[host]):
            return
        now = self.sim.now
        if up:
            h.nic.port_up(port, now=now)
        else:
            h.nic.port_down(port, now=now)
        h.pump(now)
