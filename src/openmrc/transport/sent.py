"""What a requester has sent and not yet seen acknowledged: posted Writes, their packets, and the windows
that hold those packets by PSN and by transmission order (`openmrc.transport.requester` segments and
sprays, `openmrc.transport.recovery` judges losses; both keep these records)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Final

from mypy_extensions import mypyc_attr

from openmrc.transport.evtable import EvEntry
from openmrc.transport.types import SendWR, WrOpcode
from openmrc.wire import DataTemplate
from openmrc.wire.constants import (
    OP_WRITE_FIRST,
    OP_WRITE_LAST,
    OP_WRITE_LAST_WITH_IMM,
    OP_WRITE_ONLY,
    OP_WRITE_ONLY_WITH_IMM,
)

__all__ = ["NONE_POSTED", "NO_WINDOW", "PostedWrite", "SentPacket", "Window"]


@mypyc_attr(acyclic=True)
class PostedWrite:
    """A posted Write while it is being sent and acknowledged."""

    __slots__ = (
        "acked",
        "first_seq",
        "imm",
        "imm_data",
        "msn",
        "next_index",
        "npkts",
        "op_first",
        "op_last",
        "rkey",
        "rqmsn",
        "signaled",
        "total",
        "tpl",
        "va",
        "view",
        "views",
        "wr",
    )

    def __init__(self, wr: SendWR, views: list[memoryview], total: int, signaled: bool, mtu: int) -> None:
        self.wr = wr
        self.views = views
        self.view = views[0] if len(views) == 1 else None  # the common single-SGE Write, sliced directly
        self.total = total
        self.signaled = signaled
        self.npkts = max(1, -(-total // mtu))
        self.next_index = 0
        self.acked = 0
        self.first_seq = -1
        self.msn = 0
        self.rqmsn = 0
        self.tpl: DataTemplate | None = None  # what every packet of the Write repeats; set with msn/rqmsn
        self.imm = imm = wr.opcode is WrOpcode.RDMA_WRITE_WITH_IMM
        self.imm_data = (wr.imm_data or 0) if imm else None
        self.va = wr.remote_addr
        self.rkey = wr.rkey
        if self.npkts == 1:
            self.op_first = self.op_last = OP_WRITE_ONLY_WITH_IMM if imm else OP_WRITE_ONLY
        else:
            self.op_first = OP_WRITE_FIRST
            self.op_last = OP_WRITE_LAST_WITH_IMM if imm else OP_WRITE_LAST

    def payload(self, offset: int, size: int) -> memoryview:
        views = self.views
        if len(views) == 1:
            return views[0][offset : offset + size]
        out = bytearray()
        pos = 0
        for v in views:  # gather across SGEs (one copy, only for multi-SGE Writes)
            end = pos + len(v)
            if end > offset and pos < offset + size:
                out += v[max(offset - pos, 0) : min(offset + size - pos, len(v))]
            pos = end
        return memoryview(out)


NONE_POSTED: Final[deque[PostedWrite]] = deque()
"""A requester's ``wrs`` and ``unsent`` while it has no Write (shared and never appended to: an empty deque
is 600 bytes, and a large simulation's receiving QPs never post)."""


# acyclic: no cyclic-GC header (16 bytes an outstanding packet); neither refers to anything that refers back
@mypyc_attr(acyclic=True)
class SentPacket:
    """One outstanding (unacknowledged) packet: ``seq`` its unwrapped PSN, ``size`` its payload bytes.
    Each transmission of it is a `Transmit` of its own (`_transmit`), which lives only while in flight
    (and which the fabric may write). Not the record itself: a packet stays unacknowledged well after
    it has arrived (at the data peak of a large permutation only about 40 % of a host's unacknowledged
    packets are in flight), so a small record and a Transmit in flight take less memory than one
    object as large as both, at the same speed."""

    __slots__ = ("entry", "lost", "order", "retries", "sends", "sent_at", "seq", "size", "suspect", "wr")

    def __init__(self, seq: int, wr: PostedWrite, size: int, entry: EvEntry) -> None:
        self.seq = seq
        self.wr = wr
        self.size = size
        self.entry = entry
        self.sent_at = 0
        self.order = 0
        self.lost = False
        self.sends = 0  # retransmissions so far (0: only the original left)
        self.retries = 0
        self.suspect: EvEntry | None = None  # the EV of a transmission inferred lost, until it is judged
        # (`openmrc.transport.recovery`)


class Window:
    """Packets under consecutive keys (PSNs, transmission orders), added in key order: a list from key
    ``base`` on, None where a packet left, its empty head dropped as it goes. Eight bytes a packet where a
    dict entry takes about thirty (and a dict keeps the table it grew to), and a lookup is an index."""

    __slots__ = ("base", "live", "slots")

    def __init__(self) -> None:
        self.base = 0
        self.slots: list[SentPacket | None] = []
        self.live = 0  # packets held

    def __len__(self) -> int:
        return self.live

    def __iter__(self) -> Iterator[int]:
        """The keys held, in order."""
        base = self.base
        return iter([base + i for i, p in enumerate(self.slots) if p is not None])

    def __contains__(self, key: int) -> bool:
        return self.get(key) is not None

    def values(self) -> list[SentPacket]:
        """The packets held, in key order."""
        return [p for p in self.slots if p is not None]

    def get(self, key: int) -> SentPacket | None:
        i = key - self.base
        slots = self.slots
        return slots[i] if 0 <= i < len(slots) else None

    def add(self, key: int, p: SentPacket) -> None:
        """Hold ``p`` under ``key``, which follows every key held so far."""
        slots = self.slots
        if not slots:
            self.base = key
        gap = key - self.base - len(slots)
        assert gap >= 0, "keys are added in order"
        if gap:
            slots.extend([None] * gap)
        slots.append(p)
        self.live += 1

    def put(self, key: int, p: SentPacket) -> None:
        """Hold ``p`` under ``key``, which holds nothing: below the keys held, or in a gap between them (a
        packet held again after it left), or after them (`add`)."""
        slots = self.slots
        if not slots or key >= self.base + len(slots):
            self.add(key, p)
            return
        i = key - self.base
        if i < 0:
            slots[:0] = [p, *([None] * (-i - 1))]
            self.base = key
        else:
            assert slots[i] is None, "a key held already"
            slots[i] = p
        self.live += 1

    def pop(self, key: int) -> SentPacket | None:
        """Remove and return the packet under ``key`` (None: none)."""
        i = key - self.base
        slots = self.slots
        if i < 0 or i >= len(slots):
            return None
        p = slots[i]
        if p is None:
            return None
        slots[i] = None
        self.live -= 1
        if not self.live:
            slots.clear()  # frees the list's storage
        elif not i:
            n = 1
            while slots[n] is None:
                n += 1
            del slots[:n]
            self.base += n
        return p

    def oldest(self) -> SentPacket | None:
        """The packet under the lowest key held (the list's head is never empty)."""
        slots = self.slots
        return slots[0] if slots else None

    def newest(self) -> SentPacket | None:
        """The packet under the highest key held."""
        slots = self.slots
        i = len(slots) - 1
        while i >= 0:
            p = slots[i]
            if p is not None:
                return p
            i -= 1
        return None

    def clear(self) -> None:
        self.slots.clear()
        self.live = 0


NO_WINDOW: Final = Window()
"""A requester's ``outstanding`` and ``by_order`` until it posts a Write (shared, only ever read or cleared:
nothing is sent without a Write)."""
