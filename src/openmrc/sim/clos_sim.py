"""A multi-plane Clos fabric simulation running the real MRC transport on every host.

`ClosSim` instantiates a `openmrc.fabric.MultiPlaneClos`, its SRv6 uSID plan (`UsidPlan`) and one
`openmrc.transport.Nic` per host (one port per plane), wires every link as two `Port`s, and runs flows:
each flow is a QP pair whose requester sprays an RDMA Write over explicit SRv6 EVs (paths drawn equally
from every plane) and whose responder answers along its own EVs. Results are per-flow completion times
(the requester's signaled completion) and the fabric's counters.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.fattree import FoldedClos
from openmrc.fabric.srv6 import UsidPlan
from openmrc.fabric.topology import Topology
from openmrc.sim.engine import Simulator
from openmrc.sim.failures import Failures
from openmrc.sim.metrics import LinkStat, Outage, Sampler, SimResults
from openmrc.sim.network import HEADER_BYTES, Host, Node, Port, Switch
from openmrc.sim.roce import DcqcnConfig, RoceConfig, RoceHost, RoceQp, new_qpn
from openmrc.sim.routing import EcmpRouting, Routing, SrRouting, crossing_pairs
from openmrc.sim.verbs_host import SimHostDevice
from openmrc.transport import (
    Access,
    CompletionQueue,
    MemoryRegion,
    Nic,
    NicConfig,
    Qp,
    QpInitAttr,
    QpState,
    RecvWR,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)

__all__ = ["ClosSim", "ClosSimConfig", "FabricSim", "Flow", "SimResults", "Trigger", "fat_tree_sim"]


class _SimCq(CompletionQueue):
    """A completion queue that tells the simulation it has something (no polling every CQ per event)."""

    def __init__(self, ready: list[CompletionQueue]) -> None:
        super().__init__()
        self._notify = ready

    def push(self, wc: WorkCompletion) -> None:
        super().push(wc)
        self._notify.append(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClosSimConfig:
    """One simulated fabric. Sizes in bytes, times in ns, rates in bit/s."""

    planes: int = 4
    """Independent planes = NIC ports per host."""
    hosts: int = 32
    """Hosts (GPUs)."""
    t0_radix: int = 16
    """Ports of a T0 switch (half to hosts, half up)."""
    t1_radix: int = 16
    """Ports of a T1 switch."""
    link_bps: int = 100_000_000_000
    """Every link's rate."""
    latency_ns: int = 1_000
    """Every link's one-way propagation delay."""
    mtu: int = 4096
    """Transport payload per packet."""
    buffer_bytes: int | None = None
    """Data buffer per switch output port; default one bandwidth-delay product of the longest path."""
    ecn: tuple[float, float] | None = (0.2, 0.8)
    """ECN RED thresholds as fractions of the buffer (None: no marking)."""
    trimming: bool = True
    """Trim instead of dropping when a switch buffer is full."""
    evs_per_qp: int = 128
    """SRv6 paths each QP sprays over (at most planes × uplinks)."""
    seed: int = 1
    """Seeds every random choice (NIC keys and rotations, ECN marking)."""
    routing: str = "srv6"
    """"srv6": EVs are SRv6 uSID source routes; "ecmp": EVs are UDP source ports hashed by every switch."""
    transport: str = "mrc"
    """"mrc" (the openmrc transport on every host) or "roce" (the RoCEv2 baseline; ECMP, one plane)."""
    roce_qps: int = 1
    """RoCE only: QPs (UDP source ports, hence ECMP paths) per flow."""
    roce_planes: int = 1
    """RoCE only: a flow's QPs take NIC ports (planes) 0..roce_planes-1 in turn (multi-rail); 0: all."""
    roce_window: int = 64
    """RoCE only: packets in flight per QP."""
    validate_wire: bool = False
    """Encode every packet a NIC sends or receives to bytes and parse it back (`openmrc.wire`): slower, and
    proves the simulated conversation is made of valid MRC packets."""
    dcqcn: bool = False
    """RoCE only: DCQCN congestion control (CNPs, per-QP rate pacing) with `DcqcnConfig`'s defaults."""
    pfc: bool = False
    """Lossless fabric: priority flow control on every port (PAUSE instead of drop; no trimming), as RoCEv2
    deployments run. Thresholds per ingress port as fractions of the port buffer: `pfc_xoff`, `pfc_xon`."""
    pfc_xoff: float = 0.25
    """PFC: pause the upstream port when more than this fraction of a port buffer it sent waits here."""
    pfc_xon: float = 0.125
    """PFC: resume it when that falls to this fraction."""
    ecmp_reconverge_ns: int | None = 100_000
    """ECMP routing only: how long after a link changes state the switches hash around dead links (the
    routing protocol's convergence; real fabrics take 50 ms to seconds, kept short here so that short runs
    show both phases). None: never."""


