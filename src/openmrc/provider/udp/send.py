"""The UDP device's sending side: what the NIC has to send, as much as pacing allows, each packet sealed for
the route of its EV (UDP source port, IPv6 flow label or uSID destination, and the ICRC of its final
addressing) and handed to the kernel as a view of the registered memory, consecutive datagrams of one
socket, destination and size as one GSO datagram."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
import struct
from collections.abc import Callable
from typing import Any, Final

from openmrc.provider.udp.config import (
    GSO_MAX_BYTES,
    GSO_MAX_SEGS,
    SOL_UDP,
    UDP_SEGMENT,
    DeviceStats,
    Peer,
)
from openmrc.provider.udp.injector import FaultInjector
from openmrc.provider.udp.sockets import PortSocket, PortSockets
from openmrc.transport.config import NicConfig
from openmrc.transport.nic import Nic
from openmrc.transport.types import LocalProtocolError, SackTransmit, Transmit
from openmrc.wire import (
    RESERVED_QP_ENDPOINT,
    Addressing,
    WireError,
    seal_header_parts,
    seal_into,
    seal_parts,
    usid_final_address,
)

_HEADER_BYTES: Final = 100  # IP + UDP + MRC headers of a data packet, for pacing
_ICRC_SIZE: Final = 4
_EMPTY: Final = memoryview(b"")

# (socket, destination sockaddr, ICRC addressing, the peer) for one (port, entropy, peer, SRv6 destination)
Route = tuple[socket.socket, tuple[Any, ...], Addressing, object]


class _Lane:
    """A port as the sender uses it: its socket, and when its link is free again (pacing)."""

    __slots__ = ("free_at", "port")

    def __init__(self, port: PortSocket) -> None:
        self.port = port
        self.free_at = 0


class Sender:
    """Sends what ``nic`` has to send from the ports of ``sockets``, counted in ``stats``; datagrams of a
    port ``injector`` impairs go through it. ``config``: the MTU, the port rate and the spray burst;
    ``pace``: no faster than the port rate; ``gso``: UDP segmentation offload where packets allow;
    ``clock``: the device's clock, read when a SACK that reports its service time leaves."""

    def __init__(
        self,
        *,
        nic: Nic,
        stats: DeviceStats,
        sockets: PortSockets,
        injector: FaultInjector,
        config: NicConfig,
        pace: bool,
        gso: bool,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._nic = nic
        self._clock = clock
        self._stats = stats
        self._sockets = sockets
        self._no_gso = sockets.no_gso
        self._injector = injector
        self._faults = injector.faults
        self._config = config
        self.pace = pace
        self.gso = gso
        self._lanes = [_Lane(p) for p in sockets.ports]
        self.routes: dict[tuple[int, int, int, bytes], Route] = {}
        """Each (port, entropy, peer's id, uSID destination)'s route, made on first use."""
        self.srv6_qps: set[int] = set()
        """The QPs whose EVs are uSID destinations."""
        self._gso_cmsg: dict[int, list[tuple[int, int, bytes]]] = {}  # the UDP_SEGMENT message per size

    def next_free(self) -> int:
        """When the first port's link is free again (pacing)."""
        return min(lane.free_at for lane in self._lanes)

    def _budget(self, now: int) -> int | None:
        if not self.pace:
            return None
        config = self._config
        ns = (config.mtu + _HEADER_BYTES) * 8 * 1_000_000_000 // config.link_bps
        horizon = max(8, config.spray_burst) * ns  # a burst of up to 8 packets (or a GSO burst) per port
        room = 0
        for lane in self._lanes:
            free = lane.free_at if lane.free_at > now else now  # an idle port does not save up a burst
            ahead = now + horizon - free
            if ahead > 0:
                room += ahead // ns + 1
        return room

    def send(self, now: int) -> int:
        """Send what the NIC has to send at ``now`` and pacing allows; how many packets."""
        out = self._nic.datagrams_to_send(now, self._budget(now))
        if not out:
            return 0
        link = self._config.link_bps
        faults = self._faults
        routes, srv6_qps = self.routes, self.srv6_qps
        lanes = self._lanes
        lane = lanes[0]
        r: Route | None = None
        last_ev: bytes | None = None  # a burst's packets share one EV (the same bytes object) and route
        last_port = last_qp = -1
        last_peer: object = None
        # The run of datagrams being gathered into one GSO send: one socket, destination and size.
        run: list[bytes | memoryview] = []
        run_sock: socket.socket | None = None
        run_dest: tuple[Any, ...] = ()
        run_size = run_count = run_limit = 0
        left_at = -1  # when these packets leave (read once, for the first SACK that reports its service time)
        for t in out:
            if (
                r is None
                or t.ev is not last_ev
                or t.port != last_port
                or t.peer is not last_peer
                or t.qp_num != last_qp
            ):
                lane = lanes[t.port - 1]
                peer = t.peer
                srv6 = bool(srv6_qps) and t.qp_num in srv6_qps
                key = (t.port, t.entropy, id(peer), t.ev[:16] if srv6 else b"")
                r = routes.get(key)
                if r is None or r[3] is not peer:
                    r = self._route(t, lane.port, key, srv6)
                last_ev, last_port, last_peer, last_qp = t.ev, t.port, peer, t.qp_num
            sock, dest, addr = r[0], r[1], r[2]
            alone = False
            tpl = t.tpl
            parts: list[bytes | memoryview] | None = None
            payload = t.payload
            body = t.body
            if body is not None:  # sealed by an authenticated QP: its bytes as they are, and the ICRC
                hdr = body
                payload = _EMPTY
                size = len(body) + _ICRC_SIZE
            elif tpl is not None:  # a data packet: its headers from the Write's template, one struct.pack
                n = t.size
                hdr = tpl.header(t.op, t.ack_req, t.rtx, t.psn, t.va, n)
                size = len(hdr) + n + (-n & 3) + _ICRC_SIZE
            else:
                if type(t) is SackTransmit and t.arrived > 0:
                    if left_at < 0:
                        left_at = self._clock() if self._clock is not None else now
                    t.stamp_service(left_at)
                elif t.qp_num == RESERVED_QP_ENDPOINT and self._clock is not None:
                    # A probe or its answer leaves alone, at the time read just before: after its route (a
                    # new EV opens a socket) and what was gathered before it (whose send may hand the GIL
                    # to the far end's thread, in this process), none of it part of the round trip.
                    if run_count:
                        self._send_run(run_sock, run_dest, run, run_size, run_count)
                        run = []
                        run_count = 0
                    alone = True
                    with contextlib.suppress(WireError):  # (raised again below, and counted)
                        seal_parts(t.packet, addr)  # once before its time is read: a first encoding is slow
                    self._nic.endpoint.sent(t.packet, now, self._clock())
                try:
                    parts = seal_parts(t.packet, addr)
                except WireError:  # the core never emits one; counted, never raised into a progress thread
                    self._stats.tx_errors += 1
                    continue
                size = 0
                for x in parts:
                    size += len(x)
            if t.size:
                start = lane.free_at if lane.free_at > now else now
                lane.free_at = start + (size + _HEADER_BYTES) * 8 * 1_000_000_000 // link
            if faults and t.port in faults and faults[t.port].active:
                copies = self._injector.fates_of(faults[t.port], t, now)
                if not copies:
                    continue  # lost (a GSO run's datagrams are separate: the run goes on without it)
                if len(copies) > 1 or not copies[0].plain:
                    if run_count:
                        self._send_run(run_sock, run_dest, run, run_size, run_count)
                        run = []
                        run_count = 0
                    if parts is None:
                        parts = seal_header_parts(hdr, payload, addr)
                    self._injector.deliver(copies, sock, dest, parts, now)
                    continue
                # one copy, as it was sent: batched like any other packet
            if run_count and (
                sock is not run_sock or dest is not run_dest or size != run_size or run_count >= run_limit
            ):
                self._send_run(run_sock, run_dest, run, run_size, run_count)
                run = []
                run_count = 0
            if not run_count:
                run_sock, run_dest, run_size = sock, dest, size
                run_limit = (
                    min(GSO_MAX_SEGS, max(1, GSO_MAX_BYTES // size))
                    if self.gso and sock not in self._no_gso
                    else 1
                )
            if parts is None:
                seal_into(run, hdr, payload, addr)
            else:
                run += parts
            run_count += 1
            if alone:
                self._send_run(run_sock, run_dest, run, run_size, run_count)
                run = []
                run_count = 0
        if run_count:
            self._send_run(run_sock, run_dest, run, run_size, run_count)
        return len(out)

    def _route(self, t: Transmit, port: PortSocket, key: tuple[int, int, int, bytes], srv6: bool) -> Route:
        """The route of ``t``, made and cached under ``key`` (`send` looks it up first, keyed by the peer
        object's identity, which the route holds so that a new object at the same address is not taken for
        it)."""
        peer = t.peer
        if isinstance(peer, Peer):
            ip, dport = peer.endpoint(t.port)
        elif isinstance(peer, str):  # an endpoint request from an address no QP knows: answer it there
            ip, dport = peer, port.udp_port
        else:
            raise LocalProtocolError(errno.EDESTADDRREQ, f"a packet for {peer!r}, which is not a Peer")
        sport = t.entropy & 0xFFFF
        sock = self._sockets.tx_socket(port, sport, srv6)
        if sock is None:
            self._stats.tx_unbound += 1
            sock, sport = port.sock, port.udp_port
        # the ICRC covers the final destination: for a uSID address, where its last shift leaves it
        addr = Addressing(port.ip, usid_final_address(t.ev) if srv6 else ip, sport, dport)
        dst_ip = str(ipaddress.IPv6Address(t.ev[:16])) if srv6 else ip
        dest: tuple[Any, ...] = (
            (dst_ip, dport, (t.entropy >> 16) & 0xFFFF, 0) if port.family == socket.AF_INET6 else (ip, dport)
        )
        if len(self.routes) > 1 << 16:
            self.routes.clear()
        r = self.routes[key] = (sock, dest, addr, peer)
        return r

    def _send_run(
        self,
        sock: socket.socket | None,
        dest: tuple[Any, ...],
        parts: list[bytes | memoryview],
        size: int,
        count: int,
    ) -> None:
        """Send ``count`` datagrams of ``size`` bytes each, whose scatter/gather ``parts`` follow one another
        in ``parts``: one GSO super-datagram when there are several, else one plain send."""
        assert sock is not None
        stats = self._stats
        try:
            if count > 1:
                seg = self._gso_cmsg.get(size)
                if seg is None:
                    seg = self._gso_cmsg[size] = [(SOL_UDP, UDP_SEGMENT, struct.pack("H", size))]
                sock.sendmsg(parts, seg, 0, dest)
                stats.tx_gso_batches += 1
            else:
                sock.sendmsg(parts, (), 0, dest)
            stats.tx_datagrams += count
            stats.tx_bytes += size * count
        except OSError as exc:
            if count > 1 and exc.errno in (errno.EIO, errno.EINVAL):
                if exc.errno == errno.EIO:  # no checksum offload: no GSO on this host
                    self.gso = False
                else:  # this socket cannot segment
                    self._no_gso.add(sock)
                for one in _split_datagrams(parts, size):  # one by one, then
                    self._send_run(sock, dest, one, size, 1)
                return
            stats.tx_errors += count

    def clear(self) -> None:
        """Forget every route (their sockets are closing)."""
        self.routes.clear()


def _split_datagrams(parts: list[bytes | memoryview], size: int) -> list[list[bytes | memoryview]]:
    """Scatter/gather ``parts`` of consecutive datagrams of ``size`` bytes each, one list per datagram
    (every datagram's parts end on a datagram boundary)."""
    out: list[list[bytes | memoryview]] = []
    cur: list[bytes | memoryview] = []
    have = 0
    for x in parts:
        cur.append(x)
        have += len(x)
        if have >= size:
            out.append(cur)
            cur = []
            have = 0
    return out
