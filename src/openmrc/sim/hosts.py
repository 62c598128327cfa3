"""The hosts of a `openmrc.sim.fabric_sim.FabricSim`: one class per host behaviour, chosen once.

`MrcHost` runs the openmrc transport (`openmrc.transport.Nic`, one port per plane) and is also the public
face of a simulated host: an application (a collective, `openmrc.sim.verbs_host.SimHostDevice`) registers
memory, creates CQs and QPs, connects them and posts work requests on it as it would on a real NIC.
`RoceV2Host` runs the RoCEv2 baseline (`openmrc.sim.roce`): go-back-N QPs, one plane, ECMP.

Flows are carried the same way by both: `add_flow` prepares what a flow needs (the MRC QP pair of the two
hosts, made on first use; the RoCE QPs of that flow), `start` posts it, and completions reach the
simulation through the two callbacks in `HostEnv` (``finished``, ``received``). `HOST_KINDS` maps
`FabricSimConfig.transport` to the class.

A fabric built in parts (`openmrc.sim.partition`) builds the MRC hosts of its part and a `RemoteHost`
stand-in for each other host; a flow with one end here sets up only that end's QP (`MrcHost.accept_flow`
for a receiving end), drawing from its NIC's rng as in one process, and notes it in `HostEnv.cut` until
the other process tells its peer QP's number.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from openmrc.ev import EVENT_MASK_ALLOWED
from openmrc.fabric.srv6 import SRV6_EV_MODE, UsidPlan, ev_min_active
from openmrc.sim.config import FabricSimConfig
from openmrc.sim.engine import Simulator
from openmrc.sim.flows import Flow
from openmrc.sim.network import Host, Node, Remote, ZeroBuffer
from openmrc.sim.roce import DcqcnConfig, RoceConfig, RoceHost, RoceQp, new_qpn
from openmrc.transport import (
    Access,
    CompletionQueue,
    MemoryRegion,
    Nic,
    NicConfig,
    Qp,
    QpInitAttr,
    QpSecurity,
    QpState,
    RecvWR,
    SecurityDomain,
    SendWR,
    Sge,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)

__all__ = ["HOST_KINDS", "HostEnv", "MrcHost", "RemoteHost", "RoceV2Host", "SimHost"]


@dataclass(slots=True, kw_only=True)
class HostEnv:
    """What every host of one simulation shares."""

    engine: Simulator
    """The event engine (its clock is every host's clock)."""
    config: FabricSimConfig
    rng: random.Random
    """The simulation's RNG (NIC seeds, RoCE QP numbers and source ports are drawn from it in order)."""
    hosts: int
    """Hosts in the fabric (ids 0..hosts-1)."""
    planes: int
    """NIC ports per host."""
    link_bps: int
    base_rtt_ns: int
    plan: UsidPlan | None
    """The SRv6 plan (None: ECMP routing, EVs are UDP source ports)."""
    flows: list[Flow]
    """The simulation's flows, indexed by id (an MRC completion's ``wr_id``)."""
    finished: Callable[[Flow, int, WcStatus], None]
    """A flow's sender saw it complete (flow, now, status)."""
    received: Callable[[Flow, int], None]
    """A flow's receiver saw it complete (flow, now)."""
    owned: list[bool] | None = None
    """The hosts this process builds (a split run's share, `openmrc.sim.partition`; the others are
    `RemoteHost` stand-ins); None: every host."""
    cut: list[tuple[int, int, Qp]] | None = None
    """Where a partly built fabric notes, in the order it makes them, the QPs whose peer QP another process
    makes: (this host, the peer host, the QP), each connected towards QP 0 until that process tells the
    number (`set_dest_qp`)."""


class SimHost:
    """One host as the simulation drives it (one subclass per transport)."""

    node: Node
    """The host's node in the simulated network."""
    resumed: Callable[[None], None]
    """What a PFC-paused port of this host calls when it may send again."""
    transient: bool
    """Connections live only while they carry an unfinished flow (`FabricSim.transient_connections`)."""
    last_hop_apart: ClassVar[bool] = False
    """Switch ports toward this kind of host mark last-hop trims apart and set no ECN (MRC's NSCC tells
    last-hop congestion from trims); RoCEv2 hosts want the last hop ECN-marked like any other."""

    @property
    def id(self) -> int:
        return self.node.id

    def add_flow(self, f: Flow, peer: Any) -> None:  # pragma: no cover - every host kind overrides
        """Prepare flow ``f`` from this host to ``peer`` (a host of the same kind)."""
        raise NotImplementedError

    def start(self, f: Flow, peer: Any, now: int) -> None:  # pragma: no cover - every host kind overrides
        raise NotImplementedError

    def release(self, f: Flow, peer: Any) -> None:  # pragma: no cover - every host kind overrides
        """Flow ``f`` to ``peer`` is done at both ends: free what carried it if nothing else needs it (only
        with `transient`)."""
        raise NotImplementedError

    def expect(self, f: Flow, peer: Any) -> None:  # pragma: no cover - MRC hosts override
        """Flow ``f`` from ``peer`` to this host starts now, its sender in another process: post what the
        receiving end needs (`openmrc.sim.partition`)."""
        raise NotImplementedError

    def delivered_bytes(self) -> int:  # pragma: no cover - every host kind overrides
        """Bytes the receivers of this host's flows have accepted, each once."""
        raise NotImplementedError

    def retransmits(self) -> int:  # pragma: no cover - every host kind overrides
        raise NotImplementedError

    def cnps(self) -> int:
        """Congestion notification packets this host sent (RoCEv2 with DCQCN)."""
        return 0

    # the connections a failure touches are watched one by one (`FabricSim.sample_every`)
    def carriers(self, dst: int, flows: list[Flow]) -> list[Any]:  # pragma: no cover - every kind overrides
        """The transport connections that carry ``flows``, this host's flows to ``dst``."""
        raise NotImplementedError

    def carried_bytes(self, carrier: Any) -> int:  # pragma: no cover - every host kind overrides
        """Bytes the receiving end of ``carrier`` (one of `carriers`) accepted so far, each once."""
        raise NotImplementedError

    def carrier_done(
        self, carrier: Any, flows: list[Flow]
    ) -> bool:  # pragma: no cover - every kind overrides
        """``carrier`` delivered everything it was given (``flows``: the flows it carries)."""
        raise NotImplementedError

    def carrier_routes(self, carrier: Any) -> list[tuple[int, int, int, int]] | None:
        """The ways ``carrier``'s packets go when each takes one ECMP-hashed path, as (from host, NIC port, to
        host, entropy); None when it sprays them over every path (MRC)."""
        return None


def _never(_: None) -> None:  # pragma: no cover - a remote host's ports are not built here
    raise RuntimeError("a host of another process")


class RemoteHost(SimHost):
    """A host another process runs, in a partly built fabric: its place and id, and what this process's
    hosts need of it, its flows' memory (address and R_Key, told before the run)."""

    last_hop_apart = True  # a fabric is built in parts only with MRC hosts

    def __init__(self, node: Remote) -> None:
        self.node = node
        self.resumed = _never
        self.transient = False
        self.flow_mr: tuple[int, int] | None = None
        """(address, R_Key) of the buffer the host's flows write into, as its own process registered it."""

    def delivered_bytes(self) -> int:
        return 0  # counted where the receivers run

    def retransmits(self) -> int:
        return 0

    def carriers(self, dst: int, flows: list[Flow]) -> list[Any]:
        return [None]  # the receiving side runs elsewhere: it carries nothing here

    def carried_bytes(self, carrier: Any) -> int:
        return 0

    def carrier_done(self, carrier: Any, flows: list[Flow]) -> bool:
        return all(f.finish is not None for f in flows)


def set_dest_qp(qp: Qp, dest: int) -> None:
    """Point ``qp``, connected towards QP 0 (`HostEnv.cut`), at its peer's QP ``dest`` before any packet."""
    qp.attr.dest_qp_num = dest
    qp.requester.dest_qp = dest
    if qp.seal is not None:  # authenticated: the peer's QP number is in the nonce of what it opens
        qp.seal.peer_qpn = dest


class _SimCq(CompletionQueue):
    """A completion queue that tells the simulation it has something (no polling every CQ per event)."""

    def __init__(self, ready: list[CompletionQueue]) -> None:
        super().__init__()
        self._notify = ready

    def push(self, wc: WorkCompletion) -> None:
        super().push(wc)
        self._notify.append(self)


class _MrcShared:
    """What the MRC hosts of one simulation share: the CQs with new completions, the flows' buffer."""

    __slots__ = ("buf", "env", "ready", "security", "timeout", "zeros")

    def __init__(self, env: HostEnv) -> None:
        self.env = env
        mode = env.config.security
        self.security: QpSecurity | None = None
        """Every flow QP's security domain (``security`` "auth" / "encrypt"; its key from the seed)."""
        if mode != "none":
            key = random.Random(env.config.seed ^ 0x5EC).randbytes(32)
            # (header tags exactly when switches trim, not under PFC: a simulation knows its fabric)
            trims = bool(env.config.trimming) and not env.config.pfc
            self.security = QpSecurity(SecurityDomain(1, key), encrypt=mode == "encrypt", header_tag=trims)
        self.ready: list[CompletionQueue] = []  # flow CQs that got completions since the last drain
        self.buf = bytearray(1 << 20)  # every flow writes from and into this one buffer (only zeros)
        self.zeros = ZeroBuffer(self.buf)  # so their packets carry a shared zero payload
        self.timeout = max(0, (4 * env.base_rtt_ns // 1024).bit_length())

    def after_pump(self, _node: Host) -> None:
        if self.ready:
            self.drain()

    def drain(self) -> None:
        """Turn the completions the transports produced into flow finishes."""
        ready = self.ready
        env = self.env
        now = env.engine.now
        flows = env.flows
        while ready:
            cq = ready.pop()
            for wc in cq.poll(len(cq)):
                f = flows[wc.wr_id]
                if wc.opcode is WcOpcode.RECV_RDMA_WITH_IMM:
                    env.received(f, now)
                else:
                    env.finished(f, now, wc.status)


class MrcHost(SimHost):
    """A host running the MRC transport; its NIC, QPs, CQs and memory are open to applications."""

    last_hop_apart = True

    def __init__(self, node: Host, shared: _MrcShared) -> None:
        self.node = node
        self._node = node
        self.resumed = node.resumed
        self.nic: Nic = node.nic
        self._shared = shared
        self.engine = shared.env.engine
        """The simulation's event engine (its ``now`` is this host's clock)."""
        self._profiles: set[int] = set()  # peers whose SRv6 EV profile is installed
        self._qp_init: QpInitAttr | None = None  # of every flow QP: this host's two flow CQs
        self._flow_mr: MemoryRegion | None = None
        self._flow_pairs: dict[int, tuple[Qp, Qp]] = {}  # peer -> the QP pair of this host's flows to it
        self.transient = False
        self._open: dict[int, int] = {}  # transient: peer -> unfinished flows on the pair, either way
        self._released_bytes = 0  # transient: what destroyed QPs' peers had accepted from this host
        self._cut: dict[int, Qp] | None = None  # QPs whose peer QP another process runs (see `_cut_qp`)

    @classmethod
    def build_all(cls, env: HostEnv) -> list[SimHost]:
        cfg = env.config
        nic_cfg = NicConfig(
            mtu=cfg.mtu,
            link_bps=env.link_bps,
            base_rtt_ns=env.base_rtt_ns,
            trimming=cfg.trimming,
            default_ev_count=max(cfg.evs_per_qp, env.planes),
            validate_wire=cfg.validate_wire,
        )
        shared = _MrcShared(env)
        out: list[SimHost] = []
        owned = env.owned
        for n in range(env.hosts):
            seed = env.rng.getrandbits(64)  # drawn for every host, built or not: the same NIC seeds anywhere
            if owned is not None and not owned[n]:
                out.append(RemoteHost(Remote(n)))
                continue
            nic = Nic(env.planes, rng=random.Random(seed), config=nic_cfg)
            node = Host(env.engine, n, nic)
            node.on_pump = shared.after_pump
            node.zeros = shared.zeros
            out.append(cls(node, shared))
        return out

    # -- the public per-host API -----------------------------------------------------------------------------
    @property
    def qps(self) -> dict[int, Qp]:
        """Every QP of this host's NIC by QP number."""
        return self.nic.qps

    def now(self) -> int:
        return self.engine.now

    def pump(self) -> None:
        """Let the NIC send what the application's calls made ready (posting through this object does)."""
        self._node.pump(self.engine.now)

    def register(
        self, buffer: Any, access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE
    ) -> MemoryRegion:
        return self.nic.register(buffer, access)

    def create_cq(self, depth: int = 65536) -> CompletionQueue:
        return self.nic.create_cq(depth)

    def create_qp(self, init: QpInitAttr | None = None) -> Qp:
        """A QP in RESET (with a CQ of its own for sends and one for receives unless ``init`` names them)."""
        return self.nic.create_qp(init or QpInitAttr(send_cq=self.create_cq(), recv_cq=self.create_cq()))

    def ev_profile_for(self, peer: object) -> int:  # object: a wrong type gets the ValueError, compiled too
        """The EV profile QPs of this host towards host ``peer`` bind: SRv6 source routes over every plane
        (installed on first use, as a controller would), or 0, the NIC's UDP source-port profile, on an
        ECMP fabric."""
        hosts = self._shared.env.hosts
        if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < hosts or peer == self.id:
            raise ValueError(f"peer {peer!r}: not another host of this fabric (0..{hosts - 1} but {self.id})")
        plan = self._shared.env.plan
        if plan is None:
            return 0
        if peer not in self._profiles:
            total = plan.topo.paths_between(self._node.id, peer)
            # `UsidPlan.ev_profile`, installed already expanded (a profile per host pair to validate and
            # expand in the interpreter was most of setting up a large fabric's flows)
            evs, ports = plan.ev_columns(self._node.id, peer, min(self._shared.env.config.evs_per_qp, total))
            self.nic.profiles.add_expanded_columns(
                peer + 1, SRV6_EV_MODE, evs, ports, ev_min_active(len(evs)), int(EVENT_MASK_ALLOWED)
            )
            self._profiles.add(peer)
        return peer + 1

    def connect(self, qp: Qp, peer: object, dest_qp_num: int) -> None:
        """Take ``qp`` from RESET to RTS towards QP ``dest_qp_num`` of host ``peer``, over the EV profile
        towards that peer, with the simulation's defaults (MPR 64, a retransmit timeout of about four
        base RTTs).

        The drivers' `openmrc.provider.bringup.connect_qp` makes the same three transitions; this one is
        written out here because it runs compiled, up to millions of times a run (connections made per
        all-reduce step), with the simulation's attributes rather than connect_qp's defaults (MPR 64 both
        ways, ``max_wimm`` 0 both ways, ``retry_exp`` 25, the timeout above), and without connect_qp's
        ``on_init`` hook or its ERROR → RESET undo when a transition fails (the QP stays where it
        stopped)."""
        qp.modify(
            QpState.INIT,
            ev_profile_id=self.ev_profile_for(peer),
            cc_profile_id=0,
            security=self._shared.security,
        )
        assert isinstance(peer, int)  # ev_profile_for checked it
        qp.modify(QpState.RTR, dest_qp_num=dest_qp_num, peer=peer, rq_psn=0, mpr_dest=64, max_wimm_dest=0)
        qp.modify(
            QpState.RTS,
            sq_psn=0,
            mpr=64,
            max_wimm=0,
            timeout=self._shared.timeout,
            retry_linear=7,
            retry_exp=25,
        )

    def post_send(self, qp: Qp, wr: SendWR) -> None:
        now = self.engine.now
        qp.post_send(wr, now=now)
        self._node.pump(now)

    def post_recv(self, qp: Qp, wr: RecvWR) -> None:
        qp.post_recv(wr)

    @staticmethod
    def poll(cq: CompletionQueue, n: int = 64) -> list[WorkCompletion]:
        return cq.poll(n)

    # -- flows ---------------------------------------------------------------------------------------------
    def _flow_pair(self, peer: MrcHost) -> tuple[Qp, Qp]:
        """The QP pair (this host's, ``peer``'s) that carries every flow from this host to ``peer`` (made on
        first use; its completions go to the flow CQs the simulation drains)."""
        pair = self._flow_pairs.get(peer._node.id)
        if pair is None:
            a = self.nic.create_qp(self._flow_qp_init())
            b = peer.nic.create_qp(peer._flow_qp_init())
            self.connect(a, peer._node.id, b.qp_num)
            peer.connect(b, self._node.id, a.qp_num)
            pair = self._flow_pairs[peer._node.id] = (a, b)
            if self.transient:  # one QP pair carries both directions
                peer._flow_pairs[self._node.id] = (b, a)
                self._open[peer._node.id] = peer._open[self._node.id] = 0
        return pair

    def _cut_qp(self, peer: int, sending: bool) -> Qp:
        """This host's QP of the pair carrying flows to (``sending``) or from host ``peer`` of another
        process: made on first use, as `_flow_pair` makes it here (the same draws of this NIC's rng, in the
        same order), and connected towards QP 0 until ``peer``'s process tells its QP's number
        (`HostEnv.cut`)."""
        cut = self._cut
        if cut is None:
            cut = self._cut = {}
        key = peer if sending else ~peer
        qp = cut.get(key)
        if qp is None:
            qp = cut[key] = self.nic.create_qp(self._flow_qp_init())
            self.connect(qp, peer, 0)
            noted = self._shared.env.cut
            assert noted is not None  # a fabric built in parts notes them
            noted.append((self._node.id, peer, qp))
        return qp

    def accept_flow(self, f: Flow, peer: RemoteHost) -> None:
        """Prepare the receiving end of flow ``f`` from ``peer``, a host of another process."""
        self._grow(f)
        self._cut_qp(peer.id, False)

    def received_from(self, src: int | None) -> int:
        """Bytes this host accepted from host ``src`` of another process (None: from any), each once."""
        cut = self._cut
        if cut is None:
            return 0
        if src is None:
            return sum(qp.responder.rcvd_bytes for k, qp in cut.items() if k < 0)
        qp = cut.get(~src)
        return 0 if qp is None else qp.responder.rcvd_bytes

    def release(self, f: Flow, peer: MrcHost) -> None:
        f.qp = None  # the flow must not keep a destroyed QP (and its EV table) alive
        me, other = self._node.id, peer._node.id
        left = self._open[other] - 1
        self._open[other] = peer._open[me] = left
        if left:
            return
        del self._open[other], peer._open[me]
        a, b = self._flow_pairs.pop(other)
        del peer._flow_pairs[me]
        self._released_bytes += b.responder.rcvd_bytes
        peer._released_bytes += a.responder.rcvd_bytes
        self.nic.destroy_qp(a)
        peer.nic.destroy_qp(b)
        for host, far in ((self, other), (peer, me)):
            if far in host._profiles:
                host._profiles.discard(far)
                host.nic.profiles.remove_ev_profile(far + 1)

    def _flow_qp_init(self) -> QpInitAttr:
        init = self._qp_init
        if init is None:  # one send and one receive CQ per host: completions name their flow by wr_id
            ready = self._shared.ready
            init = self._qp_init = QpInitAttr(send_cq=_SimCq(ready), recv_cq=_SimCq(ready))
        return init

    def _memory(self) -> MemoryRegion:
        mr = self._flow_mr
        buf = self._shared.buf
        if mr is None or mr.length < len(buf):
            mr = self._flow_mr = self.nic.register(buf, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        return mr

    def _grow(self, f: Flow) -> None:
        shared = self._shared
        if len(shared.buf) < f.size:
            shared.buf = shared.zeros.buf = bytearray(f.size)

    def add_flow(self, f: Flow, peer: MrcHost | RemoteHost) -> None:
        self._grow(f)
        if isinstance(peer, RemoteHost):
            f.qp = self._cut_qp(peer.id, True)
            return
        f.qp = self._flow_pair(peer)[0]
        if self.transient:
            self._open[peer._node.id] += 1
            peer._open[self._node.id] = self._open[peer._node.id]

    def start(self, f: Flow, peer: MrcHost | RemoteHost, now: int) -> None:
        smr = self._memory()
        if isinstance(peer, RemoteHost):  # its process posts the receive (`expect`)
            a = self._cut_qp(peer.id, True)
            assert peer.flow_mr is not None  # told before the run
            addr, rkey = peer.flow_mr
        else:
            dmr = peer._memory()
            addr, rkey = dmr.addr, dmr.rkey
            a, b = self._flow_pair(peer)
            if f.imm:
                b.post_recv(RecvWR(f.id))
        a.post_send(
            SendWR(
                f.id,
                WrOpcode.RDMA_WRITE_WITH_IMM if f.imm else WrOpcode.RDMA_WRITE,
                [Sge(smr.addr, f.size, smr.lkey)],
                addr,
                rkey,
                imm_data=f.id & 0xFFFFFFFF if f.imm else None,
            ),
            now=now,
        )
        self._node.pump(now)

    def expect(self, f: Flow, peer: MrcHost | RemoteHost) -> None:
        qp = self._cut_qp(peer.id, False) if isinstance(peer, RemoteHost) else peer._flow_pair(self)[1]
        qp.post_recv(RecvWR(f.id))

    def register_flow_memory(self) -> tuple[int, int]:
        """Register the flows' buffer now rather than at the first flow's start (a split run registers
        every host's before running, so memory keys match those of one process); its (address, R_Key)."""
        mr = self._memory()
        return mr.addr, mr.rkey

    def delivered_bytes(self) -> int:
        return self._released_bytes + sum(b.responder.rcvd_bytes for _a, b in self._flow_pairs.values())

    def retransmits(self) -> int:
        return self.nic.stats.retransmits

    def carriers(self, dst: int, flows: list[Flow]) -> list[Any]:
        pair = self._flow_pairs.get(dst)  # one QP pair carries them all: its responder (none: released)
        if pair is None and self._cut is not None and dst in self._cut:
            return [None]  # its responder runs in another process, which counts it
        return [] if pair is None else [pair[1]]

    def carriers_from(self, src: int) -> list[Any]:
        """The connection that carries flows from ``src``, a host of another process, to this one."""
        return [] if self._cut is None or ~src not in self._cut else [self._cut[~src]]

    def carried_bytes(self, carrier: Any) -> int:
        if carrier is None:
            return 0
        qp: Qp = carrier
        return qp.responder.rcvd_bytes

    def carrier_done(self, carrier: Any, flows: list[Flow]) -> bool:
        return all(f.finish is not None for f in flows)


class _RoceShared:
    """What the RoCEv2 hosts of one simulation share: QP numbers in use and which flow each QP carries."""

    __slots__ = ("config", "env", "flows", "pending", "qpns")

    def __init__(self, env: HostEnv) -> None:
        cfg = env.config
        self.env = env
        self.config = RoceConfig(
            mtu=cfg.mtu, window=cfg.roce_window, dcqcn=DcqcnConfig() if cfg.dcqcn else None
        )
        self.qpns: set[int] = set()
        self.flows: dict[int, Flow] = {}  # QP number -> its flow
        self.pending: dict[int, list[int]] = {}  # flow id -> [QPs not yet acked, not yet received]

    def done(self, q: RoceQp) -> None:
        f = self.flows[q.qpn]
        left = self.pending[f.id]
        left[0] -= 1
        if left[0] == 0:
            self.env.finished(f, self.env.engine.now, WcStatus.SUCCESS)

    def received(self, q: RoceQp) -> None:
        f = self.flows[q.qpn]
        left = self.pending[f.id]
        left[1] -= 1
        if left[1] == 0 and f.imm:
            self.env.received(f, self.env.engine.now)


class RoceV2Host(SimHost):
    """A host running the RoCEv2 baseline: each flow is ``roce_qps`` go-back-N QPs (ECMP paths)."""

    def __init__(self, node: RoceHost, shared: _RoceShared) -> None:
        self.node = node
        self._node = node
        self.resumed = node.resumed
        self._shared = shared
        self._qps: dict[int, list[RoceQp]] = {}  # flow id -> the RoCE QPs of this host's flow
        self.transient = False
        self._released_bytes = 0  # transient: what dropped QPs had delivered

    @classmethod
    def build_all(cls, env: HostEnv) -> list[SimHost]:
        shared = _RoceShared(env)
        out: list[SimHost] = []
        for n in range(env.hosts):
            node = RoceHost(env.engine, n, shared.config)
            node.on_done = shared.done
            node.on_received = shared.received
            out.append(cls(node, shared))
        return out

    def add_flow(self, f: Flow, peer: RoceV2Host) -> None:
        shared = self._shared
        rng = shared.env.rng
        k = shared.env.config.roce_qps
        parts = [f.size // k + (1 if i < f.size % k else 0) for i in range(k)]
        qps = []
        rails = shared.env.config.roce_planes or shared.env.planes
        for i, part in enumerate(parts):
            if part == 0:
                continue
            q = RoceQp(
                new_qpn(rng, shared.qpns),
                f.src,
                f.dst,
                part,
                shared.config.mtu,
                rng.randrange(49152, 65536),
                i % rails,
            )
            qps.append(q)
            shared.flows[q.qpn] = f
        self._qps[f.id] = qps

    def start(self, f: Flow, peer: RoceV2Host, now: int) -> None:
        qps = self._qps[f.id]
        for q in qps:
            self._node.add_sender(q)
            peer._node.rcv[q.qpn] = q
        self._shared.pending[f.id] = [len(qps), len(qps)]
        self._node.pump(now)

    def release(self, f: Flow, peer: RoceV2Host) -> None:
        shared = self._shared
        for q in self._qps.pop(f.id):
            self._released_bytes += self.carried_bytes(q)
            self._node.drop_sender(q.qpn)
            peer._node.rcv.pop(q.qpn, None)
            del shared.flows[q.qpn]
            shared.qpns.discard(q.qpn)
        del shared.pending[f.id]

    def delivered_bytes(self) -> int:
        return self._released_bytes + sum(self.carried_bytes(q) for qps in self._qps.values() for q in qps)

    def retransmits(self) -> int:
        return self._node.resent

    def cnps(self) -> int:
        return self._node.cnps_sent

    def carriers(self, dst: int, flows: list[Flow]) -> list[Any]:
        return [q for f in flows for q in self._qps.get(f.id, ())]

    def carried_bytes(self, carrier: Any) -> int:
        q: RoceQp = carrier
        return min(q.expected * self._shared.config.mtu, q.size)

    def carrier_done(self, carrier: Any, flows: list[Flow]) -> bool:
        q: RoceQp = carrier
        return q.expected >= q.npkts

    def carrier_routes(self, carrier: Any) -> list[tuple[int, int, int, int]] | None:
        q: RoceQp = carrier
        return q.routes()


HOST_KINDS: dict[str, Callable[[HostEnv], list[SimHost]]] = {
    "mrc": MrcHost.build_all,
    "roce": RoceV2Host.build_all,
}
"""`FabricSimConfig.transport` -> how that kind of host is built."""
