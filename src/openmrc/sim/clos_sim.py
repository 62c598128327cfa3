"""A multi-plane Clos fabric simulation running the real MRC transport on every host.

`ClosSim` instantiates a `openmrc.fabric.MultiPlaneClos`, its SRv6 uSID plan (`UsidPlan`) and one
`openmrc.transport.Nic` per host (one port per plane), wires every link as two `Port`s, and runs flows:
each flow is a QP pair whose requester sprays an RDMA Write over explicit SRv6 EVs (paths drawn equally
from every plane) and whose responder answers along its own EVs. Results are per-flow completion times
(the requester's signaled completion) and the fabric's counters.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.fattree import FoldedClos
from openmrc.fabric.srv6 import UsidPlan
from openmrc.fabric.topology import Topology
from openmrc.sim.engine import Simulator
from openmrc.sim.network import HEADER_BYTES, Host, Node, Port, Switch
from openmrc.sim.roce import DcqcnConfig, RoceConfig, RoceHost, RoceQp, new_qpn
from openmrc.sim.routing import EcmpRouting, Routing, SrRouting
from openmrc.transport import (
    Access,
    MemoryRegion,
    Nic,
    NicConfig,
    Qp,
    QpInitAttr,
    QpState,
    SendWR,
    Sge,
    WcStatus,
    WrOpcode,
)

__all__ = ["ClosSim", "ClosSimConfig", "FabricSim", "Flow", "SimResults", "fat_tree_sim"]


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
    roce_window: int = 64
    """RoCE only: packets in flight per QP."""
    dcqcn: bool = False
    """RoCE only: DCQCN congestion control (CNPs, per-QP rate pacing) with `DcqcnConfig`'s defaults."""


@dataclass(slots=True)
class Flow:
    """One RDMA Write from ``src`` to ``dst`` of ``size`` bytes starting at ``start`` ns."""

    src: int
    dst: int
    size: int
    start: int
    qp: Qp | None = None
    finish: int | None = None
    status: WcStatus | None = None

    @property
    def fct_ns(self) -> int | None:
        return None if self.finish is None else self.finish - self.start


@dataclass(slots=True)
class SimResults:
    flows: list[Flow]
    now: int
    events: int
    counters: dict[str, int] = field(default_factory=dict)

    def fcts_us(self) -> list[float]:
        return sorted(f.fct_ns / 1000 for f in self.flows if f.fct_ns is not None)

    def summary(self) -> dict[str, Any]:
        fcts = self.fcts_us()
        done = len(fcts)
        out: dict[str, Any] = {
            "flows": len(self.flows),
            "completed": done,
            "sim_time_us": self.now / 1000,
            "events": self.events,
            **self.counters,
        }
        if fcts:
            out |= {
                "median_fct_us": statistics.median(fcts),
                "p99_fct_us": fcts[min(done - 1, int(0.99 * done))],
                "max_fct_us": fcts[-1],
            }
        return out