class Trigger:
    """Starts flows once ``count`` events (flows finishing) have arrived: htsim's oneshot trigger is a
    count of 1, its barrier a count of n. A ``multishot`` trigger starts its next waiting flow at each
    arrival instead (htsim's multishot)."""

    __slots__ = ("arrivals", "count", "flows", "multishot", "name")

    def __init__(self, count: int = 1, name: str = "", *, multishot: bool = False) -> None:
        if count < 1:
            raise ValueError(f"trigger count {count} < 1")
        self.count = count
        self.arrivals = 0
        self.flows: list[Flow] = []
        self.name = name
        self.multishot = multishot


@dataclass(slots=True, eq=False)
class Flow:
    """One message of ``size`` bytes from host ``src`` to host ``dst``: an RDMA Write (with immediate when
    the receiver must see it complete) on the QP pair the two hosts share. It starts at ``start`` ns, or
    when ``trigger`` fires; finishing may fire ``send_done`` (the sender's completion) and ``recv_done``
    (the receiver's)."""

    src: int
    dst: int
    size: int
    start: int | None
    id: int = 0
    tag: str = ""
    imm: bool = False
    trigger: Trigger | None = None
    send_done: Trigger | None = None
    recv_done: Trigger | None = None
    qp: Qp | None = None
    finish: int | None = None
    recv_finish: int | None = None
    status: WcStatus | None = None

    @property
    def fct_ns(self) -> int | None:
        return None if self.finish is None or self.start is None else self.finish - self.start

    @property
    def goodput_bps(self) -> float | None:
        fct = self.fct_ns
        return None if not fct else self.size * 8e9 / fct


