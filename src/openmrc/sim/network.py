"""Packet-level network: the nodes its ports (`openmrc.sim.ports`) lead to. SRv6 switches, hosts that run the
real `openmrc.transport.Nic`, and the places of nodes that are not here (an unwired port's far end, a node
another process runs).

Switches forward by SRv6 uSID shift + static table or by ECMP (`openmrc.sim.routing`); hosts hand packets
to their transport NIC and pump what it sends, at line rate (the NIC pulls about two packets per port as
the port drains). The ports, their queues and PFC are `openmrc.sim.ports`'s; their names are importable
from here too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from openmrc.sim.ports import (
    HEADER_BYTES,
    PAUSED,
    UNLIMITED,
    Crossing,
    Node,
    OrderedPort,
    Pfc,
    Port,
    PortCold,
)
from openmrc.transport import Nic, Transmit
from openmrc.wire import Packet
from openmrc.wire.security import trailer_length

if TYPE_CHECKING:
    from openmrc.sim.engine import Simulator
    from openmrc.sim.routing import Routing

__all__ = [
    "HEADER_BYTES",
    "PAUSED",
    "UNLIMITED",
    "Crossing",
    "Host",
    "Node",
    "OrderedPort",
    "Pfc",
    "Port",
    "PortCold",
    "Remote",
    "SimNic",
    "Switch",
    "Unwired",
    "ZeroBuffer",
    "sim_packet",
]

_NO_SEGMENT: Final = bytes(16)
_NO_EV: Final = bytes(32)
SRH_BYTES: Final = 24
"""An SRH with one segment: its 8-byte header and the 16-byte segment."""


def sim_packet(packet: Packet, size: int, addr: int, src: int, dst: int, port: int, entropy: int) -> Transmit:
    """A `Packet` put on the fabric by a host that is not an MRC NIC (RoCEv2, tests): the `Transmit` that
    carries it, ``size`` bytes on the wire, from node ``src`` to host ``dst`` on plane ``port``.

    A packet in flight is a `Transmit` with its fabric fields set (one object per packet): an MRC host's
    is the sender's own, which stays its Write's template and per-packet fields all the way to the
    receiving NIC (`Nic.receive_transmit`), a SACK its fields (`SackTransmit`), so no `Packet` object
    graph is built for them (``packet`` builds one on demand, e.g. for a capture)."""
    t = Transmit(port, dst, _NO_EV, entropy, packet, 0, 0)
    t.wire_size = size
    t.addr = addr
    t.src = src
    return t


class Unwired(Node):
    """The far end of a switch port with no cable: a partly filled T0's ports toward hosts it lacks keep
    their numbers, so their places in ``ports`` hold a port to here. No route leads to them; a packet
    that came anyway would be counted and dropped."""

    __slots__ = ("arrivals",)

    def __init__(self, node_id: int) -> None:
        super().__init__(node_id)
        self.arrivals = 0

    def arrive(self, p: Transmit) -> None:
        self.arrivals += 1


class Remote(Node):
    """A node another process runs (`openmrc.sim.partition`): it holds a place in a partly built fabric,
    no ports, and nothing reaches it (a port leading there ships its packets through its `Crossing`)."""

    __slots__ = ()

    def arrive(self, p: Transmit) -> None:
        raise RuntimeError(f"node {self.id} runs in another process")


class Switch(Node):
    """Forwards each packet on the port its `Routing` (SRv6 source route or ECMP) picks."""

    __slots__ = ("misrouted", "routing", "sim")

    def __init__(self, sim: Simulator, node_id: int, routing: Routing) -> None:
        super().__init__(node_id)
        self.sim = sim
        self.routing = routing
        self.misrouted = 0

    def arrive(self, p: Transmit) -> None:
        try:
            port = self.routing.port(self.id, p)
        except ValueError:
            self.misrouted += 1
            return
        self.ports[port].send(p, self.sim.now)


class ZeroBuffer:
    """A buffer that holds only zeros, as a simulation's flows use it (they send from and write into it):
    a data packet whose payload views it travels with a shared zero view of the same length instead of a
    view of its own (a memoryview is ~190 bytes, per packet in flight), and the receiver writes the same
    zeros."""

    __slots__ = ("_views", "buf")

    def __init__(self, buf: bytearray) -> None:
        self.buf = buf
        self._views: dict[int, memoryview] = {}

    def view(self, n: int) -> memoryview:
        """A read-only view of ``n`` zero bytes (one per length, shared)."""
        v = self._views.get(n)
        if v is None:
            v = self._views[n] = memoryview(bytes(n))
        return v


class Host(Node):
    """A host: one NIC port per plane, running a transport `Nic` on simulated time."""

    __slots__ = ("_pace_cb", "_timer_cb", "nic", "on_pump", "pace_pending", "sim", "tap", "timer_at", "zeros")

    def __init__(self, sim: Simulator, node_id: int, nic: Nic) -> None:
        super().__init__(node_id)
        self.sim = sim
        self.nic = nic
        self.timer_at: int | None = None
        self.pace_pending = False
        self.on_pump: Callable[[Host], None] | None = None
        self.tap: Callable[[Host, Transmit, bool], None] | None = None
        """Called with every packet this host sends (True) or receives (False), e.g. by `openmrc.sim.pcap`."""
        self.zeros: ZeroBuffer | None = None
        """Data packets viewing this buffer travel with a shared zero payload (`ZeroBuffer`)."""
        self._pace_cb: Callable[[None], None] = self._pace  # bound once, not per event
        self._timer_cb: Callable[[int], None] = self._timer

    def arrive(self, p: Transmit) -> None:
        now = self.sim.now
        if self.tap is not None:
            self.tap(self, p, False)
        self.nic.receive_transmit(p, p.port, now, p.ecn, p.entropy, p.trim, p.src)
        self.pump(now)

    def pump(self, now: int) -> None:
        """Send what the NIC's ports can take now (line-rate pacing), then (re-)arm its one timer."""
        budget = 0
        for port in self.ports:  # keep about two packets queued per port: a NIC pulls as its ports drain
            backlog = port.free_at - now
            if backlog < port.pace_ns:
                budget += 2 if backlog <= 0 else 1
        for t in self.nic.datagrams_to_send(now, budget):
            self._send(t, now)
        if not self.pace_pending and self.nic.has_data():
            soonest = PAUSED  # (each port's ready time is below it)
            for port in self.ports:
                if port.free_at >= PAUSED:
                    continue  # PFC-paused: its resume pumps again (`resumed`)
                ready = port.free_at - port.pace_ns
                if ready < soonest:
                    soonest = ready
            if soonest < PAUSED:
                self.pace_pending = True
                self.sim.schedule(soonest if soonest > now else now + 1, self._pace_cb, None, 0, self.id + 1)
        # one pending timer event; a deadline that moved later (every ACK pushes the RTO) is left to it:
        # when it fires early it re-arms for the new deadline, so no event is pushed per ACK (nor is the
        # NIC asked for its exact deadline unless one may come before the pending event)
        floor = self.nic.timer_floor()
        if floor >= 0 and (self.timer_at is None or floor < self.timer_at):
            deadline = self.nic.get_timer()
            if deadline is not None and (self.timer_at is None or deadline < self.timer_at):
                self.timer_at = deadline
                self.sim.schedule(max(deadline, now), self._timer_cb, deadline, 0, self.id + 1)
        if self.on_pump is not None:
            self.on_pump(self)

    def _pace(self, _: None) -> None:
        self.pace_pending = False
        self.pump(self.sim.now)

    def resumed(self, _: None) -> None:
        """A PFC pause of one of this host's ports ended: send again."""
        self.pump(self.sim.now)

    def _timer(self, deadline: int) -> None:
        if deadline != self.timer_at:
            return  # superseded by an earlier deadline
        self.timer_at = None
        now = self.sim.now
        due = self.nic.get_timer()
        if due is None:
            return
        if due > now:  # the deadline moved later since this event was scheduled
            self.timer_at = due
            self.sim.schedule(due, self._timer_cb, due, 0, self.id + 1)
            return
        self.nic.handle_timer(now)
        self.pump(now)

    def _send(self, t: Transmit, now: int) -> None:
        if t.tpl is not None:
            payload = t.payload
            size = len(payload) + HEADER_BYTES
            zeros = self.zeros
            if zeros is not None and payload.obj is zeros.buf:
                t.payload = zeros.view(len(payload))
        else:
            size = t.payload_len() + HEADER_BYTES  # a SACK stays its fields
        body = t.body
        if body is not None:  # sealed: the security trailer too
            size += trailer_length(body)
        # the NIC's packet goes on the fabric itself: its fabric fields are still their defaults (every
        # transmission the core emits is a new object)
        ev = t.ev
        t.src = self.id
        if len(ev) == 32 and ev[16:32] == _NO_SEGMENT:
            t.route_by_ev()  # no 128-bit int a packet (48 bytes, a new one at each switch's shift)
        else:
            t.addr = int.from_bytes(ev[:16], "big")
            if len(ev) > 16 and ev[16:32] != _NO_SEGMENT:
                t.seg = int.from_bytes(ev[16:32], "big")
                size += SRH_BYTES
        t.wire_size = size
        if self.tap is not None:
            self.tap(self, t, True)
        self.ports[t.port - 1].send(t, now)


SimNic = Host
"""The name the architecture gives a simulated host's NIC: one port per plane around a `transport.Nic`."""
