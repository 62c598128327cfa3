"""The sans-IO MRC NIC: the data path. QPs, memory regions, demux, timers, the driver interface.

The controller's side lives in its own objects, which the NIC holds and reaches through narrow methods:
`openmrc.transport.profiles` (EV and CC profiles, EV tables, EV events) and
`openmrc.transport.endpoint` (port states here and at peers, EV probes and port status updates).

Drivers (the pair harness, the simulator's hosts, the UDP device) follow one contract, written down in
`openmrc.provider`: feed arrivals and the time (`receive_datagram` / `receive`), drain
`datagrams_to_send`, re-arm one timer (`get_timer` / `handle_timer`); after ``handle_timer(now)``,
`get_timer` returns None or a time later than ``now``, so a driver never spins.

Arrivals come in three shapes, each through an adapter: datagram bytes (`receive_datagram`,
`receive_segments`: the RoCEv2 ICRC checked against the datagram's addressing, `openmrc.wire.Addressing`,
what a socket reports; the entropy the packet travelled on from its UDP source port and flow label),
another in-process NIC's `Transmit` (`receive_transmit`) and a decoded `Packet` (`receive`,
`receive_burst`). Each counts the arrival, drops it on a port that is down, checks what its shape can carry
wrong (bytes: the ICRC, a seal that must open; a `Packet` or `Transmit` of an authenticated QP: that it came
unsealed) and hands on one form, a packet by its fields: data to `Responder.on_fields`, a SACK to
`Requester.on_sack_fields`, read straight from the bytes, the `Transmit` or the `Packet`'s headers with no
object built. `_dispatch` is the one place a decoded packet is routed by opcode; NACKs, AETHs, probes and
endpoint packets reach their handlers as that `Packet`.

Nothing here reads a clock, opens a socket or uses the global random module. Bad input from the network is
dropped and counted in `NicStats` at the receive boundary; it never raises and never writes memory outside
a registered region. API misuse raises `LocalProtocolError`.
"""

from __future__ import annotations

import errno
import heapq
import random
import socket
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Final

from openmrc.ev import EVProfile, EVState
from openmrc.transport.cc import CongestionControl
from openmrc.transport.config import NicConfig
from openmrc.transport.cq import CompletionQueue
from openmrc.transport.endpoint import Endpoint, EpResponse
from openmrc.transport.evtable import EvEvent, EvTable
from openmrc.transport.mr import MemoryRegion, MrTable
from openmrc.transport.profiles import EvProfileBinding, ProfileTable
from openmrc.transport.qp import Qp, QpInitAttr
from openmrc.transport.security import _NO_ICRC, QpSecurity, SealState, SecurityDomain, count_refusal
from openmrc.transport.stats import NicStats
from openmrc.transport.types import (
    Access,
    LocalProtocolError,
    QpState,
    SackTransmit,
    Transmit,
    TrimMark,
    WcStatus,
)
from openmrc.wire import (
    RESERVED_QP_ENDPOINT,
    Addressing,
    Packet,
    WireError,
    icrc_ok,
    parse,
    seal,
    service_time_ns,
)
from openmrc.wire.constants import (
    OP_ACK,
    OP_NACK,
    OP_PROBE,
    OP_SACK,
    OP_WRITE_LAST_WITH_IMM,
    OP_WRITE_ONLY_WITH_IMM,
    is_data_opcode,
)
from openmrc.wire.datagram import icrc_view_ok
from openmrc.wire.packet import ICRC_SIZE, plain_data_fields

__all__ = ["Arrival", "EpResponse", "EvProfileBinding", "Nic", "NicStats"]

# Final: the compiled build calls these through C statics (``heapq.heappush`` is an attribute lookup per call)
_heappop: Final = heapq.heappop
_heappush: Final = heapq.heappush
_heapreplace: Final = heapq.heapreplace

Arrival = tuple[Packet, int, bool, int, TrimMark, Hashable]
"""One packet for `Nic.receive_burst`: (packet, port, ecn, entropy, trim, src), as `receive` takes them."""

# The addressing validation mode seals in-process packets with, and checks them against on receipt.
_LOOP_ADDR: Final = Addressing("::1", "::1", 0xC000)

# Enum members as plain globals: an Enum class attribute lookup costs more than the rest of a test.
_RTS: Final = QpState.RTS
_NO_EV: Final = bytes(32)
_NO_TRIM: Final = TrimMark.NONE
_QPN_SPAN: Final = (1 << 24) - 0x100  # QP numbers 0x100.. (below: reserved)


