"""A software MRC NIC over UDP: N ports (planes), one UDP socket per port, the same `transport.Nic` inside.

Theory of operation
-------------------
A `UdpDevice` drives one sans-IO `Nic` by the driver contract of `openmrc.provider`. Port ``p`` is a UDP
socket bound to its own endpoint (an IPv4 or IPv6 address and the UDP port MRC listens on, 4791 by
default): on one machine e.g. ``127.0.0.1``, ``127.0.0.2`` ... or one UDP port per plane on ``::1``; on
real hosts one interface address per plane. A `Peer` names the remote device's endpoint on every port;
packets of plane ``p`` go from the local port ``p`` to the peer's port ``p``.

*Wire image.* Every packet leaves as the MRC UDP payload (BTH through ICRC) with the real RoCEv2 ICRC for
its addressing (source and destination address and UDP ports, `openmrc.wire.seal_parts`); the payload is
handed to the kernel as a view of the registered memory (scatter/gather ``sendmsg``), never copied. On
receipt the ICRC is checked against the addresses the socket reports (`Nic.receive_datagram`); a mismatch
is dropped and counted (``nic.stats.rx_bad_icrc``). Packets are sent ECN-capable (ECT(0)); the CE mark and
the DSCP arrive with every datagram (``IP_RECVTOS`` / ``IPV6_RECVTCLASS``).

*Entropy values on the wire.* The EV a packet takes is the source of its addressing, by the QP's EV profile:

* UDP mode: the EV is the UDP source port. A socket sends from one port only, so the device keeps one
  sending socket per (plane, source port), bound when a QP is connected (`UdpDevice.connect` says at
  once when a port cannot be bound). Its default EV profile draws source ports from the dynamic range
  49152-65535.
* STEV: the source port as above, and the high 16 bits of the EV in the IPv6 flow label (the destination
  address in ``sendmsg`` carries it, with ``IPV6_FLOWINFO_SEND`` on and the kernel's automatic flow labels
  off). IPv4 ports cannot carry it: connecting such a QP fails with a reason.
* SRv6: the datagram is sent to the EV's uSID address; the fabric shifts it hop by hop and the last hop
  delivers it to the peer's port address. **[openmrc]** Plain UDP, not IPv6-in-IPv6: an unprivileged
  socket can send it and the receiver needs no decapsulation. The kernel would compute the UDP checksum
  over the first (uSID) address and the receiver check it over the final one, so SRv6 sockets send with
  a zero checksum (``UDP_NO_CHECK6_TX``) and every IPv6 port accepts zero checksums
  (``UDP_NO_CHECK6_RX``); end-to-end integrity is the ICRC's job, computed over the final address
  (RFC 6935/6936 allow zero-checksum UDP over IPv6 where the payload is protected otherwise). A raw socket
  would keep the checksum but needs root. EVs with an SRH segment need a raw socket and are refused.

*Trimming and ECN in tests.* A fabric that trims marks the packet with a DSCP; **[openmrc]** DSCP 0x05
(trimmed) and 0x06 (trimmed at the last hop), configurable. The in-process fault injector (`impair`, per
port: drop, duplicate, reorder, trim, ECN-mark, corrupt, blackhole an EV or a whole port for a time) uses
the same marks, so tests and demos need no root.

*Progress.* Manual by default (as libfabric's ``FI_PROGRESS_MANUAL``): `progress` runs one round (receive
every queued datagram, run due timers, send what pacing allows) and optionally waits for the next event;
`poll_cq` progresses before it polls. `start` runs the rounds in a background thread instead.
`completion_fd` becomes readable when a CQ of the device holds completions (for ``select`` or asyncio's
``add_reader``; `wait_completions` does that). `close` stops the thread, moves every QP to ERROR (pending
work requests complete with ``WR_FLUSH_ERR``) and closes every socket and descriptor.

*Fast path.* Socket buffers as large as the host allows (``SO_RCVBUFFORCE`` as root), receives into one
preallocated buffer, UDP GRO on receive (a burst of datagrams from one source arrives as one) and UDP GSO
on send when consecutive packets share socket, destination and size. Sends are paced to the port rate
(``NicConfig.link_bps`` per port). **[openmrc]** A kernel call costs a software NIC far more than a
packet's worth of work, and packets of different EVs leave from different sockets, so no two of them can
share a call: the device's default configuration (`software_config`, with timers for a user-space
stack's RTT) sprays new data in bursts of `gso_burst` packets per EV (``NicConfig.spray_burst``; 15 at a
4 KiB MTU), which leave as one GSO datagram and arrive as one GRO batch. Every EV of the rotation still
carries its share, retransmissions and probes still take a fresh EV, and ``spray_burst=1`` sprays every
packet on its own EV as a hardware NIC does (one call per packet).
This module is compiled with the transport core (``make native``).

Everything the device does is counted in `DeviceStats`; the transport's own counters are ``nic.stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import heapq
import ipaddress
import os
import random
import select
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final

from openmrc.ev import EVFormatMode, EVProfile
from openmrc.provider.bringup import connect_qp
from openmrc.provider.faults import Impairments, fates, flip_bit
from openmrc.provider.profile_store import ProfileStore, StoreResolver
from openmrc.transport.config import NicConfig
from openmrc.transport.cq import CompletionQueue
from openmrc.transport.mr import MemoryRegion
from openmrc.transport.nic import Nic
from openmrc.transport.qp import Qp, QpInitAttr
from openmrc.transport.types import (
    Access,
    LocalProtocolError,
    QpState,
    RecvWR,
    SendWR,
    Transmit,
    TrimMark,
    WorkCompletion,
)
from openmrc.wire import (
    MRC_UDP_PORT,
    Addressing,
    WireError,
    seal_header_parts,
    seal_into,
    seal_parts,
    trim_datagram,
    usid_final_address,
)
from openmrc.wire.constants import is_data_opcode

__all__ = [
    "DEFAULT_TIMEOUT",
    "SOFTWARE_MIN_ACK_TIMEOUT_NS",
    "DeviceStats",
    "Peer",
    "UdpDevice",
    "gso_burst",
    "parse_endpoint",
    "software_config",
]

# Linux socket options the socket module does not name
SO_SNDBUFFORCE: Final = 32
SO_RCVBUFFORCE: Final = 33
IPV6_FLOWINFO: Final = 11
IPV6_FLOWINFO_SEND: Final = 33
IPV6_AUTOFLOWLABEL: Final = 70
UDP_NO_CHECK6_TX: Final = 101
UDP_NO_CHECK6_RX: Final = 102
UDP_SEGMENT: Final = 103
UDP_GRO: Final = 104
SOL_UDP: Final = 17
SO_TIMESTAMPNS: Final = 35  # SCM_TIMESTAMPNS: the kernel's receive time, a struct timespec (realtime)
SO_RXQ_OVFL: Final = 40  # datagrams the kernel dropped from this socket's full buffer so far (uint32)
_SOL_SOCKET: Final = int(socket.SOL_SOCKET)

ECT0: Final = 0x02
CE: Final = 0x03
TRIM_DSCP: Final = 0x05
TRIM_LASTHOP_DSCP: Final = 0x06
_FLOW_MASK: Final = 0xFFFFF
_MSG_TRUNC: Final = int(socket.MSG_TRUNC)  # a plain int: an IntFlag operation per datagram is a Python call
_AF_INET6: Final = int(socket.AF_INET6)
_GSO_MAX_BYTES: Final = 65000  # one UDP datagram before segmentation (IP length limit, headers aside)
_GSO_MAX_SEGS: Final = 64
_RX_BUDGET: Final = 1024  # datagrams (or GRO batches) per port per round
_RX_TURN: Final = 4  # taken from one port before the next port's turn
_HEADER_BYTES: Final = 100  # IP + UDP + MRC headers of a data packet, for pacing
_ICRC_SIZE: Final = 4
_MRC_OVERHEAD: Final = 64  # MRC headers and ICRC of a data packet (at most), past its payload
_INT: Final = struct.Struct("i")
_UINT: Final = struct.Struct("I")
_TIMESPEC: Final = struct.Struct("qq")
_STORE_POLL_NS: Final = 50_000_000  # how often a device using a profile store looks at it

Endpoint = tuple[str, int]


def gso_burst(mtu: int) -> int:
    """How many ``mtu``-byte MRC packets fit in one UDP segmentation-offload datagram: the
    `NicConfig.spray_burst` that lets a software NIC send a burst on one EV with one system call."""
    return max(1, min(_GSO_MAX_SEGS, _GSO_MAX_BYTES // (mtu + _MRC_OVERHEAD)))


SOFTWARE_MIN_ACK_TIMEOUT_NS: Final = 1024 << 13
"""The floor of a software NIC's retransmission timeout (8.39 ms: ``timeout`` 13)."""
DEFAULT_TIMEOUT: Final = 14
"""`UdpDevice.connect`'s ACK timeout exponent: 16.8 ms, and with the default retries (7 linear, 7
exponential) a peer that answers nothing fails the QP with RETRY_EXC_ERR after 4.4 s."""


