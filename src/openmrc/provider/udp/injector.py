"""The UDP device's in-process fault injector: per-port `Impairments` (`openmrc.provider.faults`) decide each
outgoing datagram's fates (dropped, duplicated, trimmed, ECN-marked, corrupted, delayed); the device sends
what they leave, marked as a fabric would (trim DSCP, CE), and holds the delayed datagrams until they are
due."""

from __future__ import annotations

import errno
import heapq
import random
import socket
import struct
from typing import Any, Final

from openmrc.provider.faults import Fate, Impairments, fates, flip_bit
from openmrc.provider.udp.config import CE, ECT0, DeviceStats
from openmrc.transport.types import LocalProtocolError, Transmit, TrimMark
from openmrc.wire import trim_datagram
from openmrc.wire.constants import is_data_opcode

_INT: Final = struct.Struct("i")

# a datagram the fault injector delays: (release time, sequence, socket, data, (destination, TOS cmsg))
_Held = tuple[
    int, int, socket.socket, list[bytes | memoryview], tuple[tuple[Any, ...], tuple[int, int, bytes]]
]


class FaultInjector:
    """Impairs what the ``num_ports`` ports of a device send, counted in ``stats``; ``rng`` draws the
    fates; ``trim_tos``: the TOS byte (DSCP) that marks each kind of trimmed packet."""

    def __init__(
        self, *, num_ports: int, stats: DeviceStats, rng: random.Random, trim_tos: dict[TrimMark, int]
    ) -> None:
        self._num_ports = num_ports
        self._stats = stats
        self.rng = rng
        self._trim_tos = trim_tos
        self.faults: dict[int, Impairments] = {}
        """Per-port impairments applied to what that port sends."""
        self._held: list[_Held] = []
        self._held_seq = 0

    def impair(self, port: int | None, settings: dict[str, Any]) -> Impairments:
        """Impair ``port`` (None: every port) by ``settings`` (`Impairments` fields); the port's
        `Impairments` (the last one for all ports)."""
        ports = range(1, self._num_ports + 1) if port is None else [self._port_no(port)]
        imps = [Impairments(**settings) for _ in ports]  # one each: port and EV failures are per port
        self.faults.update(zip(ports, imps, strict=True))
        return imps[-1]

    def blackhole_port(self, port: int, seconds: float | None, now: int) -> None:
        p = self._port_no(port)
        imp = self.faults.setdefault(p, Impairments())
        imp.port_fail[p] = (now, None if seconds is None else now + int(seconds * 1e9))

    def blackhole_ev(self, entropy: int, seconds: float | None, now: int) -> None:
        for p in range(1, self._num_ports + 1):
            imp = self.faults.setdefault(p, Impairments())
            imp.ev_fail[entropy] = (now, None if seconds is None else now + int(seconds * 1e9))

    def heal(self) -> None:
        self.faults.clear()

    def _port_no(self, port: int) -> int:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= self._num_ports:
            raise LocalProtocolError(errno.EINVAL, f"port {port!r} outside 1..{self._num_ports}")
        return port

    def fates_of(self, imp: Impairments, t: Transmit, now: int) -> list[Fate]:
        """What ``imp`` does to ``t`` (sent at ``now``): its copies that arrive, none if it is lost (both
        counted)."""
        is_data = t.tpl is not None or is_data_opcode(t.packet.bth.opcode)
        copies = fates(imp, self.rng, now, t.port, t.entropy, is_data)
        if not copies:
            self._stats.fault_dropped += 1
        elif len(copies) > 1:
            self._stats.fault_duplicated += 1
        return copies

    def deliver(
        self,
        copies: list[Fate],
        sock: socket.socket,
        dest: tuple[Any, ...],
        parts: list[bytes | memoryview],
        now: int,
    ) -> None:
        """Send the ``copies`` of a packet (sealed as ``parts``, from ``sock`` to ``dest``): trimmed,
        marked, corrupted or held back as each one's fate says."""
        rng, stats = self.rng, self._stats
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
            self._stats.tx_datagrams += 1
            self._stats.tx_bytes += sum(len(d) for d in data)
        except OSError:
            self._stats.tx_errors += 1

    def next_release(self) -> int | None:
        """When the first held datagram is due (None: none is held)."""
        return self._held[0][0] if self._held else None

    def release(self, now: int) -> int:
        """Send the held datagrams due by ``now``; how many."""
        n = 0
        held = self._held
        while held and held[0][0] <= now:
            _t, _s, sock, data, (dest, cmsg) = heapq.heappop(held)
            self._sendmsg(sock, data, cmsg, dest)
            n += 1
        return n

    def clear(self) -> None:
        """Drop the held datagrams (their sockets are closing)."""
        self._held.clear()
