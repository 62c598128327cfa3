"""Output ports: one direction of a link, its queue (serialisation, ECN, trimming, drops, loss, the epoch a
failure bumps) and priority flow control; `Node`, anything a port leads to. The nodes themselves (switches,
hosts) are in `openmrc.sim.network`.

Theory of operation (one event per hop)
---------------------------------------
An output port is FIFO, so a packet's departure is ``max(arrival, free_at) + size/rate`` and the bytes
queued when it arrives are ``(free_at − arrival)·rate``: enough to decide at arrival time whether it is
ECN-marked (RED between ``ecn_low`` and ``ecn_high``, never on a host's last hop), trimmed (payload cut,
header forwarded as control, marked last-hop on a T0's host-facing port) or dropped (buffer full and
trimming off). Control packets (ACK/SACK/NACK/probes and trimmed headers) use a second, priority
``free_at`` and are never trimmed. The only event is the packet's arrival at the far end of the link
(propagation ``latency_ns`` after departure), handed to the peer `Node`.

Priority flow control (lossless fabrics, `Port.enable_pfc`)
-----------------------------------------------------------
A RoCEv2 fabric usually runs lossless: an 802.1Qbb PAUSE stops the upstream port instead of a drop. That
needs real queues, so a port with PFC keeps its packets in FIFOs (control first, data when not paused) and
serialises them one at a time (one more event per hop). Each data packet waiting at a node is charged to
the port it came in on (the upstream port's ``rx_bytes``, the ingress accounting of the downstream
switch); above ``xoff`` bytes a PAUSE travels back over that link (it takes effect one propagation delay
later, after the packet on the wire), below ``xon`` a RESUME. Nothing is dropped or trimmed for lack of
buffer; ECN marking (RED on the queue, for DCQCN) still applies. Control packets (ACKs, CNPs) use a
priority that is never paused. A host port that is paused with data waiting reports ``free_at =
PAUSED`` so its NIC pulls nothing more, and its ``on_resume`` callback restarts the NIC.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, cast

from mypy_extensions import mypyc_attr

from openmrc.fabric.ecmp import fmix32, mul32
from openmrc.transport import Transmit, TrimMark
from openmrc.wire.security import trailer_length

if TYPE_CHECKING:
    from openmrc.sim.engine import Simulator

__all__ = [
    "HEADER_BYTES",
    "PAUSED",
    "UNLIMITED",
    "Crossing",
    "Node",
    "OrderedPort",
    "Pfc",
    "Port",
    "PortCold",
]

#: Bytes on the wire besides the payload (Ethernet + IPv6 + SRH-less SRv6 outer + UDP + MRC headers), so
#: a 4,086-byte payload makes htsim's 4,150-byte packet.
HEADER_BYTES: Final = 64
PAUSED: Final = 1 << 61
"""A PFC port's ``free_at`` while it is paused with data waiting (later than any run)."""
UNLIMITED: Final = 1 << 61
"""A buffer size or ECN threshold no queue reaches. Below ``2**62``, as every bound compared per packet:
the compiled build keeps such integers unboxed (``1 << 62`` would send each comparison through a Python
integer comparison)."""

_M32: Final = 0xFFFFFFFF
_GOLDEN32: Final = 0x9E3779B1
_INV_2_32: Final = 1.0 / (1 << 32)
"""A 32-bit draw times this is in [0, 1)."""


class Crossing:
    """Where a port whose peer runs in another process hands the packets it delivers
    (`openmrc.sim.partition`), in place of scheduling their arrival."""

    def ship(self, at: int, p: Transmit, guarded: bool) -> None:  # pragma: no cover - partition overrides
        """``p`` reaches the peer at ``at`` (``guarded``: through the port's epoch check, `Port._deliver`)."""
        raise NotImplementedError