def software_config(link_gbps: float = 25.0, *, mtu: int = 4096) -> NicConfig:
    """Transport settings for a software NIC (the device's default): ``link_gbps`` per port; timers for the
    RTT of a user-space stack (a base RTT of 200 µs, SACKs coalesced over 32 packets or 20 µs), a
    reordering allowance of 128 packets (sockets are drained in turns, so sprayed packets arrive less in
    order than through a NIC's ring), spray bursts of `gso_burst` packets and EVs from the dynamic UDP port
    range. A process is descheduled for milliseconds, so a packet thought lost holds its EV until the loss
    is judged (it is mostly late: `NicConfig.late_host`), the retransmission timeout is at least
    ``SOFTWARE_MIN_ACK_TIMEOUT_NS`` (8.39 ms, the QP attribute ``timeout`` 13, whatever lower value a QP
    asks for), and a path that stays down is probed at least every 20 ms once its probes go unanswered
    (a failed path comes back within that, a dead one costs 50 probes a second)."""
    return NicConfig(
        mtu=mtu,
        link_bps=int(link_gbps * 1e9),
        base_rtt_ns=200_000,
        sack_delay_ns=20_000,
        sack_every=32,
        reorder_allowance=128,
        default_ev_sports=(0xC000, 0x10000),
        spray_burst=gso_burst(mtu),
        max_send_wr=8192,
        max_recv_wr=8192,
        min_ack_timeout_ns=SOFTWARE_MIN_ACK_TIMEOUT_NS,
        probe_backoff_max_ns=20_000_000,
        late_host=True,
    )


def parse_endpoint(text: str | Endpoint, default_port: int = MRC_UDP_PORT) -> Endpoint:
    """``"10.0.0.1"``, ``"10.0.0.1:4791"``, ``"::1"``, ``"[::1]:4791"`` or ``(ip, port)`` as ``(ip, port)``;
    raises `ValueError` naming what is wrong."""
    if isinstance(text, tuple):
        ip, port = text
    else:
        s = text.strip()
        port = default_port
        if s.startswith("["):
            ip, _, rest = s[1:].partition("]")
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(f"endpoint {text!r}: expected [address]:port")
                port = _port_number(rest[1:], text)
        elif s.count(":") == 1:
            ip, _, p = s.partition(":")
            port = _port_number(p, text)
        else:
            ip = s
    try:
        ip = str(ipaddress.ip_address(ip))
    except ValueError:
        raise ValueError(f"endpoint {text!r}: {ip!r} is not an IPv4 or IPv6 address") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 0xFFFF:
        raise ValueError(f"endpoint {text!r}: UDP port {port!r} outside 1..65535")
    return ip, port


def _port_number(p: str, text: object) -> int:
    try:
        return int(p)
    except ValueError:
        raise ValueError(f"endpoint {text!r}: UDP port {p!r} is not a number") from None


@dataclass(frozen=True, slots=True)
class Peer:
    """A remote device: its endpoint (address, UDP port) on every port (plane), port 1 first."""

    endpoints: tuple[Endpoint, ...]

    @classmethod
    def of(cls, endpoints: Iterable[str | Endpoint], dport: int = MRC_UDP_PORT) -> Peer:
        eps = tuple(parse_endpoint(e, dport) for e in endpoints)
        if not eps:
            raise ValueError("a peer needs at least one endpoint")
        return cls(eps)

    def endpoint(self, port: int) -> Endpoint:
        return self.endpoints[port - 1]

    def __str__(self) -> str:
        return " ".join(f"[{ip}]:{p}" if ":" in ip else f"{ip}:{p}" for ip, p in self.endpoints)


