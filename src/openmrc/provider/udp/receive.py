"""The UDP device's receiving side: datagrams read from the port sockets with what the kernel says of each
(TOS byte or traffic class with ECN and DSCP, IPv6 flow label, GRO segment size, arrival time, overflow
count) and handed to the NIC, the ports drained in turns."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from typing import Any, Final

from openmrc.provider.udp.config import (
    CE,
    IPV6_FLOWINFO,
    SO_RXQ_OVFL,
    SO_TIMESTAMPNS,
    SOL_UDP,
    UDP_GRO,
    DeviceStats,
    Peer,
)
from openmrc.provider.udp.sockets import PortSocket, PortSockets
from openmrc.transport.nic import Nic
from openmrc.transport.types import TrimMark
from openmrc.wire import Addressing

_SOL_SOCKET: Final = int(socket.SOL_SOCKET)
_FLOW_MASK: Final = 0xFFFFF
_MSG_TRUNC: Final = int(socket.MSG_TRUNC)  # a plain int: an IntFlag operation per datagram is a Python call
_AF_INET6: Final = int(socket.AF_INET6)
_RX_BUDGET: Final = 1024  # datagrams (or GRO batches) per port per round
_RX_TURN: Final = 4  # taken from one port before the next port's turn
_INT: Final = struct.Struct("i")
_UINT: Final = struct.Struct("I")
_TIMESPEC: Final = struct.Struct("qq")

RxTap = Callable[[int, tuple[Any, ...], int, int, memoryview], None]


class Receiver:
    """Hands ``nic`` the datagrams of every receiving socket of ``sockets``, counted in ``stats``.
    ``trim_of``: the trim mark of each DSCP that says one; ``kernel_time``: hand each datagram the time the
    kernel stamped on its arrival (only with the device's default clock, which is the kernel's)."""

    def __init__(
        self,
        *,
        nic: Nic,
        stats: DeviceStats,
        sockets: PortSockets,
        trim_of: dict[int, TrimMark],
        kernel_time: bool,
    ) -> None:
        self._nic = nic
        self._stats = stats
        self._ports = sockets.rx_ports
        self._poll = sockets.poll
        self._by_fd = sockets.by_fd
        self._trim_of = trim_of
        self._kernel_time = kernel_time
        self._rt_now = 0
        self._mono_now = 0
        self._latest = 0
        self.fed = 0
        """The latest time the last drain handed to the NIC (its ``now`` or a later arrival's): the NIC runs
        on from there, and no later arrival is handed to it earlier (its time never goes back)."""
        self._rx_addrs: dict[tuple[int, str, int], tuple[Addressing, object]] = {}
        self.peers_by_ip: dict[str, Peer] = {}
        """The peer each remote address belongs to (datagrams from it are the peer's)."""
        self.rx_tap: RxTap | None = None
        self._rxbuf = bytearray(1 << 16)
        self._rxview = memoryview(self._rxbuf)

    def drain(self, now: int) -> int:
        """Receive what waits on the sockets (up to a budget) at ``now``; returns the datagrams received.
        Each is handed to the NIC at its arrival: the time the kernel stamped on it, which for one that
        came while the drain ran is after ``now`` (then `fed` is later than ``now``)."""
        if self._kernel_time:
            # the kernel stamps arrivals on the real-time clock: its reading now, against ours (and the
            # monotonic clock's, which ours is, for what comes while the drain runs)
            self._rt_now = time.time_ns()
            self._mono_now = time.monotonic_ns()
        self._latest = now
        n = 0
        # Ports are drained in turns of a few datagrams, so that packets sprayed over the planes are handed
        # to the NIC about in the order they were sent (draining one socket before the next would make the
        # others' packets look reordered by hundreds, i.e. lost).
        ports = self._ports
        poll, by_fd = self._poll, self._by_fd
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
        self.fed = self._latest
        return n

    def _receive(self, port: PortSocket, now: int) -> int:
        sock = port.sock
        buf, view = self._rxbuf, self._rxview
        nic, stats = self._nic, self._stats
        v6 = port.family == _AF_INET6
        trim_of = self._trim_of
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
                            elif waited < 0:  # it came during this drain: then, at the latest as it is read
                                at = now + min(-waited, time.monotonic_ns() - self._mono_now)
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
            if at < self.fed:
                at = self.fed  # the core's time never goes back
            elif at > self._latest:
                self._latest = at
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
                    self.peers_by_ip.get(src[0]),
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
