"""Test tools for the transport core on top of the pair harness (`tests.helpers`).

`HookFabric` is a `Fabric` that logs every `Transmit` the NICs hand it (before any impairment acts, so the
log is what the NICs *sent*) and can hold chosen packets back by a scripted extra delay; `install` swaps it
into a fresh `Pair`. `tap_receive` records what the fabric hands a NIC. The rest are small queries over
those logs, and `deliver_sack`: a SACK to the requester's NIC as a parsed `Packet` or by its fields.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from openmrc.transport import Nic, SackTransmit, Transmit, TrimMark, WcStatus, WorkCompletion
from openmrc.wire import DATA_OPCODES, Addressing, Packet, parse, seal

from .helpers import Fabric, Pair

DATA = frozenset(int(o) for o in DATA_OPCODES)


@dataclass(frozen=True, slots=True)
class Sent:
    """One packet as a NIC handed it to the fabric."""

    time: int
    src: str
    port: int
    entropy: int
    opcode: int
    psn: int
    rtx: bool
    packet: Packet

    @property
    def is_data(self) -> bool:
        return self.opcode in DATA


class _Counter(Iterator[int]):
    """An `itertools.count` whose next value can be read (the fabric's tie-breaking sequence)."""

    def __init__(self) -> None:
        self.value = 0

    def __next__(self) -> int:
        v = self.value
        self.value += 1
        return v


#: Given a packet about to enter the fabric, the extra delay (ns) to add to its arrival, 0 for none.
DelayFn = Callable[[Sent], int]


class HookFabric(Fabric):
    """A `Fabric` that logs every send and delays the packets a `DelayFn` picks."""

    def __init__(self, base: Fabric, delay: DelayFn | None = None) -> None:
        super().__init__(base.rng, base.imp, latency_ns=base.latency, link_bps=base.link_bps, wire=base.wire)
        self._counter = _Counter()
        self.seq = self._counter  # type: ignore[assignment]
        self.delay = delay
        self.log: list[Sent] = []
        self.observers = base.observers

    def send(self, src: Nic, dst: Nic, t: Transmit, now: int, src_name: str) -> None:
        pkt = t.packet
        assert isinstance(pkt, Packet)
        rec = Sent(now, src_name, t.port, t.entropy, pkt.bth.opcode, pkt.bth.psn, pkt.bth.rtx, pkt)
        self.log.append(rec)
        extra = self.delay(rec) if self.delay is not None else 0
        first = self._counter.value
        super().send(src, dst, t, now, src_name)
        if extra:
            self.events = [(e[0] + extra, *e[1:]) if e[1] >= first else e for e in self.events]
            heapq.heapify(self.events)

    def select(
        self,
        *,
        src: str | None = None,
        entropy: int | None = None,
        port: int | None = None,
        since: int = 0,
        data: bool | None = None,
    ) -> list[Sent]:
        """The logged packets matching every given filter (``since``: sent at or after that time)."""
        return [
            s
            for s in self.log
            if s.time >= since
            and (src is None or s.src == src)
            and (entropy is None or s.entropy == entropy)
            and (port is None or s.port == port)
            and (data is None or s.is_data == data)
        ]

    def opcode_counts(self, **filters: Any) -> Counter[int]:
        return Counter(s.opcode for s in self.select(**filters))


def install(p: Pair, delay: DelayFn | None = None) -> HookFabric:
    """Replace ``p``'s fabric (same rng, impairments, latency, wire mode) by a `HookFabric`.

    Call it before the first `Pair.step`: packets already in the old fabric would be lost.
    """
    assert not p.fabric.events and p.fabric.sent == 0, "install the hook fabric before running the pair"
    hook = HookFabric(p.fabric, delay)
    p.fabric = hook
    return hook


@dataclass(frozen=True, slots=True)
class Received:
    """One packet as a NIC was handed it (wire bytes decoded for the record)."""

    time: int
    port: int
    entropy: int
    packet: Packet


def tap_receive(p: Pair, nic: Nic) -> list[Received]:
    """Record every packet ``p``'s fabric hands to ``nic`` (decoding wire bytes for the record only)."""
    log: list[Received] = []

    def observe(dst: Nic, data: Any, port: int, now: int, kw: dict[str, Any]) -> None:
        if dst is not nic:
            return
        try:
            pkt = data if isinstance(data, Packet) else parse(data, trimmed=bool(kw.get("trim")))
        except ValueError:
            pkt = None
        if pkt is not None:
            log.append(Received(now, port, kw.get("entropy", 0), pkt))

    p.fabric.observers.append(observe)
    return log


def statuses(wcs: Iterable[WorkCompletion]) -> list[tuple[int, WcStatus]]:
    return [(w.wr_id, w.status) for w in wcs]


def run_until_completions(p: Pair, n: int, *, max_time: int = 10**10, max_steps: int = 500_000) -> None:
    """Run until ``qp_a``'s send CQ holds at least ``n`` completions (or the limits are hit)."""
    p.run(lambda: len(p.qp_a.send_cq) >= n, max_time=max_time, max_steps=max_steps)


#: The addressing tests give datagrams they hand a NIC directly (any fixed one will do: it only has to be
#: the one the ICRC was sealed with).
TEST_ADDR = Addressing("2001:db8::a", "2001:db8::b", 0xC123)


def feed_bytes(
    nic: Nic,
    data: Packet | bytes,
    port: int,
    now: int,
    *,
    sealed: bool = True,
    addr: Addressing = TEST_ADDR,
    **kw: Any,
) -> None:
    """Hand ``nic`` the bytes of ``data`` as a datagram received with ``addr``; ``sealed``: with the ICRC
    those bytes need (an adversary can compute it), else as they are."""
    raw = data.encode() if isinstance(data, Packet) else data
    if sealed and len(raw) >= 16:
        raw = seal(raw, addr)
    nic.receive_datagram(raw, port, now, addr, trim=kw.pop("trim", TrimMark.NONE), **kw)


def sack_transmit(pkt: Packet) -> SackTransmit:
    """The `SackTransmit` that carries ``pkt``'s fields."""
    s, c = pkt.seth, pkt.cc_state
    assert s is not None and c is not None
    return SackTransmit(
        s.src_qp, pkt.bth.dest_qp, s.cack_psn, s.ack_psn_offset, s.sack_offset, s.bitmap, s.entropy, s.m,
        s.pr, s.mpr, c.ts_echo, c.ooo_count, c.rcvd_256b,
    )  # fmt: skip


def deliver_sack(p: Pair, pkt: Packet, via: str) -> None:
    """``pkt`` to NIC a: parsed from its bytes (`Nic.receive`), or by its fields (`Nic.receive_transmit`).
    A SACK whose SETH and BTH disagree on the QP number has no `SackTransmit` (only the responder makes
    those): its SETH fields go straight to the requester, as the parsed bytes carry them or as built."""
    s = pkt.seth
    assert s is not None
    if s.dst_qp != pkt.bth.dest_qp & 0xFFFF:
        if via == "packet":
            s = parse(pkt.encode()).seth
            assert s is not None
        fields = (s.cack_psn, s.ack_psn_offset, s.sack_offset, s.bitmap, s.entropy, s.m, s.pr)
        p.qp_a.requester.on_sack_fields(*fields, s.src_qp, s.dst_qp, s.mpr, p.now)
        p.a.wake(p.qp_a)
    elif via == "packet":
        p.a.receive(parse(pkt.encode()), 1, p.now, src="b")
    else:
        p.a.receive_transmit(sack_transmit(pkt), 1, p.now, src="b")