class Port:
    """One direction of a link: the output queue of its node and the pipe to the peer."""

    __slots__ = (
        "_arrive",
        "_cold",
        "cross",
        "ctrl_free_at",
        "drops",
        "free_at",
        "guarded",
        "last_hop",
        "marks",
        "peer",
        "pfc",
        "sent_bytes",
        "sent_packets",
        "trimming",
        "trims",
        "up",
    )

    def __init__(
        self,
        sim: Simulator,
        peer: Node,
        bps: int,
        latency_ns: int,
        *,
        buffer: int,
        ecn: tuple[int, int] | None,
        trimming: bool,
        last_hop: bool,
        rng: random.Random | None,
        shared: dict[tuple[int, ...], PortCold] | None = None,
    ) -> None:
        """``shared``: the `PortCold` of ports built alike so far, by what makes them alike (a fabric's
        builder passes one dict for all its ports)."""
        self.peer = peer
        arrive = peer.arrive_cb
        if arrive is None:  # bound once per node, shared by every port leading there (millions of ports)
            arrive = peer.arrive_cb = peer.arrive
        self._arrive = arrive
        # no ECN marking on a host's last hop (MRC rule): thresholds no queue reaches
        ecn_low, ecn_high = ecn if ecn is not None and not last_hop else (UNLIMITED, UNLIMITED)
        if bps <= 0:
            raise ValueError(f"link rate {bps} b/s must be positive")
        if shared is None:
            cold = PortCold(sim, bps, latency_ns, buffer, ecn_low, ecn_high, rng)
        else:  # made once per kind of port (a fabric builds millions of ports of a few kinds)
            key = (id(sim), bps, latency_ns, buffer, ecn_low, ecn_high, 0 if rng is None else id(rng))
            got = shared.get(key)
            if got is None:
                got = shared[key] = PortCold(sim, bps, latency_ns, buffer, ecn_low, ecn_high, rng)
                got.shared = True
            cold = got
        self._cold = cold
        self.trimming = trimming
        self.last_hop = last_hop
        self.up = True  # (the flags side by side: the compiled build packs them into one word)
        self.guarded = False  # True once a failure may hit this port: arrivals then check `epoch`
        self.cross: Crossing | None = None
        """Set when the peer runs in another process: the packets go there through it."""
        self.free_at = 0
        self.ctrl_free_at = 0
        self.drops = 0
        self.trims = 0
        self.marks = 0
        self.sent_bytes = 0
        self.sent_packets = 0
        # priority flow control: off unless `enable_pfc` makes its state (a fabric has millions of ports)
        self.pfc: Pfc | None = None

    # -- what a port seldom reads or writes lives in its `PortCold` ---------------------------------------
    def _own(self) -> PortCold:
        """The port's `PortCold`, copied first if other ports share it (before a write)."""
        c = self._cold
        if c.shared:
            c = self._cold = c.copy()
        return c

    @property
    def sim(self) -> Simulator:
        return self._cold.sim

    @property
    def latency(self) -> int:
        """Propagation delay, ns."""
        return self._cold.latency

    @property
    def buffer(self) -> int:
        """Bytes the queue holds (data beyond it is trimmed or dropped)."""
        return self._cold.buffer

    @buffer.setter
    def buffer(self, v: int) -> None:
        if v != self._cold.buffer:
            self._own().buffer = v

    @property
    def ecn_low(self) -> int:
        """Queued bytes from which data packets may be ECN-marked (RED up to ``ecn_high``)."""
        return self._cold.ecn_low

    @ecn_low.setter
    def ecn_low(self, v: int) -> None:
        if v != self._cold.ecn_low:
            self._own().ecn_low = v

    @property
    def pace_ns(self) -> int:
        """One full packet's serialisation (what a host's NIC paces by)."""
        return self._cold.pace_ns

    @property
    def byte_num(self) -> int:
        """A byte takes ``byte_num / byte_den`` ns (`set_rate`)."""
        return self._cold.byte_num

    @property
    def byte_den(self) -> int:
        return self._cold.byte_den

    @property
    def loss(self) -> float:
        """The probability that a packet sent here is lost (`set_loss`)."""
        return self._cold.loss

    @property
    def bps(self) -> int:
        """The link's rate now (`set_rate`)."""
        return self._cold.bps

    @property
    def nominal_bps(self) -> int:
        """The rate it was built with."""
        return self._cold.nominal_bps

    @property
    def ecn_high(self) -> int:
        """Queued bytes from which every data packet is ECN-marked (RED from ``ecn_low``)."""
        return self._cold.ecn_high

    @ecn_high.setter
    def ecn_high(self, v: int) -> None:
        if v != self._cold.ecn_high:
            self._own().ecn_high = v

    @property
    def rng(self) -> random.Random | None:
        """Where loss and ECN draws come from (shared by the ports of a default run); None: its own
        stream (an ordered run's port: seeded with its ``seed``, made at the first draw, per port: millions
        of ports, few ever draw; any other: seed 0)."""
        return self._cold.rng

    @rng.setter
    def rng(self, v: random.Random | None) -> None:
        self._own().set_rng(v)

    @property
    def epoch(self) -> int:
        """Bumped each time the port goes down, so packets queued or in flight are lost."""
        return self._cold.epoch

    @epoch.setter
    def epoch(self, v: int) -> None:
        self._own().epoch = v

    @property
    def down_drop_at(self) -> int | None:
        """When the last data packet was sent into this port while down."""
        return self._cold.down_drop_at

    @down_drop_at.setter
    def down_drop_at(self, v: int | None) -> None:
        self._own().down_drop_at = v

    @property
    def losses(self) -> int:
        """Packets lost to ``loss``."""
        return self._cold.losses

    @losses.setter
    def losses(self, v: int) -> None:
        self._own().losses = v

    @property
    def _deliver_cb(self) -> Callable[[Transmit], None] | None:
        """``_deliver`` bound once, when the port is first guarded."""
        return self._cold.deliver_cb

    @_deliver_cb.setter
    def _deliver_cb(self, v: Callable[[Transmit], None] | None) -> None:
        self._own().deliver_cb = v

    def enable_pfc(self, xoff: int, xon: int, on_resume: Callable[[None], None] | None = None) -> None:
        """Make this port lossless: queue and serialise packets, obey PAUSE frames, and have the peer pause
        this port while more than ``xoff`` bytes it delivered wait there (resume at ``xon``). ``on_resume``
        (a host's) is called when a PAUSE ends."""
        if not 0 <= xon < xoff:
            raise ValueError(f"PFC thresholds: need 0 <= xon ({xon}) < xoff ({xoff})")
        self.pfc = Pfc(self, xoff, xon, on_resume)
        self.trimming = False
        self.buffer = UNLIMITED  # lossless: the thresholds, not the buffer, stop the senders

    def set_up(self, up: bool) -> None:
        """Link state of this direction; going down loses what is queued on or travelling along it."""
        if self.up and not up:
            self.epoch += 1
            now = self.sim.now
            self.free_at = min(self.free_at, now)  # its queue is gone with the packets in it
            self.ctrl_free_at = min(self.ctrl_free_at, now)
        self.guarded = True
        was = self.up
        self.up = up
        q = self.pfc
        if q is not None:
            if was and not up:  # what waits here is lost with the link
                while q.queue:
                    self._pfc_release(q.queue.popleft(), self.sim.now)
                    self.drops += 1
                self.drops += len(q.ctrl_queue)
                q.ctrl_queue.clear()
                q.queued_bytes = 0
            self._pfc_free_at(self.sim.now)

    def set_rate(self, bps: int) -> None:
        """Run the link at ``bps`` (a degraded link keeps its latency and buffer)."""
        if bps <= 0:
            raise ValueError(f"link rate {bps} b/s must be positive")
        if bps != self._cold.bps:
            self._own().set_rate(bps)

    def set_loss(self, probability: float) -> None:
        """Lose each packet sent on this direction with ``probability`` (bit errors, a bad optic)."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"loss probability {probability} is not within [0, 1]")
        if probability != self._cold.loss:
            self._own().loss = probability

    def send(self, p: Transmit, now: int) -> None:
        if not self.up:
            self.drops += 1
            if p.is_data:
                self.down_drop_at = now
            return
        if self.pfc is not None:
            self._pfc_send(p, now)
            return
        size = p.wire_size
        free = self.free_at
        if free < now:
            free = now
        if p.is_data and not p.trim:
            queued = (free - now) * self.byte_den // self.byte_num
            if queued + size > self.buffer:
                if not self.trimming:
                    self.drops += 1
                    return
                self.trims += 1
                p.trim = TrimMark.TRIMMED_LASTHOP if self.last_hop else TrimMark.TRIMMED
                p.wire_size = size = HEADER_BYTES if p.body is None else HEADER_BYTES + trailer_length(p.body)
            else:
                if queued > self.ecn_low:
                    self._red(p, queued)
                self.free_at = done = free + size * self.byte_num // self.byte_den
                size = 0  # marks the data path taken
        if size:  # control, or a packet just trimmed to its header: the priority queue
            ser = size * self.byte_num // self.byte_den
            start = self.ctrl_free_at if self.ctrl_free_at > now else now
            self.ctrl_free_at = done = start + ser
            self.free_at = free + ser  # control takes the wire too
        self.sent_bytes += p.wire_size
        self.sent_packets += 1
        if self.loss and self._random() < self.loss:
            self.losses += 1
            return
        if self.cross is not None:
            if self.guarded:
                p.epoch = self.epoch
            self.cross.ship(done + self.latency, p, self.guarded)
            return
        if self.guarded:
            p.epoch = self.epoch
            cb = self._deliver_cb
            if cb is None:
                cb = self._deliver_cb = self._deliver
            self.sim.push_from(done + self.latency, cb, p, self.origin())
        else:
            self.sim.push_from(done + self.latency, self._arrive, p, self.origin())

    def enter(self, p: Transmit) -> None:
        """``p`` joins this port's queue now: its switch routed it when it was sent there (a switch a split
        run shares out by port: `openmrc.sim.parallel.exchange._Splitter`)."""
        self.send(p, self._cold.sim.now)

    def origin(self) -> int:
        """Who schedules this port's deliveries, for an ordered engine (`OrderedPort`)."""
        return 0

    def _random(self) -> float:
        rand = self._cold.rand
        if rand is None:
            return self._draw()
        return rand()

    def _draw(self) -> float:
        """A draw from the port's own stream when it has no ``rng``, made at the first draw (seed 0)."""
        c = self._own()
        c.set_rng(random.Random(0))
        return self._random()

    def _red(self, p: Transmit, queued: int) -> None:
        """RED above ``ecn_low`` bytes queued: mark ``p`` with a probability rising to 1 at ``ecn_high``."""
        if queued >= self.ecn_high or self._random() * (self.ecn_high - self.ecn_low) < queued - self.ecn_low:
            p.ecn = True
            self.marks += 1

    def _deliver(self, p: Transmit) -> None:
        if p.epoch == self.epoch:
            self.peer.arrive(p)
        else:
            self.drops += 1

    # -- priority flow control -----------------------------------------------------------------------------
    def _pfc_send(self, p: Transmit, now: int) -> None:
        q = self.pfc
        assert q is not None  # a PFC port's
        if p.is_data and not p.trim:
            queued = q.queued_bytes
            if queued > self.ecn_low:
                self._red(p, queued)
            q.queue.append(p)
            q.queued_bytes = queued = queued + p.wire_size
            if queued > q.max_queued:
                q.max_queued = queued
            ing = cast("Port | None", p.hop)
            iq = ing.pfc if ing is not None else None
            if ing is not None and iq is not None:  # charge the ingress; pause it past xoff
                iq.rx_bytes += p.wire_size
                if not iq.pause_sent and iq.rx_bytes > iq.xoff:
                    iq.pause_sent = True
                    self.sim.push(now + ing.latency, iq.pause_cb, True)
        else:
            q.ctrl_queue.append(p)
        if q.busy_until < 0:
            self._pfc_next(now)
        self._pfc_free_at(now)

    def _pfc_release(self, p: Transmit, now: int) -> None:
        """``p`` leaves this node's buffer: uncharge its ingress, and resume it below xon."""
        ing = cast("Port | None", p.hop)
        iq = ing.pfc if ing is not None else None
        if ing is not None and iq is not None:
            iq.rx_bytes -= p.wire_size
            if iq.pause_sent and iq.rx_bytes <= iq.xon:
                iq.pause_sent = False
                self.sim.push(now + ing.latency, iq.pause_cb, False)

    def _pfc_next(self, now: int) -> None:
        """Start serialising the next packet: control first, data unless paused."""
        q = self.pfc
        assert q is not None
        if q.ctrl_queue:
            p = q.ctrl_queue.popleft()
        elif q.queue and not q.paused:
            p = q.queue.popleft()
            q.queued_bytes -= p.wire_size
            self._pfc_release(p, now)
        else:
            q.busy_until = -1
            return
        q.busy_until = done = now + p.wire_size * self.byte_num // self.byte_den
        p.epoch = self.epoch
        self.sim.push(done, q.done_cb, p)

    def _pfc_done(self, p: Transmit) -> None:
        now = self.sim.now
        if p.epoch != self.epoch:
            self.drops += 1  # the link went down while it was on the wire
        else:
            self.sent_bytes += p.wire_size
            self.sent_packets += 1
            if self.loss and self._random() < self.loss:
                self.losses += 1
            else:
                q = self.pfc
                assert q is not None
                self.sim.push(now + self.latency, q.deliver_cb, p)
        self._pfc_next(now)
        self._pfc_free_at(now)

    def _pfc_deliver(self, p: Transmit) -> None:
        if p.epoch == self.epoch:
            p.hop = self
            self.peer.arrive(p)
        else:
            self.drops += 1

    def _pfc_pause(self, on: bool) -> None:
        """A PAUSE (``on``) or RESUME frame from the peer takes effect."""
        q = self.pfc
        assert q is not None
        now = self.sim.now
        resumed = not on and q.paused
        if on and not q.paused:
            q.paused = True
            q.paused_since = now
            q.pauses += 1
        elif resumed:
            q.paused = False
            q.paused_ns += now - q.paused_since
            if q.busy_until < 0:
                self._pfc_next(now)
        self._pfc_free_at(now)
        if resumed and q.on_resume is not None:
            q.on_resume(None)

    def _pfc_free_at(self, now: int) -> None:
        """When this port could take a packet without queueing (what a NIC's pacing reads)."""
        q = self.pfc
        assert q is not None
        if q.paused and q.queue:
            self.free_at = PAUSED
        else:
            waiting = q.queued_bytes + sum(c.wire_size for c in q.ctrl_queue)
            self.free_at = max(q.busy_until, now) + waiting * self.byte_num // self.byte_den

    def paused_total_ns(self, now: int) -> int:
        """Time this port spent paused up to ``now``."""
        q = self.pfc
        if q is None:
            return 0
        return q.paused_ns + (now - q.paused_since if q.paused else 0)

    @property
    def pauses(self) -> int:
        """PAUSE frames that stopped this port (0 without PFC; the rest of its PFC state is ``pfc``'s)."""
        return self.pfc.pauses if self.pfc is not None else 0


