"""The NIC's ports and endpoint operations: which planes are up here and at each peer, EV probes and port
status updates on the reserved endpoint QP (0x2).

`Endpoint` keeps the local port states and the port status each peer last reported (or that a probe
answer proved), answers endpoint requests (EP_REQUEST -> EP_RESPONSE with the service time it took, the
local port status and the port it arrived on), and matches the answers to its own requests
(`EpResponse`: the RTT with the responder's service time taken out). It reaches the NIC through two
callbacks: ``send`` queues a control packet, ``ports_changed`` makes every QP re-read its usable ports.

Both times are taken where the packets leave, not where they are made: a request's RTT runs from when it
left to when its answer arrived, an answer's service time from when the request arrived to when the answer
left. A request made at ``now`` waits for the driver to ask what to send (`leaving`, at a later ``now``),
and a driver that does more before the bytes go out (opens the socket of a new EV, waits for a thread)
says when they did (`sent`): neither wait is part of the path.
"""

from __future__ import annotations

import errno
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from openmrc.transport.stats import NicStats
from openmrc.transport.types import LocalProtocolError, Transmit
from openmrc.wire import BTH, EETH, ERTH, RESERVED_QP_ENDPOINT, EpOp, Opcode, Packet

__all__ = ["ALL_PORTS", "Endpoint", "EpResponse"]

ALL_PORTS = (1 << 32) - 1
"""The port status assumed of a peer that has sent none: every port up."""


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


