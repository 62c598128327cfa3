"""The sans-IO MRC NIC: ports (planes), QPs, memory regions, EV/CC profiles, demux, timers, endpoint ops.

Drivers (the pair harness, the simulator's hosts, the UDP device) follow one contract, written down in
`openmrc.provider`: feed arrivals and the time (`receive_datagram` / `receive`), drain
`datagrams_to_send`, re-arm one timer (`get_timer` / `handle_timer`); after ``handle_timer(now)``,
`get_timer` returns None or a time later than ``now``, so a driver never spins.
Raw bytes enter only through `receive_datagram`, which checks the RoCEv2 ICRC against the datagram's
addressing (`openmrc.wire.Addressing`: what a socket reports) and derives the entropy the packet travelled
on from its UDP source port and flow label. Nothing here reads a clock, opens a socket or uses the global
random module. Bad input from the network is dropped and counted in `NicStats` at the receive boundary; it
never raises and never writes memory outside a registered region. API misuse raises `LocalProtocolError`.
"""

from __future__ import annotations

import errno
import heapq
import random
import socket
from array import array
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final

from openmrc.ev import (
    EVENT_MASK_ALLOWED,
    EVFormatMode,
    EVProfile,
    EVProfileMode,
    EVState,
    ev_echo32,
)
from openmrc.transport.cc import CongestionControl, create_cc
from openmrc.transport.config import NicConfig
from openmrc.transport.cq import CompletionQueue
from openmrc.transport.evtable import EvEvent, EvTable
from openmrc.transport.mr import MemoryRegion, MrTable
from openmrc.transport.nscc import NsccConfig
from openmrc.transport.qp import Qp, QpInitAttr
from openmrc.transport.types import Access, LocalProtocolError, QpState, Transmit, TrimMark
from openmrc.wire import (
    BTH,
    EETH,
    ERTH,
    RESERVED_QP_ENDPOINT,
    Addressing,
    EpOp,
    Opcode,
    Packet,
    WireError,
    icrc_ok,
    parse,
    seal,
)
from openmrc.wire.constants import (
    OP_ACK,
    OP_NACK,
    OP_PROBE,
    OP_SACK,
    is_data_opcode,
)
from openmrc.wire.datagram import icrc_view_ok
from openmrc.wire.packet import plain_data_fields

__all__ = ["Arrival", "EpResponse", "EvProfileBinding", "Nic", "NicStats"]

# Final: the compiled build calls these through C statics (``heapq.heappush`` is an attribute lookup per call)
_heappop: Final = heapq.heappop
_heappush: Final = heapq.heappush

Arrival = tuple[Packet, int, bool, int, TrimMark, Hashable]
"""One packet for `Nic.receive_burst`: (packet, port, ecn, entropy, trim, src), as `receive` takes them."""

# The addressing validation mode seals in-process packets with, and checks them against on receipt.
_LOOP_ADDR: Final = Addressing("::1", "::1", 0xC000)

# Enum members as plain globals: an Enum class attribute lookup costs more than the rest of a test.
_RTS: Final = QpState.RTS


@dataclass(slots=True)
class NicStats:
    """Counters of everything the NIC did or refused.

    ``rx_bad_icrc``: datagrams whose ICRC did not match their bytes and addressing (dropped);
    ``rx_bogus_ack``: SACK/NACK/ACK/probe answers that match nothing this QP has outstanding (stale,
    duplicated or forged; dropped, never acted upon); ``ep_unsent``: endpoint requests (port status
    updates) that could not leave because no port was up; ``tx_dropped_port``: control packets queued for
    a port that went down before the driver took them."""

    rx_packets: int = 0
    rx_data: int = 0
    rx_malformed: int = 0
    rx_bad_icrc: int = 0
    rx_dropped_no_qp: int = 0
    rx_dropped_state: int = 0
    rx_dropped_port: int = 0
    rx_bogus_ack: int = 0
    tx_packets: int = 0
    tx_data: int = 0
    retransmits: int = 0
    losses_inferred: int = 0
    tail_probes: int = 0
    timeouts: int = 0
    duplicates: int = 0
    sacks_sent: int = 0
    nacks_sent: int = 0
    nacks_received: int = 0
    trims_seen: int = 0
    trims_received: int = 0
    probes_sent: int = 0
    probes_answered: int = 0
    access_errors: int = 0
    protocol_errors: int = 0
    qp_errors: int = 0
    ep_requests: int = 0
    ep_responses: int = 0
    ep_unsent: int = 0
    tx_dropped_port: int = 0
    ev_events_dropped: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class EvProfileBinding:
    """An EV profile as the NIC holds it: every EV expanded, with its port and 32-bit echo value."""

    profile_id: int
    mode: EVFormatMode
    entries: tuple[tuple[bytes, int, int], ...]
    min_active: int
    event_mask: int