class OrderedPort(Port):
    """A port of an ordered run (`Simulator.order_by_origin`), with what only such a run reads: who
    schedules its deliveries and its own stream of draws (a split run's draws must not depend on which
    other ports a process runs). Three fields a port that other runs do without (a fabric has millions
    of ports). `place` sets them, after the port is built."""

    __slots__ = ("_origin", "seed", "state")

    def place(self, origin: int, seed: int) -> None:
        """``origin``: its node's id + 1; ``seed``: seeds its stream of draws when it has no ``rng``."""
        self._origin = origin
        self.seed = seed
        self.state = 0
        """That stream's state (xorshift32, never 0 once drawn from), in the port itself: a generator of
        its own (2.5 KB of Mersenne Twister a port) was seldom in the cache when the port drew."""

    def origin(self) -> int:
        return self._origin

    def _draw(self) -> float:
        x = self.state
        if not x:  # its first draw: a state of the seed's 64 bits, mixed (and never 0)
            seed = self.seed
            x = fmix32((mul32(seed & _M32, _GOLDEN32) + ((seed >> 32) & _M32)) & _M32) or 1
        x ^= (x << 13) & _M32
        x ^= x >> 17
        x ^= (x << 5) & _M32
        self.state = x
        return x * _INV_2_32


class PortCold:
    """What a `Port` reads once a packet or less and seldom writes: its simulator, propagation delay,
    buffer, RED thresholds and rates, where its draws come from, the state of a port that failed or loses
    packets. Ports built alike share one (a fabric has millions of ports, and almost all of them keep
    these as built); a port copies its own before it changes one (`Port._own`)."""

    __slots__ = (
        "bps",
        "buffer",
        "byte_den",
        "byte_num",
        "deliver_cb",
        "down_drop_at",
        "ecn_high",
        "ecn_low",
        "epoch",
        "latency",
        "loss",
        "losses",
        "nominal_bps",
        "pace_ns",
        "rand",
        "rng",
        "shared",
        "sim",
    )

    def __init__(
        self,
        sim: Simulator,
        bps: int,
        latency: int,
        buffer: int,
        ecn_low: int,
        ecn_high: int,
        rng: random.Random | None,
    ) -> None:
        self.sim = sim
        self.loss = 0.0
        self.nominal_bps = bps
        self.set_rate(bps)
        self.latency = latency
        self.buffer = buffer
        self.ecn_low = ecn_low
        self.ecn_high = ecn_high
        self.rng = rng
        self.rand: Callable[[], float] | None = None if rng is None else rng.random
        """``rng.random``, bound once (a compiled call looks a method up by name on every call)."""
        self.epoch = 0
        self.losses = 0
        self.down_drop_at: int | None = None
        self.deliver_cb: Callable[[Transmit], None] | None = None
        self.shared = False

    def set_rng(self, rng: random.Random | None) -> None:
        self.rng = rng
        self.rand = None if rng is None else rng.random

    def set_rate(self, bps: int) -> None:
        self.bps = bps
        self.pace_ns = 4160 * 8_000_000_000 // bps
        # a byte takes 8e9/bps ns, kept as the reduced fraction byte_num/byte_den: the same floor as
        # ``n * 8_000_000_000 // bps`` with small factors (the compiled build multiplies those natively,
        # 8e9 and 100e9 would go through Python's big integers)
        g = math.gcd(8_000_000_000, bps)
        self.byte_num = 8_000_000_000 // g
        self.byte_den = bps // g

    def copy(self) -> PortCold:
        c = PortCold(
            self.sim,
            self.nominal_bps,
            self.latency,
            self.buffer,
            self.ecn_low,
            self.ecn_high,
            self.rng,
        )
        c.set_rate(self.bps)
        c.loss, c.epoch, c.losses = self.loss, self.epoch, self.losses
        c.down_drop_at, c.deliver_cb = self.down_drop_at, self.deliver_cb
        return c


