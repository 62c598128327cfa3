"""`FabricSim`: the simulator's front door. A fabric running a real transport on every host.

Construction goes in named steps: routing (SRv6 uSID plan on a `MultiPlaneClos`, or ECMP on any topology),
buffer sizing from the longest path's bandwidth-delay product, the hosts (`openmrc.sim.hosts.HOST_KINDS`
picks MRC or RoCEv2 hosts once, from `FabricSimConfig.transport`), the switches, and every link wired as two
`Port`s. Failures are scheduled through ``faults`` (`FailureInjector`). Flows are messages between hosts
(`openmrc.sim.flows.Flow`); each starts at a time or on a `Trigger`, and finishes when its sender's (and,
with an immediate, its receiver's) completion arrives. `run` returns the flows' completion times and the
fabric's counters (`openmrc.sim.metrics.SimResults`).

A split run (`openmrc.sim.parallel`) builds each process's part only (``part``, a `Partition`: the nodes
it runs); the others hold their places as `openmrc.sim.network.Remote` nodes and
`openmrc.sim.hosts.RemoteHost` hosts, and a port of another process that leads into this part has a
stand-in here (`Partition.ghosts`).

Applications drive hosts directly as well: ``host(i)`` is host i's `MrcHost` (NIC, QPs, CQs, memory
registration, posting) and ``verbs_device(i)`` that host as an `openmrc.verbs` device.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.fattree import FoldedClos
from openmrc.fabric.srv6 import UsidPlan
from openmrc.fabric.topology import Topology
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.engine import PausedGc, Simulator
from openmrc.sim.failures import FailureInjector
from openmrc.sim.flows import Flow, Trigger
from openmrc.sim.hosts import HOST_KINDS, HostEnv, MrcHost, RemoteHost, SimHost
from openmrc.sim.metrics import LinkStat, Outage, Sampler, SimResults
from openmrc.sim.network import (
    HEADER_BYTES,
    UNLIMITED,
    Node,
    OrderedPort,
    Port,
    PortCold,
    Remote,
    Switch,
    Unwired,
)
from openmrc.sim.routing import EcmpRouting, Routing, SrRouting, crossing_pairs
from openmrc.sim.verbs_host import SimHostDevice
from openmrc.transport import Nic, Qp, WcStatus

__all__ = ["FabricSim", "Partition"]


@dataclass(slots=True)
class PortTotals:
    """The ports' figures of a split run, gathered from every process (`openmrc.sim.parallel.merge`): what
    `FabricSim.results` reports in place of its own ports' (most of which it did not build or run)."""

    links: list[LinkStat]
    counts: dict[str, int]
    """drops, trims, ecn_marks, packet_hops, losses over every port; retransmits over every host."""
    down_drop_at: dict[tuple[int, int], int]
    """(node, port) -> when it last dropped a data packet because it was down."""


class Partition:
    """A simulation's share of a split run (`openmrc.sim.parallel`): the nodes this process runs, and
    what building or running only them needs and makes. `openmrc.sim.partition.assign` gives one to build
    a part with (`FabricSim`'s ``part``); a run split from a fabric built whole sets one of its own."""

    def __init__(
        self,
        owned: list[bool],
        *,
        rank: int = -1,
        size: int = 0,
        rank_of: list[int] | None = None,
        built: bool = True,
    ) -> None:
        self.owned = owned
        """Nodes this process runs, by id."""
        self.rank = rank
        """This process's rank (-1: not known until the run)."""
        self.size = size
        """Ranks of the run (0: not known until the run)."""
        self.rank_of = rank_of
        """The rank of every node, by id (`openmrc.sim.partition.assign_ranks`; None: the run works them
        out)."""
        self.built = built
        """Only the ``owned`` nodes were built (else all were: the others stay idle replicas)."""
        self.shared: list[bool] | None = None
        """The switches every process runs (`shared_switches`), each with the ports that lead to its own
        nodes; None: none (built in parts that run each switch whole, on one of them)."""
        self.ghosts: dict[tuple[int, int], Port] = {}
        """Built in parts: (node, port) -> a stand-in for that port of another process's node whose link
        leads into this part: it delivers what the port ships here (through its epoch check once guarded)
        and fails with the link."""
        self.elsewhere: Port | None = None
        """Built in parts: what holds the place of a shared switch's port that another process runs (one
        object for all of them, never sent on); else None."""
        self.cut_qps: list[tuple[int, int, Qp]] = []
        """Built in parts: the QPs whose peer QP another process makes (`HostEnv.cut`)."""
        self.totals: PortTotals | None = None
        """The whole run's port figures, once the run is over (set by `openmrc.sim.parallel.merge`)."""
        self.build_times: dict[str, float] = {}
        """What building this part took, in seconds (and MB): a builder may note its own phases here; the
        run adds the builder's whole call and reports them with the rank's timings (`SimResults.timings`)."""