@dataclass(frozen=True, slots=True)
class EpResponse:
    """The answer to an endpoint request (mrc_ctl_ep_rsp): RTT corrected for the responder's service time."""

    req_id: int
    op: EpOp
    port: int
    rtt: int
    adj_svc_time: bool
    service_time: int
    port_status: int
    peer: Hashable


class Nic:
    """A software MRC NIC with ``num_ports`` ports, one per plane (ports are 1-based, as in verbs)."""

    def __init__(self, num_ports: int, *, rng: random.Random, config: NicConfig | None = None) -> None:
        if not 1 <= num_ports <= 32:
            raise LocalProtocolError(errno.EINVAL, f"num_ports: {num_ports} outside 1..32")
        self.num_ports = num_ports
        self.rng = rng
        self.config = config or NicConfig()
        self._validate = self.config.validate_wire  # read per packet; NicConfig is frozen
        self.stats = NicStats()
        self.ports_up = [False] + [True] * num_ports
        self._ports_down = False  # some port is down (control packets queued for it are dropped)
        self.mrs = MrTable(rng)
        self.qps: dict[int, Qp] = {}
        self.ev_profiles: dict[int, EvProfileBinding] = {}
        self._default_ev_values: array[int] | None = None
        self.cc_profiles: dict[int, tuple[str, object | None]] = {}
        self.ev_events: deque[EvEvent] = deque(maxlen=1 << 16)
        self.ep_responses: deque[EpResponse] = deque()
        self.peer_ports: dict[Hashable, int] = {}
        self._ctrl: list[Transmit] = []
        self._active: dict[Qp, None] = {}
        self._timers: list[tuple[int, int, Qp]] = []
        """(deadline, sequence, QP); an entry whose deadline is no longer the QP's ``timer_at`` is stale."""
        self._next_timer: int | None = None  # get_timer()'s answer while _timer_known (asked per poll)
        self._timer_known = False
        self._seq = 0  # tie-breaker of timer heap entries
        self._ep_pending: dict[int, tuple[int, EpOp]] = {}
        self._ep_arrivals: dict[int, int] = {}
        self._ep_next = 0
        self._add_default_profiles()

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

    def create_qp(self, init: QpInitAttr) -> Qp:
        while True:
            qpn = self.rng.randrange(0x100, 1 << 24)
            if qpn not in self.qps:
                break
        qp = Qp(self, qpn, init)
        self.qps[qpn] = qp
        return qp

    def destroy_qp(self, qp: Qp) -> None:
        if self.qps.get(qp.qp_num) is not qp:
            raise LocalProtocolError(errno.EINVAL, "QP does not belong to this NIC")
        del self.qps[qp.qp_num]
        self._active.pop(qp, None)
        qp.timer_at = -1
        self._timer_known = False

    # -- profiles ------------------------------------------------------------------------------------------
    def _add_default_profiles(self) -> None:
        # The values are drawn now (the rng sequence must not depend on whether profile 0 is used), the
        # profile itself is built on first use: a simulated fabric of 100K+ NICs mostly never needs it.
        cfg = self.config
        values = array("H", self.rng.sample(range(*cfg.default_ev_sports), cfg.default_ev_count))
        self._default_ev_values = values
        self.cc_profiles[0] = (
            "uet-1.0-nscc",
            NsccConfig.defaults(
                cfg.link_bps * self.num_ports, cfg.base_rtt_ns, cfg.mtu, trimming=cfg.trimming
            ),
        )

    def has_ev_profile(self, profile_id: int) -> bool:
        return profile_id in self.ev_profiles or (profile_id == 0 and self._default_ev_values is not None)

    def ev_profile(self, profile_id: int) -> EvProfileBinding:
        """The installed EV profile ``profile_id`` (`LocalProtocolError` ENOENT if none); profile 0 is built
        on first use."""
        b = self.ev_profiles.get(profile_id)
        if b is None:
            values = self._default_ev_values
            if profile_id != 0 or values is None:
                raise LocalProtocolError(errno.ENOENT, f"no EV profile {profile_id}")
            b = self.ev_profiles[0] = self._default_profile(values)
        return b

    def _default_profile(self, values: array[int]) -> EvProfileBinding:
        entries = []
        for i, v in enumerate(values):
            ev = v.to_bytes(2, "big") + bytes(30)
            entries.append((ev, 1 + i % self.num_ports, ev_echo32(ev, EVFormatMode.UDP)))
        n = len(values)
        return EvProfileBinding(0, EVFormatMode.UDP, tuple(entries), max(1, n // 8), int(EVENT_MASK_ALLOWED))

    def add_ev_profile(
        self, profile_id: int, profile: EVProfile, ports: Sequence[int] | None = None
    ) -> EvProfileBinding:
        """Install an EV profile. EXP EVs take ``ports`` (one per EV) or round-robin over the ports; GEN EVs
        are drawn with the NIC's rng and spread round-robin, so planes get equal shares."""
        if profile.mode is EVProfileMode.AUTO:
            raise LocalProtocolError(
                errno.EINVAL, "AUTO EV profiles are vendor-managed; the NIC's default profile 0 is one"
            )
        assert profile.fmt is not None
        compact = list(profile.evs or ()) if profile.mode is EVProfileMode.EXP else profile.generate(self.rng)
        if ports is not None and len(ports) != len(compact):
            raise LocalProtocolError(errno.EINVAL, f"ports: {len(ports)} given for {len(compact)} EVs")
        entries = []
        for i, c in enumerate(compact):
            port = ports[i] if ports is not None else 1 + i % self.num_ports
            if not 1 <= port <= self.num_ports:
                raise LocalProtocolError(errno.EINVAL, f"ports[{i}]: port {port} outside 1..{self.num_ports}")
            ev = profile.expand(c)
            entries.append((ev, port, ev_echo32(ev, profile.fmt.mode)))
        b = EvProfileBinding(
            profile_id, profile.fmt.mode, tuple(entries), profile.ev_min_active, profile.event_mask
        )
        self.ev_profiles[profile_id] = b
        return b

    def add_cc_profile(self, profile_id: int, algorithm: str, config: object | None = None) -> None:
        try:  # validates name and config type now
            create_cc(algorithm, mtu=self.config.mtu, config=config)
        except (TypeError, ValueError, KeyError) as exc:  # KeyError: an unknown algorithm name
            raise LocalProtocolError(errno.EINVAL, f"CC profile {profile_id}: {exc}") from None
        self.cc_profiles[profile_id] = (algorithm, config)

    def make_cc(self, profile_id: int, now: int) -> CongestionControl:
        name, cfg = self.cc_profiles[profile_id]
        return create_cc(name, mtu=self.config.mtu, config=cfg, now=now)

    def build_ev_table(self, qp: Qp) -> EvTable:
        b = self.ev_profile(qp.attr.ev_profile_id or 0)
        cfg = self.config

        def emit(ev: EvEvent) -> None:
            if ev.state & b.event_mask:
                if len(self.ev_events) == self.ev_events.maxlen:
                    self.stats.ev_events_dropped += 1
                self.ev_events.append(ev)

        t = EvTable(
            b.entries,
            rng=self.rng,
            min_active=b.min_active,
            active_fraction=cfg.active_ev_fraction,
            reshuffle_rotations=cfg.reshuffle_rotations,
            burst=cfg.spray_burst,
            probe_interval=cfg.probe_interval_ns,
            probes_to_restore=cfg.probes_to_restore,
            emit=emit,
            qp_num=qp.qp_num,
            profile_id=b.profile_id,
        )
        t.set_port_masks(self.local_port_status(), self._port_mask(qp.attr.peer))
        return t

    def poll_ev_events(self, n: int = 64) -> list[EvEvent]:
        out: list[EvEvent] = []
        while self.ev_events and len(out) < n:
            out.append(self.ev_events.popleft())
        return out

    def modify_ev_state(self, qp: Qp, entropy: int, state: EVState, *, now: int) -> None:
        """Controller MODIFY_EV_STATE on one QP's EV (found by its 32-bit echo value)."""
        if state not in (EVState.GOOD, EVState.ASSUMED_BAD, EVState.DENIED):
            raise LocalProtocolError(errno.EINVAL, f"the controller cannot set EV state {state.name}")
        if qp.evs is None or entropy not in qp.evs.by_entropy:
            raise LocalProtocolError(errno.ENOENT, f"QP 0x{qp.qp_num:06x} has no EV 0x{entropy:08x}")
        qp.evs.set_state(qp.evs.by_entropy[entropy], state, now)
        qp.requester.blocked = False
        self.wake(qp)

    # -- ports ---------------------------------------------------------------------------------------------
    def _port_mask(self, peer: Hashable | None) -> int:
        local = sum(1 << (p - 1) for p in range(1, self.num_ports + 1) if self.ports_up[p])
        return local & self.peer_ports.get(peer, (1 << 32) - 1)

    def local_port_status(self) -> int:
        return self._port_mask(None)

    def _refresh_port_masks(self) -> None:
        local = self.local_port_status()
        for qp in self.qps.values():
            if qp.evs is not None:
                qp.evs.set_port_masks(local, self._port_mask(qp.attr.peer))
                qp.requester.blocked = False
                self.wake(qp)

    def peer_port_alive(self, peer: Hashable, port: int) -> None:
        """A probe across ``port``'s plane was answered: ``peer``'s port there is up, whatever its last
        port status update said (the update may have been lost, stale or wrong)."""
        mask = self.peer_ports.get(peer)
        if mask is not None and not (mask >> (port - 1)) & 1:
            self.peer_ports[peer] = mask | 1 << (port - 1)
            self._refresh_port_masks()

    def port_down(self, port: int, *, now: int) -> None:
        """NIC port ``port`` (plane) went down: stop using its EVs and tell every peer."""
        self._set_port(port, False, now)

    def port_up(self, port: int, *, now: int) -> None:
        self._set_port(port, True, now)

    def _set_port(self, port: int, up: bool, now: int) -> None:
        if not 1 <= port <= self.num_ports:
            raise LocalProtocolError(errno.EINVAL, f"port {port} outside 1..{self.num_ports}")
        if self.ports_up[port] == up:
            return
        self.ports_up[port] = up
        self._ports_down = not all(self.ports_up[1:])
        self._refresh_port_masks()
        peers = {qp.attr.peer for qp in self.qps.values() if qp.attr.peer is not None}
        status = self.local_port_status()
        for peer in sorted(peers, key=repr):
            if status:
                self.ep_request(EpOp.PORT_STATUS_UPDATE, peer, now=now, port_status=status)
            else:  # the last port went down: nothing can leave; peers notice by their probes
                self.stats.ep_unsent += 1

    # -- endpoint operations (reserved QP 0x2) -------------------------------------------------------------
    def ep_request(
        self,
        op: EpOp,
        peer: Hashable,
        *,
        now: int,
        port: int = 0,
        ev: bytes | None = None,
        entropy: int = 0,
        port_status: int | None = None,
    ) -> int:
        """Send an EV probe or a port status update to ``peer``; returns the request id (BTH PSN[15:0])."""
        if port == 0:
            port = next((p for p in range(1, self.num_ports + 1) if self.ports_up[p]), 0)
            if port == 0:
                raise LocalProtocolError(errno.ENETDOWN, "no port is up")
        self._ep_next = (self._ep_next + 1) & 0xFFFF
        rid = self._ep_next
        status = self.local_port_status() if port_status is None else port_status
        pkt = Packet(
            BTH(Opcode.EP_REQUEST, dest_qp=RESERVED_QP_ENDPOINT, psn=rid),
            erth=ERTH(op=op, port_status=status, tx_timestamp=(now >> 7) & 0xFFFF),
        )
        self._ep_pending[rid] = (now, op)
        self.stats.ep_requests += 1
        self._ctrl.append(Transmit(port, peer, ev or bytes(32), entropy, pkt, RESERVED_QP_ENDPOINT, 0))
        return rid

    def _on_endpoint(self, pkt: Packet, now: int, port: int, entropy: int, src: Hashable) -> None:
        rid = pkt.bth.psn & 0xFFFF
        if pkt.erth is not None:
            op = pkt.erth.op
            if op == EpOp.PORT_STATUS_UPDATE and src is not None:
                self.peer_ports[src] = pkt.erth.port_status
                self._refresh_port_masks()
            resp = Packet(
                BTH(Opcode.EP_RESPONSE, dest_qp=RESERVED_QP_ENDPOINT, psn=rid),
                eeth=EETH(
                    op=op,
                    service_time=0,
                    port_status=self.local_port_status(),
                    rx_port=port,
                    ts_echo=pkt.erth.tx_timestamp,
                ),
            )
            self.stats.ep_responses += 1
            self._ep_arrivals[id(resp)] = now  # service time is filled in when the response leaves
            self._ctrl.append(Transmit(port, src, bytes(32), entropy, resp, RESERVED_QP_ENDPOINT, 0))
        elif pkt.eeth is not None:
            pending = self._ep_pending.pop(rid, None)
            if pending is None:
                return
            sent, op = pending
            svc = pkt.eeth.service_time
            self.ep_responses.append(
                EpResponse(rid, EpOp(op), port, now - sent - svc, True, svc, pkt.eeth.port_status, src)
            )

    # -- the driver interface ------------------------------------------------------------------------------
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
        pkt = data
        if self._validate:  # validation mode: the packet's bytes, ICRC included, must round-trip
            try:
                cut = bool(trim)
                raw = data.encode(trimmed=cut)
                if not cut and not icrc_ok(raw, _LOOP_ADDR):
                    stats.rx_bad_icrc += 1
                    return
                pkt = parse(raw, trimmed=cut)
            except WireError:
                stats.rx_malformed += 1
                return
        self._deliver(pkt, port, now, ecn, entropy, trim, src)

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
        if not isinstance(addr, Addressing):
            raise LocalProtocolError(errno.EINVAL, f"addr: expected an openmrc.wire.Addressing, got {addr!r}")
        stats = self.stats
        stats.rx_packets += 1
        if not 0 < port <= self.num_ports or not self.ports_up[port]:
            stats.rx_dropped_port += 1
            return
        if not trim:
            view = data if type(data) is memoryview else memoryview(data)
            plain = view.ndim == 1 and view.itemsize == 1  # bytes as they come from a socket
            if not (icrc_view_ok(view, addr) if plain else icrc_ok(view, addr)):
                stats.rx_bad_icrc += 1
                return
            f = plain_data_fields(view) if plain else None
            if f is not None and f[1] != RESERVED_QP_ENDPOINT:  # a plain data packet: no header objects
                qp = self.qps.get(f[1])
                if qp is None:
                    stats.rx_dropped_no_qp += 1
                    return
                entropy = ((flow_label & 0xFFFF) << 16) | addr.sport
                qp.responder.on_fields(
                    f[0], f[2], f[3], f[4], f[5], f[6], f[7], 0, 0, now, port, ecn, entropy, TrimMark.NONE
                )
                self.wake(qp)
                return
        try:
            pkt = parse(data, trimmed=bool(trim))
        except WireError:
            stats.rx_malformed += 1
            return
        if src is None and pkt.bth.dest_qp == RESERVED_QP_ENDPOINT:
            src = socket.inet_ntop(socket.AF_INET if addr.version == 4 else socket.AF_INET6, addr.src)
        self._deliver(pkt, port, now, ecn, ((flow_label & 0xFFFF) << 16) | addr.sport, trim, src)

    def _deliver(
        self, pkt: Packet, port: int, now: int, ecn: bool, entropy: int, trim: TrimMark, src: Hashable
    ) -> None:
        stats = self.stats
        bth = pkt.bth
        op = bth.opcode
        is_data = is_data_opcode(op)
        if trim and not is_data:
            stats.rx_malformed += 1  # control traffic is never trimmed
            return
        if bth.dest_qp == RESERVED_QP_ENDPOINT:
            self._on_endpoint(pkt, now, port, entropy, src)
            return
        qp = self.qps.get(bth.dest_qp)
        if qp is None:
            stats.rx_dropped_no_qp += 1
            return
        if is_data:
            qp.responder.on_data(pkt, now, port, ecn, entropy, trim)
        elif op == OP_SACK:
            qp.requester.on_sack(pkt, now)
        elif op == OP_NACK:
            qp.requester.on_nack(pkt, now)
        elif op == OP_ACK:
            qp.requester.on_aeth(pkt, now)
        elif op == OP_PROBE:
            qp.responder.on_probe(pkt, now, port, ecn, entropy)
        else:
            stats.rx_dropped_state += 1
            return
        self.wake(qp)

    def receive_burst(self, burst: Iterable[Arrival], now: int) -> None:
        """`receive` every ``(data, port, ecn, entropy, trim, src)`` of ``burst`` in order, at ``now``: a
        driver's receive burst (one call per batch, as NIC drivers poll their rings) instead of a call per
        datagram."""
        for data, port, ecn, entropy, trim, src in burst:
            self.receive(data, port, now, ecn, entropy, trim, src)

    def send_control(self, qp: Qp, pkt: Packet, port: int) -> None:
        """Queue a SACK/NACK/ACK of ``qp``: on the plane it answers, on one of the QP's own EVs."""
        evs = qp.evs
        e = None
        if evs is not None:
            e = evs.pick(None, port) or evs.pick()
        if e is None:
            self._ctrl.append(Transmit(port, qp.attr.peer, bytes(32), 0, pkt, qp.qp_num, 0))
        else:
            self._ctrl.append(Transmit(e.port, qp.attr.peer, e.expanded, e.entropy, pkt, qp.qp_num, 0))

    def has_data(self) -> bool:
        """Whether some QP may have data packets to send (a pacing driver polls again when a port frees)."""
        return bool(self._active)

    def wake(self, qp: Qp) -> None:
        """Note that ``qp`` may have packets to send or a new timer deadline."""
        r = qp.requester
        if qp.state is _RTS and (r.unsent or r.retx) and not r.blocked:  # work waiting and not blocked
            self._active[qp] = None
        t = qp.next_timer()
        if t is None:
            if qp.timer_at >= 0:
                qp.timer_at = -1
                self._timer_known = False
        elif qp.timer_at != t:
            qp.timer_at = t
            self._seq = seq = self._seq + 1
            _heappush(self._timers, (t, seq, qp))
            self._timer_known = False

    def datagrams_to_send(self, now: int, max_data: int | None = None) -> list[Transmit]:
        """The packets that may leave now: all control packets first, then each QP's retransmissions and new
        data, at most ``max_data`` data packets (a driver that paces at line rate asks for what its ports
        can take; the rest waits for the next call)."""
        out = self._ctrl
        self._ctrl = []
        if out and self._ports_down:  # queued before their port went down: they cannot leave
            up = self.ports_up
            kept = []
            for t in out:
                if up[t.port]:
                    kept.append(t)
                else:
                    self.stats.tx_dropped_port += 1
                    self._ep_arrivals.pop(id(t.packet), None)
            out = kept
        if self._ep_arrivals:
            for t in out:
                arrived = self._ep_arrivals.pop(id(t.packet), None)
                if arrived is not None and t.packet.eeth is not None:
                    t.packet.eeth.service_time = min(now - arrived, 0xFFFFFFFF)
        if not out and not self._active:
            return out
        if self._active:
            active = self._active
            self._active = {}  # emptied by swapping: wake() below re-adds the QPs still blocked
            budget = 1 << 62 if max_data is None else max_data
            for qp in active:
                r = qp.requester
                if (
                    budget <= 0
                    and not r.blocked
                    and qp.state is _RTS
                    and not qp.evs.bad  # type: ignore[union-attr]
                    and not r.pending_probes
                    and r.plane_probe_at is None
                ):
                    # A pacing driver polls often with no room left. Without bad EVs (no probe can be due)
                    # emit() would change nothing, and nothing else changed since this QP's last wake()
                    # (every state change ends in one), so its timer stands: it only stays in the set.
                    if r.unsent or r.retx:
                        self._active[qp] = None
                    continue
                # Even with no data budget left a QP sends its due probes (tiny, not rate-limited), so
                # that probe deadlines move on; QPs with data left stay in the set.
                budget -= r.emit(now, out, budget)
                self.wake(qp)  # still blocked (window, cwnd, no usable EV) QPs stay in the set
        if out:
            self.stats.tx_packets += len(out)
        if self._validate:  # every packet as its bytes decode, with the ICRC `receive` checks
            for t in out:
                t.packet = parse(seal(t.packet, _LOOP_ADDR))
        return out

    def get_timer(self) -> int | None:
        """The earliest deadline at which `handle_timer` must be called, or None."""
        if self._timer_known:
            return self._next_timer
        timers = self._timers
        t = None
        while timers:
            top, _, qp = timers[0]
            if qp.timer_at == top:
                t = top
                break
            _heappop(timers)
        self._next_timer = t
        self._timer_known = True
        return t

    def handle_timer(self, now: int) -> None:
        timers = self._timers
        self._timer_known = False
        due = []
        while timers and timers[0][0] <= now:
            t, _, qp = _heappop(timers)
            if qp.timer_at == t:
                qp.timer_at = -1
                due.append(qp)
        for qp in due:
            qp.on_timer(now)
            self.wake(qp)
            if qp.requester.pending_probes and qp.state is _RTS:
                self._active[qp] = None  # probes to send
