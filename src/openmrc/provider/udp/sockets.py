"""The UDP device's sockets: one bound to every port's endpoint (and one to each port's SRv6 address), the
epoll object that says which of them have datagrams, and the sending socket of every (port, UDP source
port) in use, bound when a QP needs it."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import select
import socket
from collections.abc import Sequence
from typing import Any

from openmrc.provider.udp.config import (
    ECT0,
    IPV6_AUTOFLOWLABEL,
    IPV6_FLOWINFO,
    IPV6_FLOWINFO_SEND,
    SO_RCVBUFFORCE,
    SO_RXQ_OVFL,
    SO_SNDBUFFORCE,
    SO_TIMESTAMPNS,
    SOL_UDP,
    UDP_GRO,
    UDP_NO_CHECK6_RX,
    UDP_NO_CHECK6_TX,
    Endpoint,
    format_endpoint,
    parse_endpoint,
)
from openmrc.transport.types import LocalProtocolError


class PortSocket:
    """A socket bound to an endpoint of port ``index``: the port's own, or the SRv6 address it also
    receives at."""

    __slots__ = ("family", "index", "ip", "overflow", "packed", "sock", "udp_port")

    def __init__(self, index: int, ep: Endpoint, sock: socket.socket) -> None:
        self.index = index
        self.ip, self.udp_port = ep
        self.packed = ipaddress.ip_address(self.ip).packed
        self.family = socket.AF_INET6 if len(self.packed) == 16 else socket.AF_INET
        self.sock = sock
        self.overflow = 0  # the kernel's drop count the socket last reported (SO_RXQ_OVFL)


class PortSockets:
    """Every socket of a device. ``endpoints``: one per port; ``srv6_addresses``: per port, an address
    it also receives at (None: none); ``gro``: ask for UDP GRO; ``sockbuf``: socket buffer bytes asked
    for. Raises `LocalProtocolError` naming an endpoint that cannot be bound, with nothing left open."""

    def __init__(
        self, endpoints: Sequence[Endpoint], *, srv6_addresses: Sequence[str | None], gro: bool, sockbuf: int
    ) -> None:
        self.sockbuf = sockbuf
        self.ports: list[PortSocket] = []
        self.rx_ports: list[PortSocket] = []  # the ports, then the sockets of their SRv6 addresses
        # which receive sockets have datagrams: one epoll call a pass instead of a failing recvmsg per socket
        self.poll: Any = select.epoll() if hasattr(select, "epoll") else None
        self.by_fd: dict[int, PortSocket] = {}
        self.tx: dict[tuple[int, int, bool], socket.socket | None] = {}
        """The sending socket of each (port, UDP source port, SRv6) (None: it could not be bound)."""
        self.no_gso: set[socket.socket] = set()  # sockets the kernel will not segment for (no checksum)
        try:
            for i, ep in enumerate(endpoints, 1):
                self.ports.append(PortSocket(i, ep, self._open_port_socket(i, ep, gro)))
            self.rx_ports = list(self.ports)
            for i, addr in enumerate(srv6_addresses, 1):
                if addr is not None:
                    dport = endpoints[i - 1][1]
                    ep = (parse_endpoint(addr, dport)[0], dport)
                    self.rx_ports.append(PortSocket(i, ep, self._open_port_socket(i, ep, gro)))
            if self.poll is not None:
                for port in self.rx_ports:
                    self.poll.register(port.sock.fileno(), select.EPOLLIN)
                    self.by_fd[port.sock.fileno()] = port
        except BaseException:
            self.close()
            raise

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
                why = exc.strerror
                if exc.errno == errno.EADDRINUSE:  # (most often another device, e.g. a second perf client)
                    why = f"{why} (another process has it: give this one other addresses or ports)"
                raise LocalProtocolError(
                    exc.errno or errno.EINVAL, f"port {index}: cannot bind {format_endpoint(ep)}: {why}"
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

    def tx_socket(self, port: PortSocket, sport: int, srv6: bool) -> socket.socket | None:
        """The socket that sends from ``port``'s address with UDP source port ``sport`` (bound on first
        use; None if it cannot be)."""
        key = (port.index, sport, srv6)
        if key in self.tx:
            return self.tx[key]
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
                        self.no_gso.add(s)  # UDP GSO needs the checksum (the kernel says EINVAL)
                s.bind((port.ip, sport))
            except OSError:
                s.close()
                s = None
        self.tx[key] = s
        return s

    def open_count(self) -> int:
        """How many sockets are open (ports and sending sockets)."""
        socks = {id(p.sock) for p in self.rx_ports if p.sock.fileno() >= 0}
        socks |= {id(s) for s in self.tx.values() if s is not None and s.fileno() >= 0}
        return len(socks)

    def close(self) -> None:
        if self.poll is not None:
            self.poll.close()
        self.by_fd.clear()
        socks = {id(p.sock): p.sock for p in self.ports + self.rx_ports}
        socks.update({id(s): s for s in self.tx.values() if s is not None})
        for s in socks.values():
            s.close()
        self.tx.clear()
        self.no_gso.clear()