class Endpoint:
    """Port states and endpoint operations of a NIC with ``num_ports`` ports (1-based, as in verbs)."""

    def __init__(
        self,
        num_ports: int,
        stats: NicStats,
        send: Callable[[Transmit], None],
        ports_changed: Callable[[], None],
    ) -> None:
        self.num_ports = num_ports
        self.stats = stats
        self._send = send
        self._ports_changed = ports_changed
        self.ports_up = [False] + [True] * num_ports  # index 0 unused: ports are 1-based
        self.any_down = False
        self.peer_ports: dict[Hashable, int] = {}
        self._responses: deque[EpResponse] | None = None  # made at the first response (see responses)
        self._pending: dict[int, tuple[int, EpOp]] = {}  # request id -> (sent at, op)
        self._unsent: dict[int, int] = {}  # id(request packet) -> its id, until it leaves (`leaving`)
        self._arrivals: dict[int, int] = {}  # id(response packet) -> when its request arrived
        self._next = 0

    # -- port states ---------------------------------------------------------------------------------------
    @property
    def responses(self) -> deque[EpResponse]:
        """Answers to this NIC's endpoint requests, oldest first (made at first use: an empty deque is
        most of a kilobyte, and most NICs of a simulated fabric never send a request)."""
        q = self._responses
        if q is None:
            q = self._responses = deque()
        return q

    def port_mask(self, peer: Hashable | None) -> int:
        """The ports usable towards ``peer``: up here and, by its last word, there (None: here only)."""
        up = self.ports_up
        local = sum(1 << (p - 1) for p in range(1, self.num_ports + 1) if up[p])
        return local & self.peer_ports.get(peer, ALL_PORTS)

    def local_status(self) -> int:
        """The local port status bitmap (bit ``p - 1``: port ``p`` is up)."""
        return self.port_mask(None)

    def set_port(self, port: int, up: bool, now: int, peers: Iterable[Hashable]) -> None:
        """Port ``port`` went up or down: every QP re-reads its ports and each of ``peers`` is told."""
        if not 1 <= port <= self.num_ports:
            raise LocalProtocolError(errno.EINVAL, f"port {port} outside 1..{self.num_ports}")
        if self.ports_up[port] == up:
            return
        self.ports_up[port] = up
        self.any_down = not all(self.ports_up[1:])
        self._ports_changed()
        status = self.local_status()
        for peer in sorted(set(peers), key=repr):
            if status:
                self.request(EpOp.PORT_STATUS_UPDATE, peer, now=now, port_status=status)
            else:  # the last port went down: nothing can leave; peers notice by their probes
                self.stats.ep_unsent += 1

    def peer_alive(self, peer: Hashable, port: int) -> None:
        """A probe across ``port``'s plane was answered: ``peer``'s port there is up, whatever its last
        port status update said (the update may have been lost, stale or wrong)."""
        mask = self.peer_ports.get(peer)
        if mask is not None and not (mask >> (port - 1)) & 1:
            self.peer_ports[peer] = mask | 1 << (port - 1)
            self._ports_changed()

    # -- endpoint operations -------------------------------------------------------------------------------
    def request(
        self,
        op: EpOp,
        peer: Hashable,
        *,
        now: int,
        port: int = 0,
        ev: bytes | None = None,
        entropy: int = 0,
        port_status: int | None = None,
        rid: int | None = None,
    ) -> int:
        """Send an EV probe or a port status update to ``peer`` (on ``port``, by default the first port up,
        on EV ``ev`` whose echo value is ``entropy``); returns the request id (BTH PSN[15:0]): ``rid`` if
        given (the caller keeps ids unique among its outstanding requests), else the next of the NIC's."""
        if port == 0:
            port = next((p for p in range(1, self.num_ports + 1) if self.ports_up[p]), 0)
            if port == 0:
                raise LocalProtocolError(errno.ENETDOWN, "no port is up")
        if rid is None:
            self._next = (self._next + 1) & 0xFFFF
            rid = self._next
        elif not 0 <= rid <= 0xFFFF:
            raise LocalProtocolError(errno.EINVAL, f"request id {rid} outside 0..65535")
        status = self.local_status() if port_status is None else port_status
        pkt = Packet(
            BTH(Opcode.EP_REQUEST, dest_qp=RESERVED_QP_ENDPOINT, psn=rid),
            erth=ERTH(op=op, port_status=status, tx_timestamp=(now >> 7) & 0xFFFF),
        )
        self._pending[rid] = (now, op)
        self._unsent[id(pkt)] = rid
        self.stats.ep_requests += 1
        self._send(Transmit(port, peer, ev or bytes(32), entropy, pkt, RESERVED_QP_ENDPOINT, 0))
        return rid

    def on_packet(self, pkt: Packet, now: int, port: int, entropy: int, src: Hashable) -> None:
        """An endpoint request (answered on the port and EV it came by) or the answer to one of ours (an
        answer that matches no request of ours is ignored)."""
        rid = pkt.bth.psn & 0xFFFF
        if pkt.erth is not None:
            op = pkt.erth.op
            if op == EpOp.PORT_STATUS_UPDATE and src is not None:
                self.peer_ports[src] = pkt.erth.port_status
                self._ports_changed()
            resp = Packet(
                BTH(Opcode.EP_RESPONSE, dest_qp=RESERVED_QP_ENDPOINT, psn=rid),
                eeth=EETH(
                    op=op,
                    service_time=0,
                    port_status=self.local_status(),
                    rx_port=port,
                    ts_echo=pkt.erth.tx_timestamp,
                ),
            )
            self.stats.ep_responses += 1
            self._arrivals[id(resp)] = now  # service time is filled in when the response leaves
            self._send(Transmit(port, src, bytes(32), entropy, resp, RESERVED_QP_ENDPOINT, 0))
        elif pkt.eeth is not None:
            pending = self._pending.pop(rid, None)
            if pending is None:
                return
            sent, op = pending
            svc = pkt.eeth.service_time
            self.responses.append(
                EpResponse(rid, EpOp(op), port, now - sent - svc, True, svc, pkt.eeth.port_status, src)
            )

    def leaving(self, out: list[Transmit], now: int) -> list[Transmit]:
        """The control packets of ``out`` that can leave now: those for a port that went down since they
        were queued are dropped (and counted), endpoint requests are sent at ``now`` (their RTT runs from
        then), endpoint responses get their service time."""
        arrivals, unsent = self._arrivals, self._unsent
        if self.any_down:
            up = self.ports_up
            kept = []
            for t in out:
                if up[t.port]:
                    kept.append(t)
                else:
                    self.stats.tx_dropped_port += 1
                    if t.has_packet():  # (an endpoint packet has one; a SACK by its fields is none)
                        arrivals.pop(id(t.packet), None)
                        unsent.pop(id(t.packet), None)
            out = kept
        if arrivals or unsent:
            for t in out:
                if not t.has_packet():
                    continue
                pkt = t.packet
                arrived = arrivals.pop(id(pkt), None)
                if arrived is not None and pkt.eeth is not None:
                    pkt.eeth.service_time = min(now - arrived, 0xFFFFFFFF)
                rid = unsent.pop(id(pkt), None)
                if rid is not None and pkt.erth is not None:
                    pending = self._pending.get(rid)
                    if pending is not None:
                        self._pending[rid] = (now, pending[1])
                        pkt.erth.tx_timestamp = (now >> 7) & 0xFFFF
        return out

    def sent(self, pkt: Packet, now: int, at: int) -> None:
        """``pkt``, an endpoint packet `leaving` let out at ``now``, went on the wire at ``at`` (a driver's
        clock, read as it sends; its bytes not made yet): a request's RTT runs from ``at``, an answer's
        service time until ``at``."""
        if at <= now:
            return
        if pkt.eeth is not None:
            pkt.eeth.service_time = min(pkt.eeth.service_time + at - now, 0xFFFFFFFF)
        elif pkt.erth is not None:
            rid = pkt.bth.psn & 0xFFFF
            pending = self._pending.get(rid)
            if pending is not None and pending[0] == now:  # (this request's, not a later one's with its id)
                self._pending[rid] = (at, pending[1])
                pkt.erth.tx_timestamp = (at >> 7) & 0xFFFF