def shared_switches(topo: Topology) -> list[bool] | None:
    """The switches a split run shares out port by port (by node id; None: none): those whose every
    neighbour is a tier below them (the T1s of a two-tier `MultiPlaneClos`, a fat tree's cores, a
    leaf-spine's spines). Such a switch sends a packet down the port its routing picks from the packet and
    the fabric's routing state alone (SRv6 tables, ECMP over the live next hops), so the process that
    sends a packet into it can route it there and hand it to the process that runs that port (the one of
    the node behind it): a packet crosses between processes only when its two ends are in different ones,
    not once more at the top (`openmrc.sim.parallel.exchange._Splitter`)."""
    shared = [False] * topo.num_nodes()
    if isinstance(topo, MultiPlaneClos):  # from its shape (its millions of port references unmade)
        if not topo.uplinks:
            return None
        for plane in range(topo.planes):
            for j in range(topo.t1_per_plane):
                shared[topo.t1(plane, j)] = True
        return shared
    tier = [0] * topo.num_nodes()  # hops from the nearest host
    seen = [False] * topo.num_nodes()
    frontier = list(range(topo.num_hosts))
    for h in frontier:
        seen[h] = True
    hops = 0
    while frontier:
        hops += 1
        later = []
        for n in frontier:
            for r in topo.ports(n):
                if not seen[r.peer]:
                    seen[r.peer] = True
                    tier[r.peer] = hops
                    later.append(r.peer)
        frontier = later
    for n in range(topo.num_hosts, topo.num_nodes()):
        refs = topo.ports(n)
        shared[n] = seen[n] and bool(refs) and all(tier[r.peer] == tier[n] - 1 for r in refs)
    return shared if any(shared) else None


