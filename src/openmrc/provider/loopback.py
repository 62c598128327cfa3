"""A scripted loopback: two transport `Nic`s joined by a fabric model with per-port and per-EV impairments.

Used by the tests (the pair harness), the transport benchmark and the demo.

Time is scripted (integer ns), randomness comes from one seeded `random.Random`, so every run is
reproducible. Each NIC port (plane) has a serialisation queue at ``link_bps`` and a propagation delay;
impairments act per packet: loss, duplication, random extra delay (reordering), trimming (data packets lose
their payload and arrive marked), ECN marking, bit flips (wire mode), and failures of a whole port or of
single EVs from a time on (optionally until a recovery time).

In wire mode every packet travels as the bytes a UDP socket would carry: sealed with the real ICRC for its
addressing (each NIC port has an IPv6 address of its own, the UDP source port and flow label come from the
EV) and handed to `Nic.receive_datagram`, which checks it.

*Host stalls* (`HostStalls`) model a software NIC on a busy host: its process is descheduled from time to
time and runs nothing then (no receive, no timer, no send). What arrives meanwhile waits in one socket
queue per port, and when the process runs again it reads the queues in turns of a few packets per port,
as `openmrc.provider.udp` does, handing each packet the time the kernel stamped on its arrival (or, without
kernel timestamps, the time it is read); late timers fire then, and the packets it may send leave.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any

from openmrc.provider.bringup import connect_qp
from openmrc.provider.faults import Impairments, fates, flip_bit
from openmrc.transport.config import NicConfig
from openmrc.transport.nic import Nic
from openmrc.transport.qp import Qp, QpInitAttr
from openmrc.transport.security import QpSecurity
from openmrc.transport.types import (
    Access,
    RecvWR,
    SackTransmit,
    SendFlags,
    SendWR,
    Sge,
    Transmit,
    TrimMark,
    WorkCompletion,
    WrOpcode,
)
from openmrc.wire import DATA_OPCODES, Addressing, Packet, seal, trim_datagram

__all__ = ["Fabric", "HostStalls", "Impairments", "Pair", "port_address"]

_DATA = frozenset(int(o) for o in DATA_OPCODES)
_NO_ICRC = bytes(4)  # (the trailer `seal` replaces)


def port_address(nic: str, port: int) -> str:
    """The IPv6 address of port ``port`` of NIC ``nic`` ("a" or "b") in wire mode (documentation prefix)."""
    return f"2001:db8:0:{port:x}::{nic}"


def _other(nic: str) -> str:
    return "b" if nic == "a" else "a"


@dataclasses.dataclass(frozen=True)
class HostStalls:
    """When a NIC's host does not run it: stalls of about ``length_ns`` (uniformly 0.5-1.5 times) about every
    ``every_ns`` (the same spread), drawn from ``seed``."""

    every_ns: int
    length_ns: int
    turn: int = 4
    """Packets read from one port's queue before the next port's turn (`openmrc.provider.udp` reads four
    GRO batches)."""
    kernel_time: bool = True
    """Hand each packet the time it arrived (a kernel receive timestamp) rather than the time it is read."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.every_ns <= 0 or self.length_ns <= 0 or self.turn < 1:
            raise ValueError(f"HostStalls: every_ns, length_ns and turn must be positive: {self!r}")


class _Host:
    """A NIC's host under `HostStalls`: its current (or next) stall and the packets waiting for it."""

    def __init__(self, stalls: HostStalls, ports: int) -> None:
        self.stalls = stalls
        self.rng = random.Random(stalls.seed)
        self.start = self.end = 0
        self._next(0)
        self.queues: list[list[tuple[int, tuple[Any, ...]]]] = [[] for _ in range(ports + 1)]
        self.waiting = 0
        self.fed = 0  # the last time handed to the NIC

    def _next(self, after: int) -> None:
        s, r = self.stalls, self.rng
        self.start = after + int(s.every_ns * r.uniform(0.5, 1.5))
        self.end = self.start + max(1, int(s.length_ns * r.uniform(0.5, 1.5)))

    def awake_at(self, t: int) -> int:
        """``t``, or the end of the stall that ``t`` falls in."""
        while self.end <= t:
            self._next(self.end)
        return self.end if self.start <= t else t