class FabricSim(Failures):
    """Build once, add flows, run. Works on any topology with ECMP routing; SRv6 needs a MultiPlaneClos."""

    def __init__(self, topo: Topology, config: ClosSimConfig, *, longest_path_links: int) -> None:
        cfg = self.config = config
        if cfg.routing not in ("srv6", "ecmp"):
            raise ValueError(f"ClosSimConfig.routing: {cfg.routing!r} is not 'srv6' or 'ecmp'")
        if cfg.transport not in ("mrc", "roce"):
            raise ValueError(f"ClosSimConfig.transport: {cfg.transport!r} is not 'mrc' or 'roce'")
        if cfg.transport == "roce" and cfg.routing != "ecmp":
            raise ValueError("ClosSimConfig.routing: RoCEv2 needs 'ecmp' (it has no SRv6 EVs)")
        if not 0 <= cfg.roce_planes <= len(topo.ports(0)):
            raise ValueError(f"ClosSimConfig.roce_planes: {cfg.roce_planes} outside 0..{len(topo.ports(0))}")
        if cfg.pfc and not 0 <= cfg.pfc_xon < cfg.pfc_xoff <= 1:
            raise ValueError(
                f"ClosSimConfig.pfc_xon / pfc_xoff: need 0 <= pfc_xon ({cfg.pfc_xon}) "
                f"< pfc_xoff ({cfg.pfc_xoff}) <= 1"
            )
        dcqcn = DcqcnConfig() if cfg.dcqcn else None
        self.roce = (
            RoceConfig(mtu=cfg.mtu, window=cfg.roce_window, dcqcn=dcqcn) if cfg.transport == "roce" else None
        )
        self._qpns: set[int] = set()
        self._roce_flows: dict[int, Flow] = {}
        self.sim = Simulator()
        self.rng = random.Random(cfg.seed)
        self.topo = topo
        self.plan: UsidPlan | None = None
        routing: Routing
        if cfg.routing == "srv6":
            if not isinstance(topo, MultiPlaneClos):
                raise ValueError("ClosSimConfig.routing: srv6 needs a MultiPlaneClos fabric")
            self.plan = UsidPlan(topo)
            routing = SrRouting(self.plan)
        else:
            routing = EcmpRouting(topo, cfg.seed)
        self.routing = routing
        link_bps = max(r.bps for r in topo.ports(0))
        pkt_ns = (cfg.mtu + HEADER_BYTES) * 8_000_000_000 // link_bps
        lat = max(r.latency_ns for r in topo.ports(0))
        hops = longest_path_links
        self.base_rtt_ns = 2 * hops * lat + hops * pkt_ns + hops * HEADER_BYTES * 8_000_000_000 // link_bps
        bdp = link_bps * self.base_rtt_ns // 8_000_000_000
        buffer = cfg.buffer_bytes if cfg.buffer_bytes is not None else max(bdp, 2 * (cfg.mtu + HEADER_BYTES))
        ecn = None if cfg.ecn is None else (int(buffer * cfg.ecn[0]), int(buffer * cfg.ecn[1]))
        planes = len(topo.ports(0))
        nic_cfg = NicConfig(
            mtu=cfg.mtu,
            link_bps=link_bps,
            base_rtt_ns=self.base_rtt_ns,
            trimming=cfg.trimming,
            default_ev_count=max(cfg.evs_per_qp, planes),
            validate_wire=cfg.validate_wire,
        )
        self.nodes: list[Node] = []
        for n in range(topo.num_nodes()):
            if n < topo.num_hosts and self.roce is not None:
                rh = RoceHost(self.sim, n, self.roce)
                rh.on_done = self._roce_done
                rh.on_received = self._roce_received
                self.nodes.append(rh)
            elif n < topo.num_hosts:
                nic = Nic(planes, rng=random.Random(self.rng.getrandbits(64)), config=nic_cfg)
                host = Host(self.sim, n, nic)
                host.on_pump = self._after_pump
                self.nodes.append(host)
            else:
                self.nodes.append(Switch(self.sim, n, routing))
        port_rng = random.Random(self.rng.getrandbits(64))
        for n, node in enumerate(self.nodes):
            is_host = n < topo.num_hosts
            for ref in topo.ports(n):
                to_host = ref.peer < topo.num_hosts
                node.ports.append(
                    Port(
                        self.sim,
                        self.nodes[ref.peer],
                        ref.bps,
                        ref.latency_ns,
                        buffer=1 << 62 if is_host else buffer,
                        ecn=None if is_host else ecn,
                        trimming=cfg.trimming and not is_host,
                        last_hop=not is_host and to_host and self.roce is None,  # RoCE marks the last hop too
                        rng=port_rng,
                    )
                )
                if cfg.pfc:
                    xoff = max(int(buffer * cfg.pfc_xoff), cfg.mtu + HEADER_BYTES)
                    resumed = node.resumed if isinstance(node, (Host, RoceHost)) else None
                    node.ports[-1].enable_pfc(xoff, min(int(buffer * cfg.pfc_xon), xoff - 1), resumed)
        self.flows: list[Flow] = []
        self._conns: dict[tuple[int, int], tuple[Qp, Qp]] = {}
        self._ready: list[CompletionQueue] = []  # CQs that got completions since the last drain
        self._cqs: dict[int, tuple[CompletionQueue, CompletionQueue]] = {}
        self._buf = bytearray(1 << 20)
        self._profiles: set[tuple[int, int]] = set()
        self._mrs: dict[int, MemoryRegion] = {}  # host -> its region over the shared buffer
        self._roce_qps: dict[int, list[RoceQp]] = {}  # flow id -> its RoCE QPs
        self._roce_pending: dict[int, list[int]] = {}  # flow id -> [QPs not yet acked, not yet received]
        self._recv_wait = 0  # started messages whose receiver has not yet seen them complete
        self.completed = 0
        self.failures: list[tuple[int, str]] = []
        self._outages: list[tuple[int, str, list[Port], int | None]] = []
        self.watched: int | None = None  # a host whose outgoing goodput the sampler records
        self.sampler: Sampler | None = None
        self._watched_qps: list[Qp] = []  # QPs watched for the outages' recovery (MRC: responders)
        self._watched_roce: list[RoceQp] = []
        self._outage_pairs: list[tuple[int, ...]] = []  # per outage: indices into the watched QPs
        self.reconvergences = 0

    # -- flows ---------------------------------------------------------------------------------------------
    def _host(self, h: int) -> Host:
        node = self.nodes[h]
        assert isinstance(node, Host)
        return node

    def verbs_device(self, host: int) -> SimHostDevice:
        """Host ``host`` as a device for `openmrc.verbs` (register it with ``verbs.add_device``)."""
        if not 0 <= host < self.topo.num_hosts or not isinstance(self.nodes[host], Host):
            raise ValueError(f"host {host}: not an MRC host of this fabric (0..{self.topo.num_hosts - 1})")
        return SimHostDevice(self, self._host(host))

    def ev_profile_id(self, host: int, peer: int) -> int:
        """The EV profile QPs of ``host`` towards ``peer`` bind (installed on first use)."""
        return self._profile(host, peer)

    def _profile(self, host: int, peer: int) -> int:
        if self.plan is None:
            return 0  # ECMP: the NIC's default profile of UDP source-port EVs
        if (host, peer) not in self._profiles:
            total = self.plan.topo.paths_between(host, peer)
            prof, ports = self.plan.ev_profile(host, peer, min(self.config.evs_per_qp, total))
            self._host(host).nic.add_ev_profile(peer + 1, prof, ports)
            self._profiles.add((host, peer))
        return peer + 1

    def _qp(self, host: int, peer: int) -> Qp:
        nic = self._host(host).nic
        cqs = self._cqs.get(host)
        if cqs is None:  # one send and one receive CQ per host: completions name their flow by wr_id
            cqs = self._cqs[host] = (_SimCq(self._ready), _SimCq(self._ready))
        qp = nic.create_qp(QpInitAttr(send_cq=cqs[0], recv_cq=cqs[1]))
        qp.modify(QpState.INIT, ev_profile_id=self._profile(host, peer), cc_profile_id=0)
        return qp

    def _conn(self, src: int, dst: int) -> tuple[Qp, Qp]:
        """The QP pair that carries every message from ``src`` to ``dst`` (made on first use)."""
        pair = self._conns.get((src, dst))
        if pair is None:
            a, b = self._qp(src, dst), self._qp(dst, src)
            timeout = max(0, (4 * self.base_rtt_ns // 1024).bit_length())
            for qp, peer, host in ((a, b, dst), (b, a, src)):
                qp.modify(
                    QpState.RTR, dest_qp_num=peer.qp_num, peer=host, rq_psn=0, mpr_dest=64, max_wimm_dest=0
                )
                qp.modify(
                    QpState.RTS, sq_psn=0, mpr=64, max_wimm=0, timeout=timeout, retry_linear=7, retry_exp=25
                )
            pair = self._conns[(src, dst)] = (a, b)
        return pair

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
        if self.roce is not None:
            self._add_roce_flow(f)
        else:
            if len(self._buf) < size:
                self._buf = bytearray(size)
            f.qp = self._conn(src, dst)[0]
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
            for f in trigger.flows:
                self._start_now(f)

    def _start_now(self, f: Flow) -> None:
        f.start = self.sim.now
        self._start(f)

    def _start(self, f: Flow) -> None:
        if self.roce is not None:
            self._start_roce(f)
            return
        src, dst = self._host(f.src), self._host(f.dst)
        smr, dmr = self._mr(src), self._mr(dst)
        a, b = self._conn(f.src, f.dst)
        now = self.sim.now
        if f.imm:
            b.post_recv(RecvWR(f.id))
            self._recv_wait += 1
        a.post_send(
            SendWR(
                f.id,
                WrOpcode.RDMA_WRITE_WITH_IMM if f.imm else WrOpcode.RDMA_WRITE,
                [Sge(smr.addr, f.size, smr.lkey)],
                dmr.addr,
                dmr.rkey,
                imm_data=f.id & 0xFFFFFFFF if f.imm else None,
            ),
            now=now,
        )
        src.pump(now)

    def _after_pump(self, _host: Host) -> None:
        if self._ready:
            self._drain()

    def _drain(self) -> None:
        """Turn the completions the transports produced into flow finishes (and fire their triggers)."""
        ready = self._ready
        now = self.sim.now
        flows = self.flows
        while ready:
            cq = ready.pop()
            for wc in cq.poll(len(cq)):
                f = flows[wc.wr_id]
                if wc.opcode is WcOpcode.RECV_RDMA_WITH_IMM:
                    self._received(f, now)
                else:
                    self._finished(f, now, wc.status)

    def _finished(self, f: Flow, now: int, status: WcStatus) -> None:
        if f.finish is not None:
            return
        f.finish = now
        f.status = status
        self.completed += 1
        if f.send_done is not None:
            self.fire(f.send_done)
        if self.done():
            self.sim.halted = True

    def _received(self, f: Flow, now: int) -> None:
        if f.recv_finish is not None:
            return
        f.recv_finish = now
        self._recv_wait -= 1
        if f.recv_done is not None:
            self.fire(f.recv_done)
        if self.done():
            self.sim.halted = True

    def _mr(self, host: Host) -> MemoryRegion:
        mr = self._mrs.get(host.id)
        if mr is None or mr.length < len(self._buf):
            mr = self._mrs[host.id] = host.nic.register(self._buf, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        return mr

    # -- the RoCEv2 baseline -----------------------------------------------------------------------------
    def _add_roce_flow(self, f: Flow) -> None:
        assert self.roce is not None
        k = self.config.roce_qps
        parts = [f.size // k + (1 if i < f.size % k else 0) for i in range(k)]
        qps = []
        for i, part in enumerate(parts):
            if part == 0:
                continue
            q = RoceQp(
                new_qpn(self.rng, self._qpns),
                f.src,
                f.dst,
                part,
                self.roce.mtu,
                self.rng.randrange(49152, 65536),
                i % (self.config.roce_planes or len(self.topo.ports(f.src))),
            )
            qps.append(q)
            self._roce_flows[q.qpn] = f
        self._roce_qps[f.id] = qps

    def _start_roce(self, f: Flow) -> None:
        qps = self._roce_qps[f.id]
        sender, receiver = self.nodes[f.src], self.nodes[f.dst]
        assert isinstance(sender, RoceHost) and isinstance(receiver, RoceHost)
        for q in qps:
            sender.add_sender(q)
            receiver.rcv[q.qpn] = q
        self._roce_pending[f.id] = [len(qps), len(qps)]
        if f.imm:
            self._recv_wait += 1
        sender.pump(self.sim.now)

    def _roce_done(self, q: RoceQp) -> None:
        f = self._roce_flows[q.qpn]
        left = self._roce_pending[f.id]
        left[0] -= 1
        if left[0] == 0:
            self._finished(f, self.sim.now, WcStatus.SUCCESS)

    def _roce_received(self, q: RoceQp) -> None:
        f = self._roce_flows[q.qpn]
        left = self._roce_pending[f.id]
        left[1] -= 1
        if left[1] == 0 and f.imm:
            self._received(f, self.sim.now)

    # -- running -------------------------------------------------------------------------------------------
    def sample_every(self, interval_ns: int) -> Sampler:
        """Record job goodput and EV states every ``interval_ns`` (call before `run`, after the flows and
        failures: the connections a failure can touch are watched one by one, to time their recovery)."""
        self._watch_pairs()
        pairs = self._pair_bytes if self._watched_qps or self._watched_roce else None
        self.sampler = Sampler(
            self.sim, interval_ns, self.delivered_bytes, self._nics, self._watched_bytes, pairs
        )
        return self.sampler

    def _watch_pairs(self) -> None:
        """The transport connections a failure can touch, each watched for its recovery: the QP of each
        (src, dst) pair with a path through the failed element (MRC sprays one QP over every plane); for
        RoCEv2, each QP of such a pair's flows."""
        index = {id(p): (n, i) for n, node in enumerate(self.nodes) for i, p in enumerate(node.ports)}
        conns = sorted({(f.src, f.dst) for f in self.flows})
        mrc: dict[Qp, int] = {}
        roce: dict[RoceQp, int] = {}
        self._outage_pairs = []
        for _at, _what, ports, _host in self._outages:
            hit = set(crossing_pairs(self.topo, {index[id(p)] for p in ports}, conns))
            if self.roce is None:
                got = [mrc.setdefault(self._conns[k][1], len(mrc)) for k in sorted(hit)]
            else:
                qps = [q for f in self.flows if (f.src, f.dst) in hit for q in self._roce_qps[f.id]]
                got = [roce.setdefault(q, len(roce)) for q in qps]
            self._outage_pairs.append(tuple(got))
        self._watched_qps, self._watched_roce = list(mrc), list(roce)

    def _pair_bytes(self) -> tuple[int, ...]:
        if self.roce is None:
            return tuple(qp.responder.rcvd_bytes for qp in self._watched_qps)
        mtu = self.roce.mtu
        return tuple(min(q.expected * mtu, q.size) for q in self._watched_roce)

    def _pairs_done(self) -> list[bool]:
        """Whether each watched connection has delivered everything it was given."""
        if self.roce is None:
            busy = {self._conns[(f.src, f.dst)][1] for f in self.flows if f.finish is None}
            return [qp not in busy for qp in self._watched_qps]
        return [q.expected >= q.npkts for q in self._watched_roce]

    def _nics(self) -> list[tuple[int, Nic]]:
        return [(n.id, n.nic) for n in self.nodes[: self.topo.num_hosts] if isinstance(n, Host)]

    def delivered_bytes(self, src: int | None = None) -> int:
        """Bytes the receivers have accepted so far, each once (only from host ``src`` if given)."""
        if self.roce is not None:
            mtu = self.roce.mtu
            return sum(
                min(q.expected * mtu, q.size)
                for qps in self._roce_qps.values()
                for q in qps
                if src is None or q.src == src
            )
        return sum(
            b.responder.rcvd_bytes for (s, _d), (_a, b) in self._conns.items() if src is None or s == src
        )

    def _watched_bytes(self) -> int:
        return 0 if self.watched is None else self.delivered_bytes(self.watched)

    def done(self) -> bool:
        return self.completed >= len(self.flows) and self._recv_wait <= 0

    def run(self, until: int | None = None) -> SimResults:
        if not self.done():
            self.sim.run(until=until)
        if self.sampler is not None:
            self.sampler.sample()
        return SimResults(
            self.flows,
            self.sim.now,
            self.sim.events,
            self.counters(),
            samples=[] if self.sampler is None else self.sampler.samples,
            links=self.link_stats(),
            ev_log=[] if self.sampler is None else self.sampler.ev_log,
            failures=sorted(self.failures),
            outages=[self._outage(i, *o) for i, o in enumerate(self._outages)],
            pair_done=self._pairs_done(),
            pair_bytes=[] if self.sampler is None else self.sampler.pair_bytes,
        )

    def _outage(self, i: int, at: int, what: str, ports: list[Port], host: int | None) -> Outage:
        drops = [p.down_drop_at for p in ports if p.down_drop_at is not None and p.down_drop_at >= at]
        pairs = self._outage_pairs[i] if i < len(self._outage_pairs) else ()
        return Outage(at, what, max(drops) - at if drops else None, host, pairs)

    def link_stats(self) -> list[LinkStat]:
        now = max(self.sim.now, 1)
        out = []
        for n, node in enumerate(self.nodes):
            for i, p in enumerate(node.ports):
                out.append(
                    LinkStat(
                        n,
                        i,
                        p.peer.id,
                        p.nominal_bps,
                        p.sent_bytes,
                        p.sent_bytes * 8e9 / (p.nominal_bps * now),
                        p.drops,
                        p.losses,
                        p.trims,
                        p.marks,
                        p.pauses,
                        p.paused_total_ns(self.sim.now) / 1000,
                    )
                )
        return out

    def counters(self) -> dict[str, int]:
        drops = trims = marks = hops = losses = 0
        for node in self.nodes:
            for p in node.ports:
                drops += p.drops
                trims += p.trims
                marks += p.marks
                hops += p.sent_packets
                losses += p.losses
        rtx = sum(n.nic.stats.retransmits for n in self.nodes if isinstance(n, Host))
        rtx += sum(n.resent for n in self.nodes if isinstance(n, RoceHost))
        out = {"drops": drops, "trims": trims, "ecn_marks": marks, "retransmits": rtx, "packet_hops": hops}
        if losses:
            out["losses"] = losses
        cnps = sum(n.cnps_sent for n in self.nodes if isinstance(n, RoceHost))
        if cnps:
            out["cnps"] = cnps
        if self.reconvergences:
            out["reconvergences"] = self.reconvergences
        if self.config.pfc:
            ports = [p for node in self.nodes for p in node.ports]
            out["pfc_pauses"] = sum(p.pauses for p in ports)
            out["pfc_paused_ns"] = sum(p.paused_total_ns(self.sim.now) for p in ports)
            out["max_queue_bytes"] = max((p.max_queued for p in ports), default=0)
        return out


class ClosSim(FabricSim):
    """A `FabricSim` on the `MultiPlaneClos` that ``config`` describes."""

    def __init__(self, config: ClosSimConfig | None = None) -> None:
        cfg = config or ClosSimConfig()
        topo = MultiPlaneClos(cfg.planes, cfg.hosts, cfg.t0_radix, cfg.t1_radix, cfg.link_bps, cfg.latency_ns)
        super().__init__(topo, cfg, longest_path_links=4)


def fat_tree_sim(topo: FoldedClos, config: ClosSimConfig | None = None) -> FabricSim:
    """A `FabricSim` on a fat tree or leaf-spine (`openmrc.fabric.FatTree`): one plane, ECMP routing,
    MRC EVs are UDP source ports that every switch hashes."""
    cfg = config or ClosSimConfig(routing="ecmp")
    if cfg.routing != "ecmp":
        raise ValueError("ClosSimConfig.routing: a fat tree routes by ECMP")
    return FabricSim(topo, cfg, longest_path_links=2 * topo.tiers)