class Pfc:
    """A lossless port's queues, PAUSE state and counters (`Port.enable_pfc`)."""

    __slots__ = (
        "busy_until",
        "ctrl_queue",
        "deliver_cb",
        "done_cb",
        "max_queued",
        "on_resume",
        "pause_cb",
        "pause_sent",
        "paused",
        "paused_ns",
        "paused_since",
        "pauses",
        "queue",
        "queued_bytes",
        "rx_bytes",
        "xoff",
        "xon",
    )

    def __init__(self, port: Port, xoff: int, xon: int, on_resume: Callable[[None], None] | None) -> None:
        self.queue: deque[Transmit] = deque()
        self.ctrl_queue: deque[Transmit] = deque()
        self.queued_bytes = self.max_queued = 0
        self.busy_until = -1  # end of the packet being serialised (-1: idle)
        self.paused = False
        self.pause_sent = False
        self.rx_bytes = 0
        self.xoff, self.xon = xoff, xon
        self.pauses = self.paused_ns = self.paused_since = 0
        self.on_resume = on_resume
        self.deliver_cb: Callable[[Transmit], None] = port._pfc_deliver  # bound once, not per packet
        self.done_cb: Callable[[Transmit], None] = port._pfc_done
        self.pause_cb: Callable[[bool], None] = port._pfc_pause


@mypyc_attr(allow_interpreted_subclasses=True)  # custom nodes (sinks, taps) may be plain Python
class Node:
    """Anything a port can lead to."""

    __slots__ = ("arrive_cb", "id", "ports")

    def __init__(self, node_id: int) -> None:
        self.id = node_id
        self.ports: list[Port] = []
        self.arrive_cb: Callable[[Transmit], None] | None = None
        """``arrive`` bound once: what the ports leading here schedule."""

    def arrive(self, p: Transmit) -> None:  # pragma: no cover - every node kind overrides
        raise NotImplementedError