class Fabric:
    """Delivers `Transmit`s between NICs with serialisation, propagation and impairments."""

    def __init__(
        self,
        rng: random.Random,
        imp: Impairments,
        *,
        latency_ns: int = 2_000,
        link_bps: int = 100_000_000_000,
        wire: bool = False,
    ) -> None:
        self.rng = rng
        self.imp = imp
        self.latency = latency_ns
        self.link_bps = link_bps
        self.wire = wire
        self.events: list[tuple[int, int, Nic, object, int, bool, int, TrimMark, str, Addressing | None]] = []
        self.free_at: dict[tuple[int, int], int] = {}
        self.seq = itertools.count()
        self.sent = 0
        self.dropped = 0
        self.trimmed = 0
        self.corrupted = 0
        """Packets with one bit flipped where the ICRC covers it (every one must be dropped)."""
        self.corrupted_variant = 0
        """Packets with a bit of BTH byte 4 flipped: not covered by the ICRC, and ignored by MRC."""
        self.per_entropy: dict[int, int] = {}
        self.observers: list[Callable[[Nic, object, int, int, dict[str, Any]], None]] = []
        """Called before each delivery with (destination NIC, packet or bytes, port, time, keywords)."""

    def send(self, src: Nic, dst: Nic, t: Transmit, now: int, src_name: str) -> None:
        imp, rng = self.imp, self.rng
        pkt = t.packet
        self.sent += 1
        self.per_entropy[t.entropy] = self.per_entropy.get(t.entropy, 0) + 1
        size = len(pkt.payload) + 64
        key = (id(src), t.port)
        start = max(now, self.free_at.get(key, 0))
        depart = start + size * 8 * 1_000_000_000 // self.link_bps
        self.free_at[key] = depart
        is_data = pkt.bth.opcode in _DATA
        if imp.corrupt and not self.wire:
            raise ValueError("Impairments.corrupt flips bits of bytes: it needs a wire-mode fabric")
        copies = fates(imp, rng, now, t.port, t.entropy, is_data)
        if not copies:
            self.dropped += 1
            return
        body = t.body  # sealed by an authenticated QP: it travels as bytes, wire mode or not
        for fate in copies:
            trim = fate.trim
            obj: object = pkt
            if trim:
                obj = dataclasses.replace(pkt, payload=memoryview(b""))
                self.trimmed += 1
            addr = None
            if self.wire or body is not None:
                addr = Addressing(
                    port_address(src_name, t.port), port_address(_other(src_name), t.port), t.entropy & 0xFFFF
                )
                raw = seal(pkt if body is None else body + _NO_ICRC, addr)
                if trim:
                    raw = trim_datagram(raw)
                if fate.corrupt:
                    raw, byte = flip_bit(raw, rng)
                    if byte == 4:  # BTH byte 4 (FECN, BECN): variant, masked out of the ICRC by design
                        self.corrupted_variant += 1
                    else:
                        self.corrupted += 1
                obj = raw
            arrive = depart + self.latency + fate.delay
            heapq.heappush(
                self.events,
                (arrive, next(self.seq), dst, obj, t.port, fate.ecn, t.entropy, trim, src_name, addr),
            )

    def next_time(self) -> int | None:
        return self.events[0][0] if self.events else None

    def deliver_until(
        self, now: int, hold: Callable[[Nic, int, tuple[Any, ...]], bool] | None = None
    ) -> None:
        """Hand every packet that has arrived by ``now`` to its NIC (``hold``: takes it instead when it
        returns True, for a host that does not run now)."""
        ev = self.events
        while ev and ev[0][0] <= now:
            e = heapq.heappop(ev)
            dst, obj, port = e[2], e[3], e[4]
            kw: dict[str, Any] = {"ecn": e[5], "entropy": e[6], "trim": e[7], "src": e[8]}
            for observe in self.observers:
                observe(dst, obj, port, now, kw)
            if hold is None or not hold(dst, now, e):
                self.hand(e, now)

    @staticmethod
    def hand(e: tuple[Any, ...], at: int) -> None:
        """Give the arrival ``e`` (an `events` entry) to its NIC at time ``at``."""
        _t, _s, dst, obj, port, ecn, entropy, trim, src, addr = e
        if isinstance(obj, Packet):
            dst.receive(obj, port, at, ecn, entropy, trim, src)
        else:
            assert addr is not None and isinstance(obj, bytes)
            dst.receive_datagram(obj, port, at, addr, ecn=ecn, flow_label=entropy >> 16, trim=trim, src=src)