@dataclass(slots=True)
class DeviceStats:
    """What the device did with datagrams (the transport's own counters are ``nic.stats``).

    ``rx_truncated``: datagrams larger than the receive buffer (dropped); ``tx_errors``: sends the kernel
    refused (socket buffer full, no route ...; the packet is lost and the transport recovers it);
    ``tx_unbound``: packets whose source port had no socket (sent from the port's own socket instead, so
    the peer echoes a different EV); ``fault_*``: what the fault injector did."""

    rx_datagrams: int = 0
    rx_gro_batches: int = 0
    rx_truncated: int = 0
    rx_errors: int = 0
    rx_overflow: int = 0
    """Datagrams the kernel dropped because a port's socket buffer was full (``SO_RXQ_OVFL``): real losses
    in this host, which the transport recovers like any other."""
    rx_delay_max_ns: int = 0
    """The longest a datagram waited in a socket buffer before the device read it (kernel receive
    timestamp to read): how late this host was."""
    tx_datagrams: int = 0
    tx_gso_batches: int = 0
    tx_errors: int = 0
    tx_unbound: int = 0
    tx_bytes: int = 0
    rounds: int = 0
    fault_dropped: int = 0
    fault_duplicated: int = 0
    fault_trimmed: int = 0
    fault_corrupted: int = 0
    fault_ecn: int = 0
    fault_delayed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _Port:
    __slots__ = ("family", "free_at", "index", "ip", "overflow", "packed", "sock", "udp_port")

    def __init__(self, index: int, ep: Endpoint, sock: socket.socket) -> None:
        self.index = index
        self.ip, self.udp_port = ep
        self.packed = ipaddress.ip_address(self.ip).packed
        self.family = socket.AF_INET6 if len(self.packed) == 16 else socket.AF_INET
        self.sock = sock
        self.free_at = 0
        self.overflow = 0  # the kernel's drop count the socket last reported (SO_RXQ_OVFL)


# (socket, destination sockaddr, ICRC addressing, the peer) for one (port, entropy, peer, SRv6 destination)
_Route = tuple[socket.socket, tuple[Any, ...], Addressing, object]
# a datagram ready to go: (socket, destination, scatter/gather parts, bytes)
# a datagram the fault injector delays: (release time, sequence, socket, data, (destination, TOS cmsg))
_Held = tuple[
    int, int, socket.socket, list[bytes | memoryview], tuple[tuple[Any, ...], tuple[int, int, bytes]]
]