class FabricSim:
    """Build once, add flows, run. Works on any topology with ECMP routing; SRv6 needs a MultiPlaneClos."""

    def __init__(
        self,
        topo: Topology,
        config: FabricSimConfig,
        *,
        longest_path_links: int,
        owned: list[bool] | None = None,
        part: Partition | None = None,
    ) -> None:
        """``part``: build only its nodes, one part of a split run (needs an ordered MRC fabric); ``owned``:
        the same from the nodes alone (by id); neither: the whole fabric."""
        self.config = config
        self.topo = topo
        self.sim = Simulator()
        if config.ordered:
            self.sim.order_by_origin(topo.num_nodes() + 1)
        if owned is not None:
            if part is not None:
                raise ValueError("owned or part, not both")
            part = Partition(owned)
        if part is not None:
            owned = part.owned
            if len(owned) != topo.num_nodes():
                raise ValueError(f"owned: {len(owned)} flags for {topo.num_nodes()} nodes")
            if not config.ordered or config.transport != "mrc" or config.pfc:
                raise ValueError("a fabric built in parts needs ordered mode and MRC hosts without PFC")
            shared = shared_switches(topo)
            if shared is not None and not all(owned[n] for n, s in enumerate(shared) if s):
                shared = None  # a part that runs some of those switches whole, others not at all
            part.shared = shared
        self.part = part
        """This process's share of a split run (built in parts, or set by the run); None: it runs it all."""
        self.rng = random.Random(config.seed)
        self.flows: list[Flow] = []
        self.completed = 0
        self._recv_wait = 0  # started messages whose receiver has not yet seen them complete
        self.jobs: list[Any] = []
        """Work other than flows that the run must wait for: objects with a ``running`` property (a
        collective of real Communicators on the hosts, `openmrc.collectives.simworld.CollectiveJob`)."""
        self._transient = False  # see `transient_connections`
        self.sampler: Sampler | None = None
        self._watched: list[tuple[SimHost, Any, list[Flow]]] = []  # connections watched for recovery
        self._outage_pairs: list[tuple[int, ...]] = []  # per outage: indices into the watched connections
        self._outage_scope: list[tuple[int, int]] = []  # per outage: host pairs with a path through it, and
        # their connections (of which those in _outage_pairs: the ones whose packets go through it)
        planes = len(topo.ports(0))
        if not 0 <= config.roce_planes <= planes:
            raise ValueError(f"FabricSimConfig.roce_planes: {config.roce_planes} outside 0..{planes}")
        with PausedGc():  # a large fabric is millions of long-lived objects: see PausedGc
            self.plan, self.routing = self._build_routing()
            self.base_rtt_ns = self._base_rtt(longest_path_links)
            self.hosts = self._build_hosts()
            self.nodes: list[Node] = [h.node for h in self.hosts]
            self.nodes.extend(
                Switch(self.sim, n, self.routing) if owned is None or owned[n] else Remote(n)
                for n in range(topo.num_hosts, topo.num_nodes())
            )
            elsewhere = self._wire()
        if part is not None:
            part.elsewhere = elsewhere
        self.faults = FailureInjector(
            self.sim,
            topo,
            self.nodes,
            self.routing,
            config.ecmp_reconverge_ns,
            None if part is None else part.ghosts,
            elsewhere,
        )
        """Links, switches and NIC ports failing on schedule."""

    @classmethod
    def clos(
        cls,
        config: FabricSimConfig | None = None,
        *,
        owned: list[bool] | None = None,
        part: Partition | None = None,
    ) -> FabricSim:
        """A simulation of the `MultiPlaneClos` that ``config`` describes (only ``part``'s, or the ``owned``,
        nodes)."""
        cfg = config or FabricSimConfig()
        return cls(cfg.clos(), cfg, longest_path_links=4, owned=owned, part=part)

    @classmethod
    def fat_tree(
        cls,
        topo: FoldedClos,
        config: FabricSimConfig | None = None,
        *,
        owned: list[bool] | None = None,
        part: Partition | None = None,
    ) -> FabricSim:
        """A simulation of a fat tree or leaf-spine (`openmrc.fabric.FatTree`): one plane, ECMP routing, MRC
        EVs are UDP source ports that every switch hashes."""
        cfg = config or FabricSimConfig(routing="ecmp")
        if cfg.routing != "ecmp":
            raise ValueError("FabricSimConfig.routing: a fat tree routes by ECMP")
        return cls(topo, cfg, longest_path_links=2 * topo.tiers, owned=owned, part=part)

    # -- construction steps ----------------------------------------------------------------------------------
    def _build_routing(self) -> tuple[UsidPlan | None, Routing]:
        topo, cfg = self.topo, self.config
        if cfg.routing == "srv6":
            if not isinstance(topo, MultiPlaneClos):
                raise ValueError("FabricSimConfig.routing: srv6 needs a MultiPlaneClos fabric")
            plan = UsidPlan(topo)
            return plan, SrRouting(plan)
        return None, EcmpRouting(topo, cfg.seed, None if self.part is None else self.part.owned)

    def _base_rtt(self, hops: int) -> int:
        """Round trip of a full packet over the longest path, unloaded."""
        refs = self.topo.ports(0)
        link_bps = max(r.bps for r in refs)
        lat = max(r.latency_ns for r in refs)
        pkt_ns = (self.config.mtu + HEADER_BYTES) * 8_000_000_000 // link_bps
        return 2 * hops * lat + hops * pkt_ns + hops * HEADER_BYTES * 8_000_000_000 // link_bps

    def _build_hosts(self) -> list[SimHost]:
        refs = self.topo.ports(0)
        part = self.part
        env = HostEnv(
            engine=self.sim,
            config=self.config,
            rng=self.rng,
            hosts=self.topo.num_hosts,
            planes=len(refs),
            link_bps=max(r.bps for r in refs),
            base_rtt_ns=self.base_rtt_ns,
            plan=self.plan,
            flows=self.flows,
            finished=self._finished,
            received=self._received,
            owned=None if part is None else part.owned[: self.topo.num_hosts],
            cut=None if part is None else part.cut_qps,
        )
        return HOST_KINDS[self.config.transport](env)

    def _wire(self) -> Port | None:
        """Every link as two ports (only the ``owned`` nodes'; the placeholder of the shared switches' ports
        that another process runs returned). Switch buffers hold one bandwidth-delay product (or
        ``buffer_bytes``)."""
        cfg, topo, hosts = self.config, self.topo, self.topo.num_hosts
        link_bps = max(r.bps for r in topo.ports(0))
        bdp = link_bps * self.base_rtt_ns // 8_000_000_000
        buffer = cfg.buffer_bytes if cfg.buffer_bytes is not None else max(bdp, 2 * (cfg.mtu + HEADER_BYTES))
        ecn = None if cfg.ecn is None else (int(buffer * cfg.ecn[0]), int(buffer * cfg.ecn[1]))
        last_hop_apart = self.hosts[0].last_hop_apart if self.hosts else False
        mark_last = ecn if cfg.last_hop_ecn else None
        port_rng = random.Random(self.rng.getrandbits(64))
        ordered = cfg.ordered
        # ordered: each port draws from its own stream (draws that do not depend on which other ports a
        # process runs)
        rng = None if ordered else port_rng
        colds: dict[tuple[int, ...], PortCold] = {}  # ports built alike share what they seldom change
        unwired = Unwired(-1)
        part = self.part
        owned = None if part is None else part.owned
        shared = None if part is None else part.shared
        ghosts: dict[tuple[int, int], Port] = {} if part is None else part.ghosts
        elsewhere: Port | None = None
        if owned is not None and shared is not None:
            elsewhere = Port(
                self.sim, Remote(-1), link_bps, 0, buffer=buffer, ecn=None, trimming=False, last_hop=False,
                rng=None, shared=colds,
            )  # fmt: skip
        for n, node in enumerate(self.nodes):
            if owned is not None and not owned[n]:
                continue
            is_host = n < hosts
            split = shared is not None and shared[n]
            for ref in topo.ports(n):
                if owned is not None and not owned[ref.peer]:  # the way back: a stand-in (only its epoch,
                    # guard and drops count: it never sends)
                    ghost = ghosts[ref.peer, ref.peer_port] = OrderedPort(
                        self.sim, node, ref.bps, ref.latency_ns, buffer=buffer, ecn=None, trimming=False,
                        last_hop=False, rng=None, shared=colds,
                    )  # fmt: skip
                    ghost.place(ref.peer + 1, 0)
                while len(node.ports) < ref.port:  # a partly filled T0's ports toward hosts it lacks
                    node.ports.append(
                        Port(
                            self.sim, unwired, ref.bps, 0, buffer=buffer, ecn=None, trimming=False,
                            last_hop=False, rng=port_rng, shared=colds,
                        )
                    )  # fmt: skip
                if split and elsewhere is not None and owned is not None and not owned[ref.peer]:
                    node.ports.append(elsewhere)  # run by the peer's process
                    continue
                last_hop = not is_host and ref.peer < hosts and last_hop_apart
                # trims still marked last-hop with mark_last: the port is built with its thresholds, as a
                # port that is not a last hop (which ignores none), so it shares them with its kind
                marked = mark_last is not None and last_hop
                peer = self.nodes[ref.peer]
                size = UNLIMITED if is_host or cfg.pfc else buffer  # lossless (PFC): see enable_pfc
                marks = mark_last if marked else None if is_host else ecn
                trims = cfg.trimming and not is_host
                apart = last_hop and not marked
                # a direct call of each class (compiled, a class chosen at run time is called through the
                # interpreter's generic call: a tenth of building a large fabric)
                port: Port
                if ordered:
                    port = OrderedPort(
                        self.sim, peer, ref.bps, ref.latency_ns, buffer=size, ecn=marks, trimming=trims,
                        last_hop=apart, rng=rng, shared=colds,
                    )  # fmt: skip
                    port.place(n + 1, (cfg.seed << 40) | (n << 12) | ref.port)
                else:
                    port = Port(
                        self.sim, peer, ref.bps, ref.latency_ns, buffer=size, ecn=marks, trimming=trims,
                        last_hop=apart, rng=rng, shared=colds,
                    )  # fmt: skip
                port.last_hop = last_hop
                node.ports.append(port)
                if cfg.pfc:
                    xoff = max(int(buffer * cfg.pfc_xoff), cfg.mtu + HEADER_BYTES)
                    resumed = self.hosts[n].resumed if is_host else None
                    node.ports[-1].enable_pfc(xoff, min(int(buffer * cfg.pfc_xon), xoff - 1), resumed)
        return elsewhere

    # -- hosts -----------------------------------------------------------------------------------------------
    def host(self, host: object) -> MrcHost:  # object: a wrong type gets the ValueError, compiled too
        """Host ``host``'s NIC, QPs, CQs and memory, for an application to drive (MRC hosts only)."""
        h = None
        if isinstance(host, int) and not isinstance(host, bool) and 0 <= host < len(self.hosts):
            h = self.hosts[host]
        if not isinstance(h, MrcHost):
            raise ValueError(f"host {host}: not an MRC host of this fabric (0..{self.topo.num_hosts - 1})")
        return h

    def verbs_device(self, host: int) -> SimHostDevice:
        """Host ``host`` as a device for `openmrc.verbs` (register it with ``verbs.add_device``)."""
        return SimHostDevice(self.host(host), self.topo.num_hosts)

    # -- flows -----------------------------------------------------------------------------------------------
    def transient_connections(self) -> None:
        """From now on the transport connections that carry flows live only while they carry one: a host
        pair's MRC QP pair (one pair for both directions, as an RC QP is) and its EV profiles are made when
        a flow between them is added and destroyed once no flow on them is unfinished; a RoCEv2 flow's QPs
        are dropped when it is done. A job of millions of flows (`openmrc.sim.workloads.
        hierarchical_allreduce`) then holds only the connections in use; a finished flow keeps its figures
        but lets go of its QP and triggers. Call before adding flows."""
        if self.flows:
            raise ValueError("transient_connections: call it before adding flows")
        if self.part is not None:
            raise ValueError("transient connections: 1 rank only")
        self._transient = True
        for h in self.hosts:
            h.transient = True

    def add_flow(
        self,
        src: int,
        dst: int,
        size: int,
        start: int | None = None,
        *,
        tag: str = "",
        imm: bool = False,
        trigger: Trigger | None = None,
        send_done: Trigger | None = None,
        recv_done: Trigger | None = None,
    ) -> Flow:
        """A message of ``size`` bytes from host ``src`` to host ``dst``, starting at ``start`` ns (default 0)
        or, with ``trigger``, when that trigger fires. ``imm`` (Write-with-Immediate) lets the receiver see it
        complete; a ``recv_done`` trigger implies it."""
        hosts = self.topo.num_hosts
        if not (0 <= src < hosts and 0 <= dst < hosts):
            raise ValueError(f"flow {src}->{dst}: hosts are 0..{hosts - 1}")
        if src == dst:
            raise ValueError("a flow needs two different hosts")
        if size < 1:
            raise ValueError(f"flow {src}->{dst}: size {size} must be at least one byte")
        if trigger is not None and start is not None:
            raise ValueError(f"flow {src}->{dst}: give a start time or a trigger, not both")
        if trigger is None and start is None:
            start = 0
        f = Flow(
            src,
            dst,
            size,
            start,
            id=len(self.flows),
            tag=tag,
            imm=imm or recv_done is not None,
            trigger=trigger,
            send_done=send_done,
            recv_done=recv_done,
        )
        self.flows.append(f)
        part = self.part
        owned = None if part is None or not part.built else part.owned  # (a whole fabric adds it all)
        if owned is None or owned[src]:
            self.hosts[src].add_flow(f, self.hosts[dst])
        elif owned[dst]:  # the sender is another process's: only the receiving end here
            receiver, sender = self.hosts[dst], self.hosts[src]
            assert isinstance(receiver, MrcHost) and isinstance(sender, RemoteHost)  # built in parts: MRC
            receiver.accept_flow(f, sender)
        if trigger is not None:
            trigger.flows.append(f)
        else:
            assert start is not None
            self.sim.schedule(start, self._start, f)
        return f

    def fire(self, trigger: Trigger) -> None:
        """One arrival at ``trigger``; at its count its flows start now."""
        trigger.arrivals += 1
        if trigger.multishot:
            if trigger.arrivals <= len(trigger.flows):
                self._start_now(trigger.flows[trigger.arrivals - 1])
        elif trigger.arrivals == trigger.count:
            make = trigger.make
            if make is not None:
                trigger.make = None
                make(trigger)
            for f in trigger.flows:
                self._start_now(f)

    def _start_now(self, f: Flow) -> None:
        f.start = self.sim.now
        self._start(f)

    def _start(self, f: Flow) -> None:
        if f.imm:
            self._recv_wait += 1
        part = self.part
        if part is None or part.owned[f.src]:
            self.hosts[f.src].start(f, self.hosts[f.dst], self.sim.now)
        elif part.owned[f.dst] and f.imm:  # the sender runs elsewhere: only post the receive here
            self.hosts[f.dst].expect(f, self.hosts[f.src])

    def _finished(self, f: Flow, now: int, status: WcStatus) -> None:
        if f.finish is not None:
            return
        f.finish = now
        f.status = status
        self.completed += 1
        if f.send_done is not None:
            self.fire(f.send_done)
        if self._transient and (not f.imm or f.recv_finish is not None):
            self._retire(f)
        if self.done():
            self.sim.halted = True

    def _retire(self, f: Flow) -> None:
        """Flow ``f`` is done at both ends (transient connections): free its connection if no other flow
        needs it, and let go of its triggers (a finished flow keeps only its figures)."""
        self.hosts[f.src].release(f, self.hosts[f.dst])
        f.trigger = f.send_done = f.recv_done = None

    def _received(self, f: Flow, now: int) -> None:
        if f.recv_finish is not None:
            return
        f.recv_finish = now
        self._recv_wait -= 1
        if f.recv_done is not None:
            self.fire(f.recv_done)
        if self._transient and f.finish is not None:
            self._retire(f)
        if self.done():
            self.sim.halted = True

    # -- running ---------------------------------------------------------------------------------------------
    def sample_every(self, interval_ns: int) -> Sampler:
        """Record job goodput and EV states every ``interval_ns`` (call before `run`, after the flows and
        failures: the connections a failure can touch are watched one by one, to time their recovery)."""
        self._watch_pairs()
        pairs = self._pair_bytes if self._watched else None
        self.sampler = Sampler(
            self.sim, interval_ns, self.delivered_bytes, self._nics, self._watched_bytes, pairs
        )
        return self.sampler

    def _watch_pairs(self) -> None:
        """The transport connections a failure touches, each watched for its recovery: of each (src, dst)
        pair with a path through the failed element, the connections whose packets go through it (MRC
        sprays one QP pair over every path, so its one; RoCEv2 has QPs per flow, each on one ECMP-hashed
        path: those hashed through it, either way)."""
        by_pair: dict[tuple[int, int], list[Flow]] = {}
        for f in self.flows:
            by_pair.setdefault((f.src, f.dst), []).append(f)
        conns = sorted(by_pair)
        watched: dict[object, int] = {}  # the connection (its id; built in parts: its hosts) -> its index
        self._watched, self._outage_pairs, self._outage_scope = [], [], []
        partial = self.part is not None and self.part.built
        owned = None if self.part is None else self.part.owned
        ecmp = self.routing if isinstance(self.routing, EcmpRouting) else None
        for _at, _what, refs, _host in self.faults.outages:
            got = []
            dead = set(refs)
            crossing = sorted(crossing_pairs(self.topo, dead, conns))
            considered = 0
            for s, d in crossing:
                host, flows = self.hosts[s], by_pair[(s, d)]
                if not partial or owned is None or owned[s] or not owned[d]:
                    carriers = host.carriers(d, flows)
                else:  # the receiving end is this process's: it counts what the connection carries
                    receiver = self.hosts[d]
                    assert isinstance(receiver, MrcHost)  # built in parts: MRC hosts
                    host, carriers = receiver, receiver.carriers_from(s)
                for c in carriers:
                    considered += 1
                    routes = host.carrier_routes(c)
                    if routes is not None and ecmp is not None and not ecmp.crosses(routes, dead):
                        continue  # its one path each way misses the failed element
                    key: object = (s, d) if partial else id(c)  # one connection per pair (MRC)
                    if key not in watched:
                        watched[key] = len(self._watched)
                        self._watched.append((host, c, flows))
                    got.append(watched[key])
            self._outage_pairs.append(tuple(got))
            self._outage_scope.append((len(crossing), considered))

    def _pair_bytes(self) -> tuple[int, ...]:
        return tuple(host.carried_bytes(c) for host, c, _flows in self._watched)

    def _pairs_done(self) -> list[bool]:
        """Whether each watched connection has delivered everything it was given."""
        return [host.carrier_done(c, flows) for host, c, flows in self._watched]

    def _nics(self) -> list[tuple[int, Nic]]:
        return [(h.id, h.nic) for h in self.hosts if isinstance(h, MrcHost)]

    def delivered_bytes(self, src: int | None = None) -> int:
        """Bytes the receivers have accepted so far, each once (only from host ``src`` if given)."""
        hosts = self.hosts
        got = sum(h.delivered_bytes() for h in hosts) if src is None else hosts[src].delivered_bytes()
        if self.part is not None and self.part.built:  # and what its hosts accepted from another process's
            got += sum(h.received_from(src) for h in hosts if isinstance(h, MrcHost))
        return got

    def _watched_bytes(self) -> int:
        watched = self.faults.watched
        return 0 if watched is None else self.delivered_bytes(watched)

    def done(self) -> bool:
        if self.jobs and any(j.running for j in self.jobs):
            return False
        return self.completed >= len(self.flows) and self._recv_wait <= 0

    def run(self, until: int | None = None) -> SimResults:
        if not self.done():
            self.sim.run(until=until)
        if self.sampler is not None:
            self.sampler.sample()
        with PausedGc():  # a large fabric's results are many objects too (a link's figures per port)
            return self.results()

    def results(self) -> SimResults:
        """What the run so far produced (`run` returns it after running)."""
        return SimResults(
            self.flows,
            self.sim.now,
            self.sim.events,
            self.counters(),
            samples=[] if self.sampler is None else self.sampler.samples,
            links=self.link_stats(),
            ev_log=[] if self.sampler is None else self.sampler.ev_log,
            failures=sorted(self.faults.failures),
            outages=[self._outage(i, *o) for i, o in enumerate(self.faults.outages)],
            pair_done=self._pairs_done(),
            pair_bytes=[] if self.sampler is None else self.sampler.pair_bytes,
        )

    def _outage(self, i: int, at: int, what: str, refs: list[tuple[int, int]], host: int | None) -> Outage:
        totals = None if self.part is None else self.part.totals
        if totals is None:
            ats = [self.nodes[n].ports[p].down_drop_at for n, p in refs]
        else:
            ats = [totals.down_drop_at.get(r) for r in refs]
        drops = [t for t in ats if t is not None and t >= at]
        pairs = self._outage_pairs[i] if i < len(self._outage_pairs) else ()
        host_pairs, connections = self._outage_scope[i] if i < len(self._outage_scope) else (0, 0)
        last = max(drops) - at if drops else None
        return Outage(at, what, last, host, pairs, host_pairs=host_pairs, connections=connections)

    def link_stats(self) -> list[LinkStat]:
        totals = None if self.part is None else self.part.totals
        if totals is not None:
            return totals.links
        now = self.sim.now
        link = self.link_stat
        return [
            link(now, n, i, p.peer.id, p.nominal_bps, p.sent_bytes, p.drops, p.losses, p.trims, p.marks,
                 p.pauses, p.paused_total_ns(now))
            for n, node in enumerate(self.nodes)
            for i, p in enumerate(node.ports)
            if not isinstance(p.peer, Unwired)
        ]  # fmt: skip

    @staticmethod
    def link_stat(
        now: int, n: int, i: int, peer: int, bps: int, sent_bytes: int, drops: int, losses: int, trims: int,
        marks: int, pauses: int, paused_ns: int,
    ) -> LinkStat:  # fmt: skip
        """The figures of port ``i`` of node ``n`` at ``now``, from its counters."""
        util = sent_bytes * 8e9 / (bps * max(now, 1))
        return LinkStat(
            n, i, peer, bps, sent_bytes, util, drops, losses, trims, marks, pauses, paused_ns / 1000
        )

    def counters(self) -> dict[str, int]:
        totals = None if self.part is None else self.part.totals
        if totals is not None:
            t = totals.counts
            drops, trims, marks, hops, losses = (
                t["drops"], t["trims"], t["ecn_marks"], t["packet_hops"], t["losses"]
            )  # fmt: skip
        else:
            drops = trims = marks = hops = losses = 0
            for node in self.nodes:
                for p in node.ports:
                    drops += p.drops
                    trims += p.trims
                    marks += p.marks
                    hops += p.sent_packets
                    losses += p.losses
        rtx = sum(h.retransmits() for h in self.hosts) if totals is None else totals.counts["retransmits"]
        out = {"drops": drops, "trims": trims, "ecn_marks": marks, "retransmits": rtx, "packet_hops": hops}
        if losses:
            out["losses"] = losses
        cnps = sum(h.cnps() for h in self.hosts)
        if cnps:
            out["cnps"] = cnps
        if self.faults.reconvergences:
            out["reconvergences"] = self.faults.reconvergences
        if self.config.pfc:
            ports = [p for node in self.nodes for p in node.ports]
            out["pfc_pauses"] = sum(p.pauses for p in ports)
            out["pfc_paused_ns"] = sum(p.paused_total_ns(self.sim.now) for p in ports)
            out["max_queue_bytes"] = max((p.pfc.max_queued for p in ports if p.pfc is not None), default=0)
        return out