class Pair:
    """Two NICs, ``a`` and ``b``, with one connected QP each and a registered buffer on each side."""

    def __init__(
        self,
        *,
        seed: int = 1,
        ports: int = 4,
        buf_size: int = 1 << 20,
        imp: Impairments | None = None,
        config: NicConfig | None = None,
        latency_ns: int = 2_000,
        link_bps: int = 100_000_000_000,
        wire: bool = False,
        timeout: int = 8,
        retry_linear: int = 7,
        retry_exp: int = 25,
        mpr: int = 8,
        sq_psn: int = 0,
        rq_psn: int = 0,
        max_wimm: int = 0,
        max_wimm_dest: int = 0,
        access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE,
        stalls: dict[str, HostStalls] | None = None,
        security: tuple[QpSecurity, QpSecurity] | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        cfg = config or NicConfig()
        self.a = Nic(ports, rng=random.Random(seed * 7 + 1), config=cfg)
        self.b = Nic(ports, rng=random.Random(seed * 7 + 2), config=cfg)
        self.fabric = Fabric(
            self.rng, imp or Impairments(), latency_ns=latency_ns, link_bps=link_bps, wire=wire
        )
        self.now = 0
        self.src = bytearray(self.rng.randbytes(buf_size))
        self.dst = bytearray(buf_size)
        self.mr_a = self.a.register(self.src, Access.LOCAL_WRITE)
        self.mr_b = self.b.register(self.dst, access)
        self.qp_a = self._qp(self.a)
        self.qp_b = self._qp(self.b)
        sec_a, sec_b = security if security is not None else (None, None)
        for qp, peer, peer_name, psn_out, psn_in, sec in (
            (self.qp_a, self.qp_b, "b", sq_psn, rq_psn, sec_a),
            (self.qp_b, self.qp_a, "a", rq_psn, sq_psn, sec_b),
        ):
            connect_qp(
                qp,
                peer_name,
                peer.qp_num,
                rq_psn=psn_in,
                sq_psn=psn_out,
                mpr=mpr,
                mpr_dest=mpr,
                max_wimm=max_wimm,
                max_wimm_dest=max_wimm_dest,
                timeout=timeout,
                retry_linear=retry_linear,
                retry_exp=retry_exp,
                security=sec,
            )
        self.wr_id = itertools.count(1)
        self.hosts: dict[int, _Host] = {}
        """By `id` of the NIC: the hosts that stall (``stalls``, by NIC name "a" / "b")."""
        for name, s in (stalls or {}).items():
            self.hosts[id(self._nic(name))] = _Host(s, ports)

    def _nic(self, name: str) -> Nic:
        if name not in ("a", "b"):
            raise ValueError(f"no NIC {name!r} (a or b)")
        return self.a if name == "a" else self.b

    def _qp(self, nic: Nic) -> Qp:
        return nic.create_qp(QpInitAttr(send_cq=nic.create_cq(), recv_cq=nic.create_cq()))

    # -- work ------------------------------------------------------------------------------------------------
    def write(
        self,
        offset: int,
        length: int,
        dst_offset: int | None = None,
        *,
        imm: int | None = None,
        signaled: bool = True,
        rkey: int | None = None,
        remote_addr: int | None = None,
    ) -> int:
        wr_id = next(self.wr_id)
        dst_off = offset if dst_offset is None else dst_offset
        self.qp_a.post_send(
            SendWR(
                wr_id,
                WrOpcode.RDMA_WRITE_WITH_IMM if imm is not None else WrOpcode.RDMA_WRITE,
                [Sge(self.mr_a.addr + offset, length, self.mr_a.lkey)],
                self.mr_b.addr + dst_off if remote_addr is None else remote_addr,
                self.mr_b.rkey if rkey is None else rkey,
                imm,
                SendFlags.SIGNALED if signaled else SendFlags.NONE,
            ),
            now=self.now,
        )
        return wr_id

    def post_recv(self, n: int = 1) -> None:
        for _ in range(n):
            self.qp_b.post_recv(RecvWR(next(self.wr_id)))

    # -- the event loop ----------------------------------------------------------------------------------
    def step(self) -> bool:
        """Advance to the next event; False when nothing is left to happen. Raises `AssertionError` if a
        NIC breaks the timer contract (after ``handle_timer(now)`` its deadline is None or after ``now``)."""
        hosts = self.hosts
        for nic, other, name in ((self.a, self.b, "a"), (self.b, self.a, "b")):
            h = hosts.get(id(nic))
            if h is not None and h.awake_at(self.now) != self.now:
                continue  # stalled: sends nothing
            for t in nic.datagrams_to_send(self.now):
                if type(t) is SackTransmit and t.arrived > 0:
                    t.stamp_service(self.now)  # as a driver does when the SACK leaves
                self.fabric.send(nic, other, t, self.now, name)
        for nic in (self.a, self.b):  # `timer_floor`: never after the deadline, -1 once none is left
            floor, deadline = nic.timer_floor(), nic.get_timer()
            if not (0 <= floor <= deadline if deadline is not None else nic.timer_floor() < 0):
                raise AssertionError(f"timer floor {floor} against the deadline {deadline}")
        times = [t for t in (self.fabric.next_time(),) if t is not None]
        for nic in (self.a, self.b):
            due = nic.get_timer()
            h = hosts.get(id(nic))
            if h is not None:
                if due is not None:
                    due = h.awake_at(due)  # a stalled host's timer fires when it runs again
                if h.waiting:
                    w = h.awake_at(self.now)
                    due = w if due is None or w < due else due
            if due is not None:
                times.append(due)
        if not times:
            return False
        self.now = max(self.now, min(times))
        if hosts:
            self.fabric.deliver_until(self.now, self._hold)
        else:
            self.fabric.deliver_until(self.now)
        for h in hosts.values():
            if h.waiting and h.awake_at(self.now) == self.now:
                self._drain(h)
        for nic in (self.a, self.b):
            h = hosts.get(id(nic))
            if h is not None and h.awake_at(self.now) != self.now:
                continue
            timer = nic.get_timer()
            if timer is not None and timer <= self.now:
                nic.handle_timer(self.now)
                after = nic.get_timer()  # the driver contract: the next deadline lies in the future
                if after is not None and after <= self.now:
                    raise AssertionError(f"timer contract broken: deadline {after} ≤ now {self.now}")
        return True

    def _hold(self, dst: Nic, now: int, e: tuple[Any, ...]) -> bool:
        """Queue an arrival for a host that is stalled (or still has older arrivals to read)."""
        h = self.hosts.get(id(dst))
        if h is None:
            return False
        if h.awake_at(now) == now and not h.waiting:
            h.fed = now
            return False
        h.queues[e[4]].append((now, e))
        h.waiting += 1
        return True

    def _drain(self, h: _Host) -> None:
        """The host runs again: its port queues, read in turns, each arrival at its own time."""
        turn, stamped = h.stalls.turn, h.stalls.kernel_time
        queues = h.queues
        while h.waiting:
            for q in queues:
                take, q[:] = q[:turn], q[turn:]
                for arrived, e in take:
                    at = max(arrived if stamped else self.now, h.fed)
                    h.fed = at
                    h.waiting -= 1
                    self.fabric.hand(e, at)
        h.fed = self.now

    def run(
        self, until: Callable[[], bool] | None = None, *, max_time: int = 10**12, max_steps: int = 10**7
    ) -> None:
        for _ in range(max_steps):
            if until is not None and until():
                return
            if self.now > max_time or not self.step():
                return
        raise AssertionError("pair harness: too many steps")

    def completions(self) -> list[WorkCompletion]:
        return self.qp_a.send_cq.poll(1 << 30)

    def recv_completions(self) -> list[WorkCompletion]:
        return self.qp_b.recv_cq.poll(1 << 30)