class UdpDevice:
    """A software MRC NIC with one UDP socket per port. ``endpoints``: one per port (plane), as
    `parse_endpoint` reads them (``dport`` is the UDP port of those that name none).

    ``config``: the transport's knobs (``link_bps`` is one port's rate; the default EV profile draws its
    source ports from the dynamic range); ``seed``: the NIC's random choices (QPNs, keys, EVs; None:
    from the OS); ``pace``: send no faster than the port rate; ``gso``/``gro``: use UDP segmentation
    offload where packets allow; ``sockbuf``: socket buffer bytes asked for; ``srv6_addresses``: per port,
    the address uSID paths to it end at when that is not the port's own (a host-port uSID address, see
    `openmrc.fabric.linux`): the port receives there too."""

    def __init__(
        self,
        endpoints: Sequence[str | Endpoint],
        *,
        dport: int = MRC_UDP_PORT,
        config: NicConfig | None = None,
        seed: int | None = None,
        pace: bool = True,
        gso: bool = True,
        gro: bool = True,
        sockbuf: int = 16 << 20,
        srv6_addresses: Sequence[str | None] | None = None,
        trim_dscp: int = TRIM_DSCP,
        trim_lasthop_dscp: int = TRIM_LASTHOP_DSCP,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        eps = [parse_endpoint(e, dport) for e in endpoints]
        if not 1 <= len(eps) <= 32:
            raise LocalProtocolError(errno.EINVAL, f"endpoints: {len(eps)} given, a device has 1..32 ports")
        if len(set(eps)) != len(eps):
            raise LocalProtocolError(errno.EINVAL, f"endpoints: the same endpoint twice in {eps}")
        for name, d in (("trim_dscp", trim_dscp), ("trim_lasthop_dscp", trim_lasthop_dscp)):
            if not 0 < d < 64:
                raise LocalProtocolError(errno.EINVAL, f"{name}: {d} is not a DSCP (1..63)")
        cfg = config or software_config()
        self.config = cfg
        self._clock = clock
        self._t0 = clock()
        # Each datagram is handed to the NIC at the time the kernel stamped it on arrival (read against the
        # real-time clock), so that how late this process read it is not taken for network delay; only with
        # the default clock (a test's own clock has no relation to the kernel's).
        self._kernel_time = clock is time.monotonic_ns
        self._rt_now = 0
        self._fed = 0  # the last time handed to the NIC: arrivals are never handed to it earlier
        self.rng = random.Random(seed)
        self.nic = Nic(len(eps), rng=self.rng, config=cfg)
        self.stats = DeviceStats()
        self.pace = pace
        self.gso = gso
        self._no_gso: set[socket.socket] = set()  # sockets the kernel will not segment for (no checksum)
        self.sockbuf = sockbuf
        self._trim_dscp = {trim_dscp: TrimMark.TRIMMED, trim_lasthop_dscp: TrimMark.TRIMMED_LASTHOP}
        self._trim_tos = {TrimMark.TRIMMED: trim_dscp << 2, TrimMark.TRIMMED_LASTHOP: trim_lasthop_dscp << 2}
        self._lock = threading.RLock()
        self._closed = False
        self._sel = selectors.DefaultSelector()
        # which receive sockets have datagrams: one epoll call a pass instead of a failing recvmsg per socket
        self._rx_poll: Any = select.epoll() if hasattr(select, "epoll") else None
        self._rx_by_fd: dict[int, _Port] = {}
        self._gso_cmsg: dict[int, list[tuple[int, int, bytes]]] = {}  # the UDP_SEGMENT message per size
        self._ports: list[_Port] = []
        self._rx_ports: list[_Port] = []  # the ports, then the sockets of their SRv6 addresses
        self._txsocks: dict[tuple[int, int, bool], socket.socket | None] = {}
        self._routes: dict[tuple[int, int, int, bytes], _Route] = {}
        self._rx_addrs: dict[tuple[int, str, int], tuple[Addressing, object]] = {}
        self._peers_by_ip: dict[str, Peer] = {}
        self._srv6_qps: set[int] = set()
        self._cqs: list[CompletionQueue] = []
        self._held: list[_Held] = []
        self._store: StoreResolver | None = None  # profiles shared through a node-local store
        self._store_at = 0  # when to look at the store again (ns, device clock)
        self._held_seq = 0
        self.faults: dict[int, Impairments] = {}
        """Per-port impairments the fault injector applies to what that port sends (see `impair`)."""
        self._fault_rng = random.Random(None if seed is None else seed ^ 0x5EED)
        self.rx_tap: Callable[[int, tuple[Any, ...], int, int, memoryview], None] | None = None
        """Called with (port, source address, flow label, TOS byte, datagram) for every datagram received,
        before the NIC sees it (tests and tools: what really arrived on the wire)."""
        self._rxbuf = bytearray(1 << 16)
        self._rxview = memoryview(self._rxbuf)
        self._progress: threading.Thread | None = None
        self._stop = False
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._cq_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._cq_signalled = False
        try:
            extra = list(srv6_addresses or ())
            if len(extra) > len(eps):
                raise LocalProtocolError(
                    errno.EINVAL, f"srv6_addresses: {len(extra)} given for {len(eps)} ports"
                )
            for i, ep in enumerate(eps, 1):
                self._ports.append(_Port(i, ep, self._open_port_socket(i, ep, gro)))
            self._rx_ports = list(self._ports)
            for i, addr in enumerate(extra, 1):
                if addr is not None:
                    ep = (parse_endpoint(addr, eps[i - 1][1])[0], eps[i - 1][1])
                    self._rx_ports.append(_Port(i, ep, self._open_port_socket(i, ep, gro)))
            for port in self._rx_ports:
                self._sel.register(port.sock, selectors.EVENT_READ)
                if self._rx_poll is not None:
                    self._rx_poll.register(port.sock.fileno(), select.EPOLLIN)
                    self._rx_by_fd[port.sock.fileno()] = port
            self._sel.register(self._wake_fd, selectors.EVENT_READ)
        except BaseException:
            self._close_fds()
            raise

    # -- sockets -------------------------------------------------------------------------------------------
    def _open_port_socket(self, index: int, ep: Endpoint, gro: bool) -> socket.socket:
        family = socket.AF_INET6 if ":" in ep[0] else socket.AF_INET
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            s.setblocking(False)
            self._tune(s)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
                s.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO, 1)
                with contextlib.suppress(OSError):
                    s.setsockopt(SOL_UDP, UDP_NO_CHECK6_RX, 1)
            else:
                s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
            if gro:
                with contextlib.suppress(OSError):  # older kernels: datagram by datagram
                    s.setsockopt(SOL_UDP, UDP_GRO, 1)
            with contextlib.suppress(OSError):  # when each datagram reached the host, and what overflowed
                s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                s.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
            try:
                s.bind(ep)
            except OSError as exc:
                raise LocalProtocolError(
                    exc.errno or errno.EINVAL, f"port {index}: cannot bind {_fmt(ep)}: {exc.strerror}"
                ) from None
        except BaseException:
            s.close()
            raise
        return s

    def _tune(self, s: socket.socket) -> None:
        """Large buffers (past the sysctl limit when privileged) and ECN-capable transport."""
        for force, plain in ((SO_RCVBUFFORCE, socket.SO_RCVBUF), (SO_SNDBUFFORCE, socket.SO_SNDBUF)):
            try:
                s.setsockopt(socket.SOL_SOCKET, force, self.sockbuf)
            except OSError:
                s.setsockopt(socket.SOL_SOCKET, plain, self.sockbuf)
        if s.family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, ECT0)
        else:
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ECT0)

    def _tx_socket(self, port: _Port, sport: int, srv6: bool) -> socket.socket | None:
        """The socket that sends from ``port``'s address with UDP source port ``sport`` (bound on first
        use; None if it cannot be)."""
        key = (port.index, sport, srv6)
        if key in self._txsocks:
            return self._txsocks[key]
        s: socket.socket | None
        if sport == port.udp_port and not srv6:
            s = port.sock
        else:
            s = socket.socket(port.family, socket.SOCK_DGRAM)
            try:
                s.setblocking(False)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # another local device may share it
                self._tune(s)
                if port.family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    s.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO_SEND, 1)
                    with contextlib.suppress(OSError):
                        s.setsockopt(socket.IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, 0)
                    if srv6:
                        s.setsockopt(SOL_UDP, UDP_NO_CHECK6_TX, 1)
                        self._no_gso.add(s)  # UDP GSO needs the checksum (the kernel says EINVAL)
                s.bind((port.ip, sport))
            except OSError:
                s.close()
                s = None
        self._txsocks[key] = s
        return s

    # -- resources and QPs ---------------------------------------------------------------------------------
    @property
    def lock(self) -> threading.RLock:
        """Held while a progress round runs: hold it to read registered memory in a consistent state."""
        return self._lock

    @property
    def num_ports(self) -> int:
        return len(self._ports)

    def endpoints(self) -> list[Endpoint]:
        """This device's endpoint on every port, port 1 first (what a peer needs to reach it)."""
        return [(p.ip, p.udp_port) for p in self._ports]

    def now(self) -> int:
        """The device's clock: ns since it was opened (the time every NIC call is given)."""
        return self._clock() - self._t0

    def register(
        self, buffer: Any, access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE
    ) -> MemoryRegion:
        with self._lock:
            self._check_open()
            return self.nic.register(buffer, access)

    def deregister(self, mr: MemoryRegion) -> None:
        with self._lock:
            self.nic.deregister(mr)

    def create_cq(self, depth: int = 65536) -> CompletionQueue:
        with self._lock:
            self._check_open()
            cq = self.nic.create_cq(depth)
            self._cqs.append(cq)
            return cq

    def destroy_cq(self, cq: CompletionQueue) -> None:
        """Forget ``cq`` (`LocalProtocolError` EBUSY while a QP of this device uses it)."""
        with self._lock:
            self.nic.destroy_cq(cq)
            if cq in self._cqs:
                self._cqs.remove(cq)

    def create_qp(self, init: QpInitAttr | None = None) -> Qp:
        """A QP in RESET (with a send and a receive CQ of its own unless ``init`` names them)."""
        with self._lock:
            self._check_open()
            return self.nic.create_qp(init or QpInitAttr(send_cq=self.create_cq(), recv_cq=self.create_cq()))

    def use_profile_store(self, path: str | os.PathLike[str]) -> None:
        """Take EV and CC profiles from the node-local store at ``path`` as well
        (`openmrc.provider.profile_store`): a QP may bind any profile the node's controller published there,
        and the device follows the store's changes (every 50 ms, and whenever a QP binds a profile)."""
        with self._lock:
            self._check_open()
            resolver = StoreResolver(ProfileStore(path), self.nic)
            resolver.refresh(self.now())  # a store that cannot be read fails here, with its reason
            self._store = resolver
            self.nic.profiles.resolver = resolver.resolve

    def add_ev_profile(self, profile_id: int, profile: EVProfile, ports: Sequence[int] | None = None) -> None:
        """Install an EV profile for QPs to bind at `connect` (``ports``: the port of each EV, as
        `Nic.add_ev_profile` takes them)."""
        with self._lock:
            self._check_open()
            self.nic.add_ev_profile(profile_id, profile, ports)

    def destroy_qp(self, qp: Qp) -> None:
        with self._lock:
            self.nic.destroy_qp(qp)
            self._srv6_qps.discard(qp.qp_num)
            self._note_users()

    def add_peer(self, peer: Peer) -> None:
        """Know ``peer`` by its addresses (endpoint operations from them are answered to ``peer``)."""
        if len(peer.endpoints) < self.num_ports:
            raise LocalProtocolError(
                errno.EINVAL,
                f"peer {peer}: {len(peer.endpoints)} endpoints for a {self.num_ports}-port device",
            )
        for i, (ip, _udp) in enumerate(peer.endpoints[: self.num_ports], 1):
            local = self._ports[i - 1]
            if (":" in ip) != (local.family == socket.AF_INET6):
                raise LocalProtocolError(
                    errno.EAFNOSUPPORT,
                    f"peer {peer}: port {i} is {ip}, local port {i} is {_fmt((local.ip, 0))}",
                )
            self._peers_by_ip[ip] = peer

    def connect(
        self,
        qp: Qp,
        peer: Peer,
        dest_qp_num: int,
        *,
        rq_psn: int = 0,
        sq_psn: int = 0,
        ev_profile_id: int = 0,
        cc_profile_id: int = 0,
        mpr: int = 8,
        mpr_dest: int = 8,
        max_wimm: int = 16,
        max_wimm_dest: int = 16,
        timeout: int = DEFAULT_TIMEOUT,
        retry_linear: int = 7,
        retry_exp: int = 7,
    ) -> None:
        """Take ``qp`` from RESET to RTS towards ``dest_qp_num`` on ``peer`` and make sure every EV of its
        profile can be carried: raises `LocalProtocolError` with the reason (an IPv4 port for STEV or
        SRv6 EVs, an SRH segment, a source port that cannot be bound) and leaves the QP in RESET.

        ``timeout``: the ACK timeout, 1.024 µs · 2^timeout (14: 16.8 ms; raised to the device's floor,
        `software_config`); ``retry_linear`` timeouts at that interval, then ``retry_exp`` doubling it
        (25: for ever), and the QP fails with RETRY_EXC_ERR: with the defaults 4.4 s after the peer's
        last answer (`openmrc.transport.Qp.time_to_error`)."""
        with self._lock:
            self._check_open()
            self.add_peer(peer)
            connect_qp(
                qp,
                peer,
                dest_qp_num,
                now=self.now(),
                rq_psn=rq_psn,
                sq_psn=sq_psn,
                ev_profile_id=ev_profile_id,
                cc_profile_id=cc_profile_id,
                mpr=mpr,
                mpr_dest=mpr_dest,
                max_wimm=max_wimm,
                max_wimm_dest=max_wimm_dest,
                timeout=timeout,
                retry_linear=retry_linear,
                retry_exp=retry_exp,
                on_init=self.prepare_qp,
            )

    def prepare_qp(self, qp: Qp) -> None:
        """Check that this device can carry every EV of the profile ``qp`` bound in INIT (raises
        `LocalProtocolError` with the reason: an IPv4 port for STEV or SRv6 EVs, an SRH segment, a source
        port that cannot be bound) and open what they need."""
        b = self.nic.ev_profile(qp.attr.ev_profile_id or 0)
        srv6 = b.mode is EVFormatMode.SRV6
        for i, (ev, port_no, echo) in enumerate(b.entries):
            port = self._ports[port_no - 1]
            where = f"EV profile {b.profile_id}, EV {i} (port {port_no}, {_fmt((port.ip, port.udp_port))})"
            if port.family == socket.AF_INET and (srv6 or echo >> 16):
                raise LocalProtocolError(
                    errno.EAFNOSUPPORT,
                    f"{where}: {b.mode.name} EVs need IPv6 (the flow label or a uSID destination); "
                    "give the device IPv6 endpoints or use a UDP-mode EV profile",
                )
            if srv6 and any(ev[16:32]):
                raise LocalProtocolError(
                    errno.EOPNOTSUPP,
                    f"{where}: an SRH segment needs a raw socket; the UDP device sends uSID addresses only",
                )
            if self._tx_socket(port, echo & 0xFFFF, srv6) is None:
                raise LocalProtocolError(
                    errno.EADDRINUSE,
                    f"{where}: cannot bind UDP source port {echo & 0xFFFF} (in use, or below 1024 without "
                    "root); choose EVs in a free range",
                )
        if srv6:
            self._srv6_qps.add(qp.qp_num)
        self._note_users()

    def _note_users(self, closing: bool = False) -> None:
        """Tell the profile store which QPs bind its profiles (best effort: an application that cannot
        write beside the store is not counted by the controller's EBUSY check)."""
        if self._store is not None:
            with contextlib.suppress(LocalProtocolError):
                self._store.publish_users(closing)

    def post_send(self, qp: Qp, wr: SendWR) -> None:
        with self._lock:
            self._check_open()
            qp.post_send(wr, now=self.now())
        self._kick()

    def post_recv(self, qp: Qp, wr: RecvWR) -> None:
        with self._lock:
            self._check_open()
            qp.post_recv(wr)

    def poll_cq(self, cq: CompletionQueue, n: int = 1) -> list[WorkCompletion]:
        """Up to ``n`` completions of ``cq``; without a progress thread, one progress round first."""
        if self._progress is None and not self._closed:
            self.progress(0)
        with self._lock:
            return cq.poll(n)

    # -- fault injection -----------------------------------------------------------------------------------
    def impair(self, port: int | None = None, **settings: Any) -> Impairments:
        """Set the impairments of what ``port`` (None: every port) sends, as `Impairments` fields
        (``loss=0.01``, ``trim=0.05`` ...); returns the port's `Impairments` (the last one for all ports)."""
        ports = range(1, self.num_ports + 1) if port is None else [self._port_no(port)]
        imps = [Impairments(**settings) for _ in ports]  # one each: port and EV failures are per port
        self.faults.update(zip(ports, imps, strict=True))
        return imps[-1]

    def blackhole_port(self, port: int, seconds: float | None = None) -> None:
        """Everything ``port`` sends is lost from now for ``seconds`` (None: until `heal`)."""
        p = self._port_no(port)
        imp = self.faults.setdefault(p, Impairments())
        now = self.now()
        imp.port_fail[p] = (now, None if seconds is None else now + int(seconds * 1e9))

    def blackhole_ev(self, entropy: int, seconds: float | None = None) -> None:
        """Packets sent along the EV with 32-bit value ``entropy`` are lost from now for ``seconds``."""
        now = self.now()
        for p in range(1, self.num_ports + 1):
            imp = self.faults.setdefault(p, Impairments())
            imp.ev_fail[entropy] = (now, None if seconds is None else now + int(seconds * 1e9))

    def heal(self) -> None:
        """Remove every impairment."""
        self.faults.clear()

    def _port_no(self, port: int) -> int:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= self.num_ports:
            raise LocalProtocolError(errno.EINVAL, f"port {port!r} outside 1..{self.num_ports}")
        return port

    # -- progress ------------------------------------------------------------------------------------------
    @property
    def threaded(self) -> bool:
        """Whether a background progress thread drives this device (`start`)."""
        return self._progress is not None

    def progress(self, timeout: float | None = 0.0) -> int:
        """One progress round: every datagram waiting is received, due timers run, what pacing allows is
        sent. If nothing happened and ``timeout`` is not 0, waits (up to ``timeout`` s; None: until
        something happens) for a datagram, a timer or a paced send, then runs another round. Returns the
        datagrams handled. Not to be called while a progress thread runs (`start`)."""
        if self._progress is not None:
            raise LocalProtocolError(errno.EBUSY, "a progress thread drives this device (see stop())")
        with self._lock:
            self._check_open()
            n = self._round()
        if n or timeout == 0:
            return n
        self._wait(timeout)
        with self._lock:
            return self._round()

    def run_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Progress until ``done()`` is true (checked between rounds) or ``timeout`` seconds pass; returns
        ``done()``."""
        end = time.monotonic() + timeout
        while not done():
            left = end - time.monotonic()
            if left <= 0:
                return done()
            self.progress(min(left, 0.05))
        return True

    def start(self) -> None:
        """Run progress in a background thread (daemon) until `stop` or `close`."""
        with self._lock:
            self._check_open()
            if self._progress is not None:
                return
            self._stop = False
            self._progress = threading.Thread(target=self._loop, name="openmrc-udp-progress", daemon=True)
            self._progress.start()

    def stop(self) -> None:
        """Stop the background progress thread (if any) and wait for it."""
        t = self._progress
        if t is None:
            return
        self._stop = True
        self._kick()
        t.join()
        self._progress = None

    def _loop(self) -> None:
        while not self._stop:
            with self._lock:
                if self._closed:
                    return
                n = self._round()
            if not n:
                self._wait(0.1)

    def _kick(self) -> None:
        if self._progress is not None:
            with contextlib.suppress(OSError):
                os.eventfd_write(self._wake_fd, 1)

    def _wait(self, timeout: float | None) -> None:
        with self._lock:
            if self._closed:
                return
            now = self.now()
            due = [
                t for t in (self.nic.get_timer(), self._held[0][0] if self._held else None) if t is not None
            ]
            if self.pace and self.nic.has_data():
                due.append(min(p.free_at for p in self._ports))
            if due:
                wait = max(0.0, (min(due) - now) / 1e9)
                timeout = wait if timeout is None else min(timeout, wait)
        try:
            events = self._sel.select(timeout)
        except (OSError, ValueError):  # closed under our feet
            return
        for key, _mask in events:
            if key.fileobj == self._wake_fd:
                with contextlib.suppress(OSError):
                    os.eventfd_read(self._wake_fd)

    def _round(self) -> int:
        nic = self.nic
        now = self.now()
        if self._kernel_time:
            # the kernel stamps arrivals on the real-time clock: its reading now, against ours
            self._rt_now = time.time_ns()
        self.stats.rounds += 1
        n = 0
        # Ports are drained in turns of a few datagrams, so that packets sprayed over the planes are handed
        # to the NIC about in the order they were sent (draining one socket before the next would make the
        # others' packets look reordered by hundreds, i.e. lost).
        ports = self._rx_ports
        poll, by_fd = self._rx_poll, self._rx_by_fd
        for _ in range(_RX_BUDGET // _RX_TURN):
            got = 0
            if poll is not None:
                ready = poll.poll(0)
                if len(ready) > 1:
                    ready.sort()  # sockets in the order they were opened: ports first, by index
                for fd, _mask in ready:
                    got += self._receive(by_fd[fd], now)
            else:
                for port in ports:
                    got += self._receive(port, now)
            n += got
            if got == 0:
                break
        if self._held:
            n += self._release(now)
        if self._store is not None and now >= self._store_at:
            self._store_at = now + _STORE_POLL_NS
            with contextlib.suppress(LocalProtocolError):  # a store being rewritten: the next look
                self._store.refresh(now)
        timer = nic.get_timer()
        if timer is not None and timer <= now:
            nic.handle_timer(now)
        self._fed = now
        n += self._send(now)
        if not self._cq_signalled:
            for cq in self._cqs:
                if len(cq):
                    self._cq_signalled = True
                    os.eventfd_write(self._cq_fd, 1)
                    break
        return n

    # -- receive -------------------------------------------------------------------------------------------
    def _receive(self, port: _Port, now: int) -> int:
        sock = port.sock
        buf, view = self._rxbuf, self._rxview
        nic, stats = self.nic, self.stats
        v6 = port.family == _AF_INET6
        trim_of = self._trim_dscp
        no_trim = TrimMark.NONE
        got = 0
        for _ in range(_RX_TURN):
            try:
                nbytes, anc, flags, src = sock.recvmsg_into([buf], 256)
            except BlockingIOError:
                break
            except OSError:
                stats.rx_errors += 1
                break
            tos = flow = seg = 0
            at = now
            for level, kind, data in anc:
                if level == _SOL_SOCKET:
                    if kind == SO_TIMESTAMPNS:
                        if self._kernel_time:
                            sec, nsec = _TIMESPEC.unpack_from(data)
                            waited = self._rt_now - (sec * 1_000_000_000 + nsec)
                            if waited > 0:
                                at = now - waited
                                if waited > stats.rx_delay_max_ns:
                                    stats.rx_delay_max_ns = waited
                    elif kind == SO_RXQ_OVFL:
                        total = _UINT.unpack_from(data)[0]
                        if total != port.overflow:
                            stats.rx_overflow += (total - port.overflow) & 0xFFFFFFFF
                            port.overflow = total
                elif level == SOL_UDP and kind == UDP_GRO:
                    seg = _INT.unpack_from(data)[0]
                elif kind == IPV6_FLOWINFO and level == socket.IPPROTO_IPV6:
                    flow = int.from_bytes(data[:4], "big") & _FLOW_MASK
                elif data:
                    tos = data[0] if len(data) == 1 else _INT.unpack_from(data)[0]
            if at < self._fed:
                at = self._fed  # the core's time never goes back
            if flags & _MSG_TRUNC:
                stats.rx_truncated += 1
                continue
            key = (port.index, src[0], src[1])
            known = self._rx_addrs.get(key)
            if known is None:
                if len(self._rx_addrs) > 1 << 16:
                    self._rx_addrs.clear()
                known = self._rx_addrs[key] = (
                    Addressing(src[0], port.ip, src[1], port.udp_port),
                    self._peers_by_ip.get(src[0]),
                )
            addr, peer = known
            if self.rx_tap is not None:
                self.rx_tap(port.index, src, flow, tos, view[:nbytes])
            ecn = tos & 3 == CE
            trim = trim_of.get(tos >> 2, no_trim) if tos > 3 else no_trim  # DSCP 0: not trimmed
            if not v6:
                flow = 0
            if seg and seg < nbytes:
                stats.rx_gro_batches += 1
                count = -(-nbytes // seg)
            else:
                seg = 0
                count = 1
            stats.rx_datagrams += count
            got += count
            nic.receive_segments(
                view[:nbytes], seg, port.index, at, addr, ecn=ecn, flow_label=flow, trim=trim, src=peer
            )
        return got

    # -- send ----------------------------------------------------------------------------------------------
    def _budget(self, now: int) -> int | None:
        if not self.pace:
            return None
        ns = (self.config.mtu + _HEADER_BYTES) * 8 * 1_000_000_000 // self.config.link_bps
        horizon = max(8, self.config.spray_burst) * ns  # a burst of up to 8 packets (or a GSO burst) per port
        room = 0
        for p in self._ports:
            free = p.free_at if p.free_at > now else now  # an idle port does not save up a burst
            ahead = now + horizon - free
            if ahead > 0:
                room += ahead // ns + 1
        return room

    def _send(self, now: int) -> int:
        out = self.nic.datagrams_to_send(now, self._budget(now))
        if not out:
            return 0
        link = self.config.link_bps
        faults = self.faults
        routes, srv6_qps = self._routes, self._srv6_qps
        ports = self._ports
        port = ports[0]
        r: _Route | None = None
        last_ev: bytes | None = None  # a burst's packets share one EV (the same bytes object) and route
        last_port = last_qp = -1
        last_peer: object = None
        # The run of datagrams being gathered into one GSO send: one socket, destination and size.
        run: list[bytes | memoryview] = []
        run_sock: socket.socket | None = None
        run_dest: tuple[Any, ...] = ()
        run_size = run_count = run_limit = 0
        for t in out:
            if (
                r is None
                or t.ev is not last_ev
                or t.port != last_port
                or t.peer is not last_peer
                or t.qp_num != last_qp
            ):
                port = ports[t.port - 1]
                peer = t.peer
                srv6 = bool(srv6_qps) and t.qp_num in srv6_qps
                key = (t.port, t.entropy, id(peer), t.ev[:16] if srv6 else b"")
                r = routes.get(key)
                if r is None or r[3] is not peer:
                    r = self._route(t, port, key, srv6)
                last_ev, last_port, last_peer, last_qp = t.ev, t.port, peer, t.qp_num
            sock, dest, addr = r[0], r[1], r[2]
            tpl = t.tpl
            parts: list[bytes | memoryview] | None = None
            if tpl is not None:  # a data packet: its headers from the Write's template, one struct.pack
                n = t.size
                hdr = tpl.header(t.op, t.ack_req, t.rtx, t.psn, t.va, n)
                size = len(hdr) + n + (-n & 3) + _ICRC_SIZE
            else:
                try:
                    parts = seal_parts(t.packet, addr)
                except WireError:  # the core never emits one; counted, never raised into a progress thread
                    self.stats.tx_errors += 1
                    continue
                size = 0
                for x in parts:
                    size += len(x)
            if t.size:
                start = port.free_at if port.free_at > now else now
                port.free_at = start + (size + _HEADER_BYTES) * 8 * 1_000_000_000 // link
            if faults and t.port in faults and faults[t.port].active:
                if run_count:
                    self._send_run(run_sock, run_dest, run, run_size, run_count)
                    run = []
                    run_count = 0
                if parts is None:
                    parts = seal_header_parts(hdr, t.payload, addr)
                self._inject(faults[t.port], t, sock, dest, parts, now)
                continue
            if run_count and (
                sock is not run_sock or dest is not run_dest or size != run_size or run_count >= run_limit
            ):
                self._send_run(run_sock, run_dest, run, run_size, run_count)
                run = []
                run_count = 0
            if not run_count:
                run_sock, run_dest, run_size = sock, dest, size
                run_limit = (
                    min(_GSO_MAX_SEGS, max(1, _GSO_MAX_BYTES // size))
                    if self.gso and sock not in self._no_gso
                    else 1
                )
            if parts is None:
                seal_into(run, hdr, t.payload, addr)
            else:
                run += parts
            run_count += 1
        if run_count:
            self._send_run(run_sock, run_dest, run, run_size, run_count)
        return len(out)

    def _route(self, t: Transmit, port: _Port, key: tuple[int, int, int, bytes], srv6: bool) -> _Route:
        """The route of ``t``, made and cached under ``key`` (`_send` looks it up first, keyed by the peer
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
        sock = self._tx_socket(port, sport, srv6)
        if sock is None:
            self.stats.tx_unbound += 1
            sock, sport = port.sock, port.udp_port
        # the ICRC covers the final destination: for a uSID address, where its last shift leaves it
        addr = Addressing(port.ip, usid_final_address(t.ev) if srv6 else ip, sport, dport)
        dst_ip = str(ipaddress.IPv6Address(t.ev[:16])) if srv6 else ip
        dest: tuple[Any, ...] = (
            (dst_ip, dport, (t.entropy >> 16) & 0xFFFF, 0) if port.family == socket.AF_INET6 else (ip, dport)
        )
        if len(self._routes) > 1 << 16:
            self._routes.clear()
        r = self._routes[key] = (sock, dest, addr, peer)
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
        stats = self.stats
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

    def _inject(
        self,
        imp: Impairments,
        t: Transmit,
        sock: socket.socket,
        dest: tuple[Any, ...],
        parts: list[bytes | memoryview],
        now: int,
    ) -> None:
        rng, stats = self._fault_rng, self.stats
        is_data = t.tpl is not None or is_data_opcode(t.packet.bth.opcode)
        copies = fates(imp, rng, now, t.port, t.entropy, is_data)
        if not copies:
            stats.fault_dropped += 1
            return
        if len(copies) > 1:
            stats.fault_duplicated += 1
        v6 = sock.family == socket.AF_INET6
        for fate in copies:
            data: list[bytes | memoryview] = parts
            tos = ECT0
            if fate.trim:
                data = [trim_datagram(b"".join(parts))]
                tos = self._trim_tos[fate.trim] | ECT0
                stats.fault_trimmed += 1
            if fate.ecn:
                tos = (tos & ~3) | CE
                stats.fault_ecn += 1
            if fate.corrupt:
                data = [flip_bit(b"".join(data), rng)[0]]
                stats.fault_corrupted += 1
            cmsg = (
                socket.IPPROTO_IPV6 if v6 else socket.IPPROTO_IP,
                socket.IPV6_TCLASS if v6 else socket.IP_TOS,
                _INT.pack(tos),
            )
            if fate.delay:
                stats.fault_delayed += 1
                self._held_seq += 1
                # the payload may be a view of memory the application reuses: held packets own their bytes
                held: _Held = (now + fate.delay, self._held_seq, sock, [b"".join(data)], (dest, cmsg))
                heapq.heappush(self._held, held)
            else:
                self._sendmsg(sock, data, cmsg, dest)

    def _sendmsg(
        self, sock: socket.socket, data: list[bytes | memoryview], cmsg: Any, dest: tuple[Any, ...]
    ) -> None:
        try:
            sock.sendmsg(data, [cmsg], 0, dest)
            self.stats.tx_datagrams += 1
            self.stats.tx_bytes += sum(len(d) for d in data)
        except OSError:
            self.stats.tx_errors += 1

    def _release(self, now: int) -> int:
        n = 0
        held = self._held
        while held and held[0][0] <= now:
            _t, _s, sock, data, (dest, cmsg) = heapq.heappop(held)
            self._sendmsg(sock, data, cmsg, dest)
            n += 1
        return n

    # -- completions ---------------------------------------------------------------------------------------
    @property
    def completion_fd(self) -> int:
        """A file descriptor readable while some CQ of this device may hold completions (after
        `ack_completion_fd`, it turns readable again when a progress round finds completions)."""
        return self._cq_fd

    def ack_completion_fd(self) -> None:
        with self._lock:
            with contextlib.suppress(OSError):
                os.eventfd_read(self._cq_fd)
            self._cq_signalled = False

    async def wait_completions(self, cq: CompletionQueue, n: int = 1) -> list[WorkCompletion]:
        """Up to ``n`` completions of ``cq``, waiting on `completion_fd` in the running asyncio loop until
        there is one. Needs the progress thread (`start`)."""
        if self._progress is None:
            raise LocalProtocolError(errno.EINVAL, "wait_completions needs the progress thread: call start()")
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                self._check_open()
                wcs = cq.poll(n)
            if wcs:
                return wcs
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self._cq_fd, _resolve, ready)
            try:
                self.ack_completion_fd()
                with self._lock:
                    pending = len(cq) > 0
                if not pending:  # else a completion arrived between the poll and the re-arm: poll again
                    await ready
            finally:
                loop.remove_reader(self._cq_fd)

    # -- shutdown ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop progress, move every QP to ERROR (outstanding work requests complete with
        ``WR_FLUSH_ERR`` on their CQs, still pollable) and close every socket and descriptor. Idempotent."""
        if self._closed:
            return
        self.stop()
        with self._lock:
            now = self.now()
            for qp in list(self.nic.qps.values()):
                if qp.state is not QpState.ERROR and qp.state is not QpState.RESET:
                    qp.modify(QpState.ERROR, now=now)
            self._closed = True
            self._close_fds()
            self._note_users(closing=True)

    def _close_fds(self) -> None:
        with contextlib.suppress(Exception):
            self._sel.close()
        if self._rx_poll is not None:
            self._rx_poll.close()
        self._rx_by_fd.clear()
        socks = {id(p.sock): p.sock for p in self._ports + self._rx_ports}
        socks.update({id(s): s for s in self._txsocks.values() if s is not None})
        for s in socks.values():
            s.close()
        self._txsocks.clear()
        self._no_gso.clear()
        self._routes.clear()
        self._held.clear()
        for fd in (self._wake_fd, self._cq_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise LocalProtocolError(errno.EBADF, "the device is closed")

    def open_sockets(self) -> int:
        """How many sockets the device holds open (ports and sending sockets)."""
        socks = {id(p.sock) for p in self._rx_ports if p.sock.fileno() >= 0}
        socks |= {id(s) for s in self._txsocks.values() if s is not None and s.fileno() >= 0}
        return len(socks)

    def __enter__(self) -> UdpDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.nic.qps)} QPs"
        return f"UdpDevice({', '.join(_fmt(e) for e in self.endpoints())}; {state})"


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


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _fmt(ep: Endpoint) -> str:
    ip, port = ep
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