class FabricSim:
    """Build once, add flows, run. Works on any topology with ECMP routing; SRv6 needs a MultiPlaneClos."""

    def __init__(self, topo: Topology, config: ClosSimConfig, *, longest_path_links: int) -> None:
        cfg = self.config = config
        if cfg.routing not in ("srv6", "ecmp"):
            raise ValueError(f"ClosSimConfig.routing: {cfg.routing!r} is not 'srv6' or 'ecmp'")
        if cfg.transport not in ("mrc", "roce"):
            raise ValueError(f"ClosSimConfig.transport: {cfg.transport!r} is not 'mrc' or 'roce'")
        if cfg.transport == "roce" and cfg.routing != "ecmp":
            raise ValueError("ClosSimConfig.routing: RoCEv2 needs 'ecmp' (it has no SRv6 EVs)")
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
            link_bps=link_bps * planes,
            base_rtt_ns=self.base_rtt_ns,
            trimming=cfg.trimming,
            default_ev_count=max(cfg.evs_per_qp, planes),
        )
        self.nodes: list[Node] = []
        for n in range(topo.num_nodes()):
            if n < topo.num_hosts and self.roce is not None:
                rh = RoceHost(self.sim, n, self.roce)
                rh.on_done = self._roce_done
                self.nodes.append(rh)
            elif n < topo.num_hosts:
                nic = Nic(planes, rng=random.Random(self.rng.getrandbits(64)), config=nic_cfg)
                self.nodes.append(Host(self.sim, n, nic))
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
        self.flows: list[Flow] = []
        self._by_host: dict[int, list[Flow]] = {}
        self._buf = bytearray(1 << 20)
        self._profiles: set[tuple[int, int]] = set()
        self._mrs: dict[int, MemoryRegion] = {}  # host -> its region over the shared buffer
        self._roce_pending: dict[int, int] = {}  # id(flow) -> RoCE QPs of the flow not yet done
        self.completed = 0

    # -- flows ---------------------------------------------------------------------------------------------
    def _host(self, h: int) -> Host:
        node = self.nodes[h]
        assert isinstance(node, Host)
        return node

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
        qp = nic.create_qp(QpInitAttr(send_cq=nic.create_cq(), recv_cq=nic.create_cq()))
        qp.modify(QpState.INIT, ev_profile_id=self._profile(host, peer), cc_profile_id=0)
        return qp

    def add_flow(self, src: int, dst: int, size: int, start: int = 0) -> Flow:
        """An RDMA Write of ``size`` bytes from host ``src`` to host ``dst`` at time ``start``."""
        if src == dst:
            raise ValueError("a flow needs two different hosts")
        if self.roce is not None:
            return self._add_roce_flow(src, dst, size, start)
        if len(self._buf) < size:
            self._buf = bytearray(size)
        a, b = self._qp(src, dst), self._qp(dst, src)
        timeout = max(0, (4 * self.base_rtt_ns // 1024).bit_length())
        for qp, peer, host in ((a, b, dst), (b, a, src)):
            qp.modify(QpState.RTR, dest_qp_num=peer.qp_num, peer=host, rq_psn=0, mpr_dest=64, max_wimm_dest=0)
            qp.modify(
                QpState.RTS, sq_psn=0, mpr=64, max_wimm=0, timeout=timeout, retry_linear=7, retry_exp=25
            )
        f = Flow(src, dst, size, start, a)
        self.flows.append(f)
        self._by_host.setdefault(src, []).append(f)
        self.sim.schedule(start, self._start, f)
        return f

    def _add_roce_flow(self, src: int, dst: int, size: int, start: int) -> Flow:
        assert self.roce is not None
        f = Flow(src, dst, size, start)
        k = self.config.roce_qps
        parts = [size // k + (1 if i < size % k else 0) for i in range(k)]
        qps = []
        for part in parts:
            q = RoceQp(
                new_qpn(self.rng, self._qpns),
                src,
                dst,
                max(part, 1),
                self.roce.mtu,
                self.rng.randrange(49152, 65536),
            )
            qps.append(q)
            self._roce_flows[q.qpn] = f
        self.flows.append(f)
        self.sim.schedule(start, self._start_roce, (f, qps))
        return f

    def _start_roce(self, arg: tuple[Flow, list[RoceQp]]) -> None:
        f, qps = arg
        sender, receiver = self.nodes[f.src], self.nodes[f.dst]
        assert isinstance(sender, RoceHost) and isinstance(receiver, RoceHost)
        for q in qps:
            sender.add_sender(q)
            receiver.rcv[q.qpn] = q
        self._roce_pending[id(f)] = len(qps)
        sender.pump(self.sim.now)

    def _roce_done(self, q: RoceQp) -> None:
        f = self._roce_flows[q.qpn]
        left = self._roce_pending[id(f)] - 1
        self._roce_pending[id(f)] = left
        if left == 0:
            f.finish = self.sim.now
            f.status = WcStatus.SUCCESS
            self.completed += 1

    def _mr(self, host: Host) -> MemoryRegion:
        mr = self._mrs.get(host.id)
        if mr is None or mr.length < len(self._buf):
            mr = self._mrs[host.id] = host.nic.register(self._buf, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        return mr

    def _start(self, f: Flow) -> None:
        src, dst = self._host(f.src), self._host(f.dst)
        smr, dmr = self._mr(src), self._mr(dst)
        assert f.qp is not None
        f.qp.post_send(
            SendWR(
                len(self.flows), WrOpcode.RDMA_WRITE, [Sge(smr.addr, f.size, smr.lkey)], dmr.addr, dmr.rkey
            ),
            self.sim.now,
        )
        src.on_pump = self._check_done
        src.pump(self.sim.now)

    def _check_done(self, host: Host) -> None:
        for f in self._by_host.get(host.id, ()):
            if f.finish is None and f.qp is not None and len(f.qp.send_cq):
                wc = f.qp.send_cq.poll(1)[0]
                f.finish = self.sim.now
                f.status = wc.status
                self.completed += 1

    # -- failures ------------------------------------------------------------------------------------------
    def fail_port(self, port: Port, at: int, up_at: int | None = None) -> None:
        """Take one direction of a link down at ``at`` (packets sent on it are lost), up at ``up_at``."""
        self.sim.schedule(at, self._set_port, (port, False))
        if up_at is not None:
            self.sim.schedule(up_at, self._set_port, (port, True))

    @staticmethod
    def _set_port(arg: tuple[Port, bool]) -> None:
        arg[0].up = arg[1]

    def fail_nic_port(self, host: int, port: int, at: int, up_at: int | None = None) -> None:
        """NIC port ``port`` (1-based plane) of ``host`` dies at ``at``: both link directions go down and the
        host's transport is told (it stops using that plane's EVs)."""
        h = self._host(host)
        if not 1 <= port <= len(h.ports):
            raise ValueError(f"host {host} has no port {port}")
        ref = self.topo.ports(host)[port - 1]
        down = self.nodes[ref.peer].ports[ref.peer_port]
        for p in (h.ports[port - 1], down):
            self.fail_port(p, at, up_at)
        self.sim.schedule(at, self._nic_port, (h, port, False))
        if up_at is not None:
            self.sim.schedule(up_at, self._nic_port, (h, port, True))

    def _nic_port(self, arg: tuple[Host, int, bool]) -> None:
        h, port, up = arg
        now = self.sim.now
        if up:
            h.nic.port_up(port, now)
        else:
            h.nic.port_down(port, now)
        h.pump(now)

    # -- running -------------------------------------------------------------------------------------------
    def run(self, until: int | None = None) -> SimResults:
        total = len(self.flows)
        self.sim.run(until=until, stop=lambda: self.completed >= total)
        return SimResults(self.flows, self.sim.now, self.sim.events, self.counters())

    def counters(self) -> dict[str, int]:
        drops = trims = marks = hops = 0
        for node in self.nodes:
            for p in node.ports:
                drops += p.drops
                trims += p.trims
                marks += p.marks
                hops += p.sent_packets
        rtx = sum(n.nic.stats.retransmits for n in self.nodes if isinstance(n, Host))
        rtx += sum(n.resent for n in self.nodes if isinstance(n, RoceHost))
        return {"drops": drops, "trims": trims, "ecn_marks": marks, "retransmits": rtx, "packet_hops": hops}


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