def draw_qpn(rng: random.Random) -> int:
    """``rng.randrange(0x100, 1 << 24)``, a QP number above the reserved ones: the same number and the same
    words of the generator, drawn without `random.Random`'s Python frames when ``rng`` is a plain one
    (rejection sampling from ``getrandbits(24)``, as its ``_randbelow`` does)."""
    if type(rng) is not random.Random:
        return rng.randrange(0x100, 1 << 24)  # a subclass may draw differently
    r = rng.getrandbits(24)
    while r >= _QPN_SPAN:
        r = rng.getrandbits(24)
    return 0x100 + r


def _ip_text(addr: Addressing) -> str:
    """The source IP address of ``addr`` as text: who sent an endpoint packet, if the driver does not say."""
    return socket.inet_ntop(socket.AF_INET if addr.version == 4 else socket.AF_INET6, addr.src)


def _svc_ns(code: int) -> int:
    """The service time (ns) of an SETH ``svc`` code (0: none reported)."""
    return service_time_ns(code) if code else 0


class Nic:
    """A software MRC NIC with ``num_ports`` ports, one per plane (ports are 1-based, as in verbs)."""

    def __init__(self, num_ports: int, *, rng: random.Random, config: NicConfig | None = None) -> None:
        if not 1 <= num_ports <= 32:
            raise LocalProtocolError(errno.EINVAL, f"num_ports: {num_ports} outside 1..32")
        self.num_ports = num_ports
        self.rng = rng
        self.config = config or NicConfig()
        self._validate = self.config.validate_wire  # read per packet; NicConfig is frozen
        self.stats = stats = NicStats()
        self.mrs = MrTable(rng)
        self.qps: dict[int, Qp] = {}
        self.domains: dict[int, SecurityDomain] = {}
        """The security domains a controller created on this NIC, by SDI (`openmrc.ctl`)."""
        self.secure: dict[int, SealState] = {}
        """The QPs in a security domain (by QP number): their packets are sealed and opened
        (`openmrc.transport.security`); every other packet for them is dropped."""
        self._ctrl: list[Transmit] = []
        self._active: dict[Qp, None] = {}
        self._idle_active: dict[Qp, None] = {}  # the other of the two dicts `datagrams_to_send` swaps
        self._woken: dict[Qp, None] = {}  # QPs woken since the driver last asked (see `wake`)
        self._idle_woken: dict[Qp, None] = {}  # the other of the two dicts `_settle` swaps
        self._timers: list[tuple[int, int, Qp]] = []
        """(time, sequence, QP): at most one entry a QP counts (its ``heap_seq``'s), at or before its deadline
        (``timer_at``, set at ``timer_seq``). A deadline that moves later leaves the entry where it is, and
        the entry moves on when it reaches the front (`_front`): no push per ACK as the RTO moves on."""
        self._heap_front = -1
        """The time of the heap's front entry (-1: the heap is empty), what `timer_floor` answers without
        reaching into the heap (a NIC's heap is seldom in the cache when its driver asks)."""
        self._next_timer: int | None = None  # get_timer()'s answer while _timer_known (asked per poll)
        self._timer_known = False
        self._seq = 0  # tie-breaker of timer heap entries
        # The controller's side, in its own objects (the data path reads only ``ports_up`` per packet):
        self.profiles = ProfileTable(num_ports, rng, self.config, stats)
        self.endpoint = ep = Endpoint(num_ports, stats, self._queue_control, self._refresh_port_masks)
        # Views of their state under the names drivers and tests use (the same objects, never copies).
        self.ports_up = ep.ports_up
        self.peer_ports = ep.peer_ports
        self.ev_profiles = self.profiles.ev
        self.cc_profiles = self.profiles.cc

    @property
    def ep_responses(self) -> deque[EpResponse]:
        """The endpoint's answers to this NIC's requests (`Endpoint.responses`)."""
        return self.endpoint.responses

    @property
    def ev_events(self) -> deque[EvEvent]:
        """The EV event queue (`ProfileTable.events`)."""
        return self.profiles.events

    # -- resources -----------------------------------------------------------------------------------------
    def register(
        self, buffer: Any, access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE, addr: int | None = None
    ) -> MemoryRegion:
        """Register a writable buffer-protocol object (bytearray, numpy array, mmap) as a memory region."""
        return self.mrs.register(buffer, access, addr)

    def deregister(self, mr: MemoryRegion) -> None:
        self.mrs.deregister(mr)

    def create_cq(self, depth: int = 65536) -> CompletionQueue:
        return CompletionQueue(depth)

    def destroy_cq(self, cq: CompletionQueue) -> None:
        """Check that no QP uses ``cq`` any more (`LocalProtocolError` EBUSY naming how many do); a CQ
        holds nothing else of the NIC's."""
        users = sum(1 for qp in self.qps.values() if cq is qp.send_cq or cq is qp.recv_cq)
        if users:
            raise LocalProtocolError(errno.EBUSY, f"the CQ is in use by {users} QP(s)")

    def create_qp(self, init: QpInitAttr) -> Qp:
        while True:
            qpn = draw_qpn(self.rng)
            if qpn not in self.qps:
                break
        qp = Qp(self, qpn, init)
        self.qps[qpn] = qp
        return qp

    def destroy_qp(self, qp: Qp) -> None:
        """Take ``qp`` out of this NIC, dropping what it still had to do (`openmrc.verbs.destroy_qp` flushes
        it first); `Qp.detach` lets reference counting free it at once."""
        if self.qps.get(qp.qp_num) is not qp:
            raise LocalProtocolError(errno.EINVAL, "QP does not belong to this NIC")
        del self.qps[qp.qp_num]
        self.secure.pop(qp.qp_num, None)
        self._active.pop(qp, None)
        self._woken.pop(qp, None)
        qp.timer_at = qp.heap_at = -1
        self._timer_known = False
        timers = self._timers
        if any(e[2] is qp for e in timers):  # stale deadlines would keep it alive until they pass
            self._timers = timers = [e for e in timers if e[2] is not qp]
            heapq.heapify(timers)
            self._heap_front = timers[0][0] if timers else -1
        qp.detach()

    # -- profiles (transport.profiles) ---------------------------------------------------------------------
    def has_ev_profile(self, profile_id: int) -> bool:
        return self.profiles.has_ev_profile(profile_id)

    def has_cc_profile(self, profile_id: int) -> bool:
        return self.profiles.has_cc_profile(profile_id)

    def ev_profile(self, profile_id: int) -> EvProfileBinding:
        return self.profiles.ev_profile(profile_id)

    def add_ev_profile(
        self, profile_id: int, profile: EVProfile, ports: Sequence[int] | None = None
    ) -> EvProfileBinding:
        return self.profiles.add_ev_profile(profile_id, profile, ports)

    def add_cc_profile(self, profile_id: int, algorithm: str, config: object | None = None) -> None:
        self.profiles.add_cc_profile(profile_id, algorithm, config)

    def make_cc(self, profile_id: int, now: int) -> CongestionControl:
        return self.profiles.make_cc(profile_id, now)

    def build_ev_table(self, qp: Qp, now: int = 0) -> EvTable:
        ep = self.endpoint
        return self.profiles.build_ev_table(
            qp.qp_num, qp.attr.ev_profile_id or 0, ep.local_status(), ep.port_mask(qp.attr.peer), now
        )

    def poll_ev_events(self, n: int = 64) -> list[EvEvent]:
        return self.profiles.poll_events(n)

    def modify_ev_state(self, qp: Qp, entropy: int, state: EVState, *, now: int) -> None:
        """Controller MODIFY_EV_STATE on one QP's EV (found by its 32-bit echo value)."""
        if state not in (EVState.GOOD, EVState.ASSUMED_BAD, EVState.DENIED):
            raise LocalProtocolError(errno.EINVAL, f"the controller cannot set EV state {state.name}")
        evs = qp.evs
        e = None if evs is None else evs.find(entropy)
        if evs is None or e is None:
            raise LocalProtocolError(errno.ENOENT, f"QP 0x{qp.qp_num:06x} has no EV 0x{entropy:08x}")
        evs.set_state(e, state, now)
        qp.requester.blocked = False
        self.wake(qp)

    # -- ports and endpoint operations (transport.endpoint) -------------------------------------------------
    def local_port_status(self) -> int:
        return self.endpoint.local_status()

    def _refresh_port_masks(self) -> None:
        ep = self.endpoint
        local = ep.local_status()
        for qp in self.qps.values():
            if qp.evs is not None:
                qp.evs.set_port_masks(local, ep.port_mask(qp.attr.peer))
                qp.requester.blocked = False
                self.wake(qp)

    def peer_port_alive(self, peer: Hashable, port: int) -> None:
        """A probe across ``port``'s plane was answered: ``peer``'s port there is up."""
        self.endpoint.peer_alive(peer, port)

    def port_down(self, port: int, *, now: int) -> None:
        """NIC port ``port`` (plane) went down: stop using its EVs and tell every peer."""
        self._set_port(port, False, now)

    def port_up(self, port: int, *, now: int) -> None:
        self._set_port(port, True, now)

    def _set_port(self, port: int, up: bool, now: int) -> None:
        peers = (qp.attr.peer for qp in self.qps.values() if qp.attr.peer is not None)
        self.endpoint.set_port(port, up, now, peers)

    def _queue_control(self, t: Transmit) -> None:
        self._ctrl.append(t)

    # -- security domains (transport.security) ------------------------------------------------------------
    def secure_endpoint(self, domain: SecurityDomain | None) -> None:
        """**[openmrc]** Authenticate this NIC's endpoint packets (port status updates, EV probes and their
        answers, on the reserved QP) in ``domain``: they leave sealed, and an endpoint packet that does
        not open is dropped and counted like any other (None: MRC 1.0 again). Every NIC that talks to
        this one must do the same, in the same domain."""
        if domain is None:
            self.secure.pop(RESERVED_QP_ENDPOINT, None)
            return
        sec = QpSecurity(domain, header_tag=False)
        self.secure[RESERVED_QP_ENDPOINT] = SealState(
            RESERVED_QP_ENDPOINT, sec, RESERVED_QP_ENDPOINT, per_sender=True
        )

    def revoke_domain(self, domain: SecurityDomain, now: int) -> int:
        """``domain`` was revoked: every QP of this NIC in it fails (ERROR, its work flushed, LOC_PROT_ERR
        for the first WR), at once, and an endpoint it secured takes nothing more; how many QPs."""
        domain.revoke()
        n = 0
        for qpn, s in list(self.secure.items()):
            if s.domain is domain and qpn != RESERVED_QP_ENDPOINT:
                qp = self.qps[qpn]
                qp.set_error(now, WcStatus.LOC_PROT_ERR, f"security domain {domain.sdi} revoked")
                self.wake(qp)
                n += 1
        return n

    # -- the driver interface: arrivals ---------------------------------------------------------------------
    def receive(
        self,
        data: Packet | bytes | bytearray | memoryview,
        port: int,
        now: int,
        ecn: bool = False,
        entropy: int = 0,
        trim: TrimMark = TrimMark.NONE,
        src: Hashable = None,
    ) -> None:
        """Process one decoded packet that arrived on ``port`` (an in-process driver: the simulator, the
        pair harness). Never raises on bad input: drops and counts it. Raw bytes go through
        `receive_datagram`, which checks their ICRC.

        ``ecn``: the IP header's CE mark; ``entropy``: the 32-bit EV value the packet travelled on (its
        ``(flow_label & 0xffff) << 16 | udp_sport``; a `Transmit`'s ``entropy``), 0 if unknown; ``trim``:
        the fabric's trim mark; ``src``: the sender's identity, needed only to answer endpoint requests
        (None: they are answered towards None). A driver calling per packet passes them positionally
        (cheaper than keywords)."""
        if not isinstance(data, Packet):
            raise LocalProtocolError(
                errno.EINVAL,
                "receive() takes a decoded Packet; raw bytes go through receive_datagram(), "
                "which checks their ICRC against the datagram's addressing",
            )
        stats = self.stats
        stats.rx_packets += 1
        if not 0 < port <= self.num_ports or not self.ports_up[port]:
            stats.rx_dropped_port += 1
            return
        if self.secure and data.bth.dest_qp in self.secure:  # a decoded packet carries no seal
            stats.rx_auth_unsealed += 1
            return
        pkt = self._revalidated(data, trim) if self._validate else data
        if pkt is not None:
            self._dispatch(pkt, port, now, ecn, entropy, trim, src)

    def _revalidated(self, pkt: Packet, trim: TrimMark) -> Packet | None:
        """Validation mode: ``pkt`` as its bytes decode, which must round-trip with their ICRC (None: it was
        dropped and counted)."""
        stats = self.stats
        try:
            cut = bool(trim)
            raw = pkt.encode(trimmed=cut)
            if not cut and not icrc_ok(raw, _LOOP_ADDR):
                stats.rx_bad_icrc += 1
                return None
            return parse(raw, trimmed=cut)
        except WireError:
            stats.rx_malformed += 1
            return None

    def receive_burst(self, burst: Iterable[Arrival], now: int) -> None:
        """`receive` every ``(data, port, ecn, entropy, trim, src)`` of ``burst`` in order, at ``now``: a
        driver's receive burst (one call per batch, as NIC drivers poll their rings) instead of a call per
        datagram."""
        for data, port, ecn, entropy, trim, src in burst:
            self.receive(data, port, now, ecn, entropy, trim, src)

    def receive_transmit(
        self,
        t: Transmit,
        port: int,
        now: int,
        ecn: bool = False,
        entropy: int = 0,
        trim: TrimMark = TrimMark.NONE,
        src: Hashable = None,
    ) -> None:
        """`receive` of a packet another in-process NIC's `datagrams_to_send` emitted (the simulator's hosts):
        a data packet that left its NIC as its Write's template reaches the responder by its fields, a SACK
        (`SackTransmit`) the requester by its fields, and no `Packet` is ever built for them (in validation
        mode they take the byte path like every packet); a sealed one (``body``) is opened as bytes, any
        other goes to `receive` as its `Packet`."""
        body = t.body
        tpl = t.tpl
        if body is not None:  # sealed by an authenticated QP: its bytes (no ICRC) are the packet
            dqp = -1
        elif tpl is not None:
            dqp = tpl.dest_qp
        elif isinstance(t, SackTransmit) and not t.has_packet() and not trim:
            dqp = t.dest_qp  # a SACK by its fields
        else:
            dqp = RESERVED_QP_ENDPOINT  # (no fields to go by: the Packet path)
        if dqp == RESERVED_QP_ENDPOINT or (self._validate and body is None):
            self.receive(t.packet, port, now, ecn, entropy, trim, src)
            return
        stats = self.stats
        stats.rx_packets += 1
        if not 0 < port <= self.num_ports or not self.ports_up[port]:
            stats.rx_dropped_port += 1
            return
        if body is not None:
            if len(body) < 8:
                stats.rx_malformed += 1
                return
            s = self.secure.get(body[5] << 16 | body[6] << 8 | body[7])
            if not self._receive_body(s, memoryview(body), len(body), port, now, ecn, entropy, trim, src):
                assert s is not None
                count_refusal(stats, s.refused)
            return
        qp = self.qps.get(dqp)
        if qp is None:
            stats.rx_dropped_no_qp += 1
            return
        if qp.seal is not None:
            stats.rx_auth_unsealed += 1
            return
        if tpl is None:
            assert isinstance(t, SackTransmit)
            qp.requester.on_sack_fields(
                t.cack_psn, t.ack_psn_offset, t.sack_offset, t.bitmap, t.echo, t.m, t.pr, t.qp_num & 0xFFFF,
                dqp & 0xFFFF, t.mpr, now, _svc_ns(t.svc),
            )  # fmt: skip
        else:
            op = t.op
            imm = tpl.immdt
            with_imm = imm is not None and op in (OP_WRITE_LAST_WITH_IMM, OP_WRITE_ONLY_WITH_IMM)
            qp.responder.on_fields(
                op, t.psn, t.ack_req, t.va, tpl.rkey, tpl.dma_len, t.payload,
                imm.imm_data if with_imm and imm is not None else 0, 0, now, port, ecn, entropy, trim,
            )  # fmt: skip
        self._woken[qp] = None

    def receive_datagram(
        self,
        data: bytes | bytearray | memoryview,
        port: int,
        now: int,
        addr: Addressing | object,  # checked below: misuse gets a reason, not the compiled build's TypeError
        *,
        ecn: bool = False,
        flow_label: int = 0,
        trim: TrimMark = TrimMark.NONE,
        src: Hashable = None,
    ) -> None:
        """Process one MRC UDP payload (BTH through ICRC) that arrived on ``port``, with the addressing the
        socket reported (``addr``: source and destination IP and UDP ports). Never raises on bad input: a
        wrong ICRC, a malformed packet, a wrong port are dropped and counted.

        ``ecn``: the IP header's CE mark; ``flow_label``: the IPv6 flow label (0 for IPv4), whose low 16
        bits are the high half of the entropy the responder echoes (the low half is the UDP source port);
        ``trim``: the packet was trimmed by the fabric (e.g. its DSCP says so; its ICRC is then not checked,
        see `openmrc.wire.datagram`); ``src``: the sender's identity for endpoint operations, by default
        its IP address as text."""
        self.receive_segments(data, 0, port, now, addr, ecn=ecn, flow_label=flow_label, trim=trim, src=src)

    def receive_segments(
        self,
        data: bytes | bytearray | memoryview,
        seg: int,
        port: int,
        now: int,
        addr: Addressing | object,
        *,
        ecn: bool = False,
        flow_label: int = 0,
        trim: TrimMark = TrimMark.NONE,
        src: Hashable = None,
    ) -> None:
        """`receive_datagram` of every ``seg`` bytes of ``data`` (the last datagram may be shorter; ``seg`` 0:
        one datagram): the datagrams a UDP GRO receive hands over at once, which share their addressing,
        ECN mark, flow label and trim mark."""
        if not isinstance(addr, Addressing):
            raise LocalProtocolError(errno.EINVAL, f"addr: expected an openmrc.wire.Addressing, got {addr!r}")
        stats = self.stats
        view = data if type(data) is memoryview else memoryview(data)
        plain = view.ndim == 1 and view.itemsize == 1  # bytes as they come from a socket
        if not plain:
            view = view.cast("B")
        total = len(view)
        if seg <= 0 or seg > total:
            seg = total
        n = -(-total // seg) if total else 1  # datagrams (an empty one is one too: malformed)
        if not 0 < port <= self.num_ports or not self.ports_up[port]:
            stats.rx_packets += n
            stats.rx_dropped_port += n
            return
        entropy = ((flow_label & 0xFFFF) << 16) | addr.sport  # the EV echo: flow label high, source port low
        qps = self.qps
        secure = self.secure
        last_qpn = -1
        qp: Qp | None = None
        for i in range(n):
            dg = view[i * seg : i * seg + seg] if n > 1 else view
            stats.rx_packets += 1
            s = secure.get(dg[5] << 16 | dg[6] << 8 | dg[7]) if secure and len(dg) >= 8 else None
            if s is not None:
                # Its tag covers every byte of the packet the ICRC does (not the addresses): the ICRC is
                # checked only when the seal refuses it, to count damage (rx_bad_icrc) apart from forgery.
                who = src
                if who is None and s.qp_num == RESERVED_QP_ENDPOINT:
                    who = _ip_text(addr)
                if not self._receive_body(s, dg, len(dg) - ICRC_SIZE, port, now, ecn, entropy, trim, who):
                    if not trim and not icrc_view_ok(dg, addr):  # (a trimmed packet has no ICRC to check)
                        stats.rx_bad_icrc += 1
                    else:
                        count_refusal(stats, s.refused)
                continue
            if not trim:
                if not icrc_view_ok(dg, addr):
                    stats.rx_bad_icrc += 1
                    continue
                f = plain_data_fields(dg)
                if f[0] and f[1] != RESERVED_QP_ENDPOINT:  # a plain data packet: no header objects
                    if f[1] != last_qpn:  # a burst's datagrams are for one QP: look it up once
                        last_qpn = f[1]
                        qp = qps.get(last_qpn)
                    if qp is None:
                        stats.rx_dropped_no_qp += 1
                    else:
                        qp.responder.on_fields(
                            f[0], f[2], f[3], f[4], f[5], f[6], f[7], 0, 0, now, port, ecn, entropy, _NO_TRIM
                        )
                        self._woken[qp] = None
                    continue
            try:
                pkt = parse(dg, trimmed=bool(trim))
            except WireError:
                stats.rx_malformed += 1
                continue
            who = src
            if who is None and pkt.bth.dest_qp == RESERVED_QP_ENDPOINT:
                who = _ip_text(addr)
            self._dispatch(pkt, port, now, ecn, entropy, trim, who)

    def _receive_body(
        self,
        s: SealState | None,
        body: memoryview,
        n: int,
        port: int,
        now: int,
        ecn: bool,
        entropy: int,
        trim: TrimMark,
        src: Hashable,
    ) -> bool:
        """A packet from BTH up to (not including) its ICRC, ``body``'s first ``n`` bytes; its ICRC was
        checked, never existed (an in-process fabric) or is left to the seal: opened by ``s``, the seal of
        the QP it is for if that QP is in a security domain, else parsed as is. False when ``s`` refused
        it (its reason in ``s.refused``, not yet counted: the caller counts it)."""
        if s is None:
            raw: memoryview | bytes | None = b"".join((body[:n], _NO_ICRC))
        else:
            raw = s.verify(body, bool(trim), n)
        if raw is None:
            return False
        if s is not None and not trim:  # an opened plain data packet: the responder's fast path
            f = plain_data_fields(raw if type(raw) is memoryview else memoryview(raw))
            qp = self.qps.get(f[1]) if f[0] else None
            if qp is not None:
                qp.responder.on_fields(
                    f[0], f[2], f[3], f[4], f[5], f[6], f[7], 0, 0, now, port, ecn, entropy, _NO_TRIM
                )
                self._woken[qp] = None
                return True
        try:
            pkt = parse(raw, trimmed=bool(trim))
        except WireError:
            self.stats.rx_malformed += 1
            return True
        self._dispatch(pkt, port, now, ecn, entropy, trim, src)
        return True

    def _dispatch(
        self, pkt: Packet, port: int, now: int, ecn: bool, entropy: int, trim: TrimMark, src: Hashable
    ) -> None:
        """Route a decoded packet (its port, seal and ICRC already checked) by its opcode: data and SACKs as
        their fields to the one handler of each, every other kind as the `Packet` it is."""
        stats = self.stats
        bth = pkt.bth
        op = bth.opcode
        is_data = is_data_opcode(op)
        if trim and not is_data:
            stats.rx_malformed += 1  # control traffic is never trimmed
            return
        if bth.dest_qp == RESERVED_QP_ENDPOINT:
            self.endpoint.on_packet(pkt, now, port, entropy, src)
            return
        qp = self.qps.get(bth.dest_qp)
        if qp is None:
            stats.rx_dropped_no_qp += 1
            return
        if is_data:
            reth, imm, tseth = pkt.reth, pkt.imm, pkt.tseth
            assert reth is not None
            qp.responder.on_fields(
                op, bth.psn, bth.ack_req, reth.va, reth.rkey, reth.dma_len, pkt.payload,
                imm.imm_data if imm is not None else 0, tseth.tx_timestamp if tseth is not None else 0,
                now, port, ecn, entropy, trim,
            )  # fmt: skip
        elif op == OP_SACK:
            seth = pkt.seth
            assert seth is not None
            qp.requester.on_sack_fields(
                seth.cack_psn, seth.ack_psn_offset, seth.sack_offset, seth.bitmap, seth.entropy, seth.m,
                seth.pr, seth.src_qp, seth.dst_qp, seth.mpr, now, _svc_ns(seth.svc),
            )  # fmt: skip
        elif op == OP_NACK:
            qp.requester.on_nack(pkt, now)
        elif op == OP_ACK:
            qp.requester.on_aeth(pkt, now)
        elif op == OP_PROBE:
            qp.responder.on_probe(pkt, now, port, ecn, entropy)
        else:
            stats.rx_dropped_state += 1
            return
        self._woken[qp] = None

    # -- the driver interface: departures and timers ------------------------------------------------------
    def send_control(self, qp: Qp, pkt: Packet, port: int) -> None:
        """Queue a NACK/ACK of ``qp``: on the plane it answers, on one of the QP's own EVs."""
        self.send_transmit(qp, Transmit(port, None, _NO_EV, 0, pkt, qp.qp_num, 0), port)

    def send_transmit(self, qp: Qp, t: Transmit, port: int) -> None:
        """Queue a control packet of ``qp`` (or a `SackTransmit`: a SACK by its fields) towards its peer: on
        the plane it answers (``port``), on one of the QP's own EVs."""
        evs = qp.evs
        e = None
        if evs is not None:
            e = evs.pick(None, port) or evs.pick()
        t.peer = qp.attr.peer
        if e is None:
            t.port = port
        else:
            t.port = e.port
            t.ev = e.expanded
            t.entropy = e.entropy
        self._ctrl.append(t)

    def has_data(self) -> bool:
        """Whether some QP may have data packets to send (a pacing driver polls again when a port frees)."""
        if self._woken:
            self._settle()
        return bool(self._active)

    def wake(self, qp: Qp) -> None:
        """Note that ``qp`` may have packets to send or a new timer deadline. Only noted here: the driver's
        next question (`datagrams_to_send`, `get_timer`, `handle_timer`, `has_data`) settles every QP woken
        since, once each, so a burst of packets for one QP costs one look at its state, not one per packet."""
        self._woken[qp] = None

    def _settle(self) -> None:
        woken = self._woken
        self._woken = self._idle_woken  # swapped (no dict made and freed per call)
        for qp in woken:
            self._wake_now(qp)
        woken.clear()
        self._idle_woken = woken

    def _wake_now(self, qp: Qp) -> None:
        r = qp.requester
        if qp.state is _RTS and (r.unsent or r.rec.retx) and not r.blocked:  # work waiting and not blocked
            self._active[qp] = None
        t = qp.next_timer()
        if t is None:
            if qp.timer_at >= 0:
                qp.timer_at = -1
                self._timer_known = False
        elif qp.timer_at != t:
            qp.timer_at = t
            self._seq = seq = self._seq + 1
            qp.timer_seq = seq
            if qp.heap_at < 0 or t < qp.heap_at:  # no entry of its own at or before t: one
                qp.heap_at = t
                qp.heap_seq = seq
                _heappush(self._timers, (t, seq, qp))
                if t < self._heap_front or self._heap_front < 0:
                    self._heap_front = t
            self._timer_known = False

    def datagrams_to_send(self, now: int, max_data: int | None = None) -> list[Transmit]:
        """The packets that may leave now: all control packets first, then each QP's retransmissions and new
        data, at most ``max_data`` data packets (a driver that paces at line rate asks for what its ports
        can take; the rest waits for the next call)."""
        if self._woken:
            self._settle()
        out = self._ctrl
        self._ctrl = []
        if out:
            out = self.endpoint.leaving(out, now)
        if not out and not self._active:
            return out
        if self._active:
            active = self._active
            self._active = self._idle_active  # swapped: wake() below re-adds the QPs still blocked
            budget = 1 << 61 if max_data is None else max_data  # (below 2**62: unboxed when compiled)
            for qp in active:
                r = qp.requester
                rec = r.rec
                if (
                    budget <= 0
                    and not r.blocked
                    and qp.state is _RTS
                    and not qp.evs.bad  # type: ignore[union-attr]
                    and not rec.pending_probes
                    and rec.plane_probe_at is None
                ):
                    # A pacing driver polls often with no room left. Without bad EVs (no probe can be due)
                    # emit() would change nothing, and nothing else changed since this QP's last wake()
                    # (every state change ends in one), so its timer stands: it only stays in the set.
                    # Work that never had room (every port down, a driver that asks for nothing) gets
                    # its retransmission timer now: a QP with work always has one.
                    if r.unsent or rec.retx:
                        self._active[qp] = None
                        if rec.rto_deadline is None:
                            rec.rto_deadline = now + rec.rto()
                            self._wake_now(qp)
                    continue
                # Even with no data budget left a QP sends its due probes (tiny, not rate-limited), so
                # that probe deadlines move on; QPs with data left stay in the set.
                budget -= r.emit(now, out, budget)
                self._wake_now(qp)  # still blocked (window, cwnd, no usable EV) QPs stay in the set
            active.clear()  # reused next time (no dict made and freed per call)
            self._idle_active = active
        if out:
            self.stats.tx_packets += len(out)
        if self._validate:  # every packet as its bytes decode, with the ICRC `receive` checks
            for t in out:
                t.packet = parse(seal(t.packet, _LOOP_ADDR))
        if self.secure and out:
            out = self._seal(out, now)
        return out

    def _seal(self, out: list[Transmit], now: int) -> list[Transmit]:
        """``out`` with the packets of authenticated QPs sealed (``Transmit.body``); a packet its QP may no
        longer seal (the domain was revoked) does not leave."""
        secure = self.secure
        kept: list[Transmit] = []
        for t in out:
            s = secure.get(t.qp_num)
            if s is None or s.seal(t, now):
                kept.append(t)
        return kept

    def get_timer(self) -> int | None:
        """The earliest deadline at which `handle_timer` must be called, or None."""
        if self._woken:
            self._settle()
        if self._timer_known:
            return self._next_timer
        front = self._front()
        t = None if front < 0 else front
        self._next_timer = t
        self._timer_known = True
        return t

    def timer_floor(self) -> int:
        """A time no later than `get_timer`'s deadline (-1: `get_timer` is None), without putting the timer
        heap in order: what a driver that asks after every packet compares with the deadline it already
        waits for (only when this is earlier does it need `get_timer`'s exact answer)."""
        if self._woken:
            self._settle()
        if self._timer_known:
            t = self._next_timer
            return -1 if t is None else t
        return self._heap_front

    def _front(self) -> int:
        """The earliest deadline of any QP (-1: none), its entry made the heap's front: entries no QP counts
        are dropped, a cancelled deadline's too, and one whose deadline moved later moves there."""
        timers = self._timers
        while timers:
            t, seq, qp = timers[0]
            if seq != qp.heap_seq:  # an entry its QP no longer counts (it made an earlier one since)
                _heappop(timers)
                continue
            at = qp.timer_at
            if at < 0:
                _heappop(timers)
                qp.heap_at = -1
                continue
            if at == t and qp.timer_seq == seq:
                self._heap_front = t
                return t
            qp.heap_at = at  # (at or after t)
            qp.heap_seq = qp.timer_seq
            _heapreplace(timers, (at, qp.timer_seq, qp))
        self._heap_front = -1
        return -1

    def handle_timer(self, now: int) -> None:
        if self._woken:
            self._settle()
        timers = self._timers
        self._timer_known = False
        due = []
        while True:  # the due QPs by deadline, then by when each deadline was set
            t = self._front()
            if t < 0 or t > now:
                break
            qp = _heappop(timers)[2]
            qp.timer_at = qp.heap_at = -1
            due.append(qp)
        for qp in due:
            qp.on_timer(now)
            self._wake_now(qp)
            if qp.requester.rec.pending_probes and qp.state is _RTS:
                self._active[qp] = None  # probes to send
