"""How a rank moves a collective's pieces with `openmrc.verbs`: a QP per peer, slots registered once, credits.

Theory of operation. Each rank keeps, per peer, one RC QP (every plane of the device: MRC sprays it) and a
ring of ``slots`` receive slots of ``chunk_bytes`` each, registered once for the communicator's life. The k-th
piece a rank sends to a peer into a slot is an RDMA Write with Immediate into the peer's slot ``k mod slots``;
the immediate carries the piece's number (mod 2^17), so the receiver checks the order MRC completes them in
(message order). A sender holds one credit per free slot of the peer's ring: it starts with ``slots`` and
spends one per piece; a receiver gives slots back once its `Schedule` has consumed them (reduced or copied
them out), so a slot is never overwritten before it is read and a peer that races ahead waits instead of
overrunning. The slots freed towards a peer ride on the next piece this rank sends it (most collectives send
to the peers they receive from: a small all_reduce then costs one Write per peer and step, not two); a
zero-length Write with Immediate carries them instead when half of the ring is owed, before this rank waits
for anything (`idle`), and when a collective ends owing more than `DEFERRED_SLOTS`, the slots the ring has
beyond ``slots`` for them: a peer can always send as far ahead as if nothing were owed.

Direct messages. A message the program marks direct (`openmrc.collectives.program.Program`: a large one whose
receive only places it -- all_gather, alltoall, broadcast, send, an all_reduce's gathering half) goes straight
into the receiver's buffer: no slot and no copy. The receiver registers the buffer for remote writes for the
collective and, once the message's region is ready (its `Schedule` says so), *advertises* it to the peer: a
32-byte Write with Immediate (address, R_Key, bytes, direct credits granted) into a mailbox of `MAILBOX`
entries after the peer's slots. The peer takes the adverts in order, one per direct message, and holds a
message's pieces until its advert is there. The first piece of a message tells the receiver that its advert
was taken: a rank has at most `MAILBOX` adverts untaken towards a peer (it holds the rest). A direct piece
spends a *direct credit* (apart from the slots' credits), which the receiver gives back once it has taken the
piece's completion: each piece is a Write with Immediate, which needs a posted receive (MRC has no "receiver
not ready": one that finds none fails the QP), and the credits keep a peer from having more of those in flight
than the receiver has posted, however late the receiver polls or however many a loss holds back. A link has
none until its first advert, which grants them (`DIRECT_WINDOW` bytes' worth of pieces, 32 to 1,024) once the
receiver has posted a receive for each; the rank they are granted to posts as many for the credit Writes that
give them back (each gives back one at least). A link that never carries a direct message posts none of them
(a simulated rank of 1,024 has many links).

Immediates: bits 31-30 the kind (00 a data piece, 01 credits, 10 a notice, 11 an abort); a data piece's
bits 29-19 the slots it gives back, bit 18 set for a direct piece, bit 17 for a direct message's first,
and 16-0 its piece number (mod 2^17); credits' bits 29-15 the direct credits and 14-0 the slots given
back; a notice's bits 29-0 BYE (the peer is closing) or ADVERT (an advert is in the mailbox); an abort's
bits 29-28 why and 27-0 which rank: FAILED (it failed or stopped answering; all ones: unknown), DISAGREED
(it found that the ranks are not running the same collective), TIMED_OUT (it gave up waiting, its
communicator's ``timeout``) or CLOSED (it closed its communicator while others wait for it).

Failures. A send to a dead peer ends with RETRY_EXC_ERR once the QP's retries run out (the QP attributes
give the time, `openmrc.transport.Qp.time_to_error`); a rank that only waits for a dead peer learns it by
pinging the peers it waits for when they have been silent for ``ping_s`` -- a live peer's NIC acknowledges
the ping whatever its program is doing, a dead one's does not. A ping is a zero-length RDMA Write without
an immediate: it takes none of the peer's posted receives, so a peer away from the library for long
(a checkpoint, an evaluation) is pinged as long as it takes, not failed. The rank that finds a dead peer
tells every peer it has a QP with (an abort naming that rank), and they tell theirs, so every surviving
rank stops with the same `CollectiveError` however far it is from the dead one. A rank that finds a live
peer disagreeing (a piece of the wrong size or kind: the ranks are not running the same collective), that
gives up waiting, or that waits for a peer that said goodbye stops the same way, and tells that peer too,
which would otherwise wait for it.
"""

from __future__ import annotations

import contextlib
import errno
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Final, NoReturn

import numpy as np

from openmrc import verbs
from openmrc.collectives.program import Schedule, ScheduleError

__all__ = ["CollectiveError", "Engine", "Link"]

KIND_SHIFT: Final = 30
DATA: Final = 0
CREDIT: Final = 1
PING: Final = 2  # a notice (low bits BYE: the peer is closing; ADVERT: an advert is in the mailbox)
BYE: Final = 1
ADVERT: Final = 2
ABORT: Final = 3
LOW: Final = (1 << KIND_SHIFT) - 1
WHY_SHIFT: Final = 28  # an abort's bits 29-28: why; 27-0: which rank
WHO: Final = (1 << WHY_SHIFT) - 1  # (all ones: the rank is not known)
FAILED: Final = 0
DISAGREED: Final = 1
TIMED_OUT: Final = 2
CLOSED: Final = 3
_ABORT_TEXT: Final = (
    "{who} failed",
    "{who} found that the ranks are not running the same collective",
    "{who} gave up waiting for this collective (its timeout)",
    "{who} closed its communicator while ranks wait for it",
)
CREDIT_SHIFT: Final = 19  # a data piece's bits 29-19: the slots it gives back
DIRECT: Final = 1 << 18  # a data piece written into the receiver's buffer, not a slot
FIRST: Final = 1 << 17  # ... the first of its message
SEQ_MASK: Final = FIRST - 1  # a data piece's number, mod 2^17 (they complete in order)
_ADVERT: Final = struct.Struct("<QQQQ")  # address, R_Key, bytes from there; direct credits granted
ADVERT_BYTES: Final = 32  # a mailbox entry
MAILBOX: Final = 16  # entries for adverts received, after a link's slots (and as many for those sent)
DIRECT_WINDOW: Final = 256 << 20  # the direct pieces a peer may have in flight: this many bytes' worth ...
DIRECT_CREDITS: Final = (32, 1024)  # ... but this many pieces at least and at most
_DCREDIT_SHIFT: Final = 15  # credits: bits 29-15 direct credits, 14-0 slots
_SLOT_CREDITS: Final = (1 << _DCREDIT_SHIFT) - 1
_CTRL_WR: Final = 0  # wr_id of credits and pings
_ABORT_WR: Final = 1 << 62
STEP_WCS: Final = 512  # completions one `Engine.step` takes at most
DEFERRED_SLOTS: Final = 1
"""Freed slots a rank may go on owing a peer after a collective ends (to give them back on its next piece to
it): its ring has that many slots more than asked for, and the peer as many more credits, so that the peer
can always send as far ahead as if nothing were owed (a rank outside the library gives nothing back)."""
REG_CACHE_ENTRIES: Final = 32  # buffers a rank keeps registered between collectives, at most
REG_CACHE_BYTES: Final = 1 << 20  # ... each at most this big (beyond, registering weighs little)


class CollectiveError(RuntimeError):
    """A collective cannot complete: ``rank`` (if known) is the rank that failed or stopped answering, or
    that this rank disagrees with, or that stopped the collective."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


def _numpy_owned(b: np.ndarray[Any, Any]) -> bool:
    """Whether numpy allocated ``b``'s memory (not a bytearray's, a tensor's ... which could be resized or
    freed under a registration kept for later)."""
    root: Any = b
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    return isinstance(root, np.ndarray) and bool(root.flags.owndata)


class Link:
    """This rank's QP towards one peer, its receive slots, and the credit and piece counters."""

    __slots__ = (
        "adverts",
        "adverts_in",
        "adverts_out",
        "backlog",
        "begun",
        "bye",
        "credits",
        "dcredits",
        "dfreed",
        "dlimit",
        "freed",
        "granted",
        "held",
        "mr",
        "peer",
        "pending",
        "ping_at",
        "qp",
        "recv_seq",
        "recv_slot",
        "remote_addr",
        "remote_mailbox",
        "remote_rkey",
        "send_seq",
        "send_slot",
        "slots",
        "target",
    )

    def __init__(
        self, peer: int, qp: verbs.Qp, slots: bytearray, mr: verbs.MemoryRegion, credits: int
    ) -> None:
        self.peer = peer
        self.qp = qp
        self.slots = slots
        self.mr = mr
        self.remote_addr = 0
        self.remote_rkey = 0
        self.remote_mailbox = 0
        self.credits = credits
        self.send_seq = 0  # pieces sent (slots and direct)
        self.recv_seq = 0
        self.send_slot = 0  # pieces sent into a slot
        self.recv_slot = 0
        self.adverts: deque[tuple[int, int, int]] = deque()  # the peer's adverts not taken yet
        self.target: tuple[int, int, int] | None = None  # the one the direct message being sent uses
        self.held: deque[tuple[int, int, int]] = deque()  # this rank's adverts waiting for mailbox room
        self.adverts_in = 0  # adverts received
        self.adverts_out = 0  # adverts sent
        self.begun = 0  # direct messages the peer began (it took their adverts)
        self.freed = 0
        self.dcredits = 0  # direct credits: none until the peer's first advert grants them
        self.dlimit = 0  # ... how many it granted
        self.granted = False  # whether this rank has granted the peer its direct credits
        self.dfreed = 0  # direct credits owed to the peer
        self.pending: deque[tuple[int, Any]] = deque()  # (op index, op) waiting for a credit or an advert
        self.backlog: deque[memoryview] = deque()  # pieces of a collective this rank has not begun
        self.bye = False  # the peer is closing and has nothing of its own left unacknowledged
        self.ping_at = 0.0


class Engine:
    """The verbs side of one rank: device context, PD, CQ and completion channel, the `Link` per peer, and
    `step`, which moves a `Schedule` forward without blocking. ``dev_name``: a device registered with
    `openmrc.verbs.add_device`. ``connect(engine, peer) -> Link``: how a link is made (the communicator's
    bootstrap)."""

    def __init__(
        self, rank: int, dev_name: str, *, chunk_bytes: int, slots: int, ping_s: float, channel: bool = True
    ) -> None:
        self.rank = rank
        self.chunk_bytes = chunk_bytes
        self.nslots = slots + DEFERRED_SLOTS  # (the ring: see DEFERRED_SLOTS)
        self.ping_s = ping_s
        self.device = verbs.open_device(dev_name)
        self.ctx = verbs.create_context(self.device, verbs.API_CURRENT_VERSION)
        self.pd = verbs.alloc_pd(self.device)
        # (a rank driven by an event loop, `SimWorld`, needs no channel: a descriptor each, for nothing)
        self.channel = verbs.create_comp_channel(self.ctx) if channel else None
        self.cq = verbs.create_cq(self.ctx, 1 << 16, channel=self.channel)
        self.links: dict[int, Link] = {}
        self.by_qpn: dict[int, Link] = {}
        self.schedule: Schedule | None = None
        self.mrs: list[verbs.MemoryRegion | None] = []
        self._temp: list[verbs.MemoryRegion] = []  # this collective's registrations outside the cache
        self._regs: OrderedDict[tuple[int, int, int], tuple[verbs.MemoryRegion, np.ndarray[Any, Any]]] = (
            OrderedDict()
        )  # the registration cache: (address, bytes, access) -> region and the array that holds it
        self.itemsize = 1
        self.failed: CollectiveError | None = None
        self._aborts = 0  # abort messages posted, not completed
        self.unacked = 0  # other sends posted, not completed
        self.clock: Callable[[], float] = time.monotonic
        self.stats = {
            "pieces_sent": 0,
            "pieces_direct": 0,
            "pieces_received": 0,
            "credits_sent": 0,
            "credits_carried": 0,
            "pings": 0,
        }
        self._credit_batch = max(1, slots // 2)
        lo, hi = DIRECT_CREDITS
        self.direct_credits = min(hi, max(lo, DIRECT_WINDOW // chunk_bytes))
        """Direct credits this rank grants each peer it advertises to."""

    # -- links -----------------------------------------------------------------------------------------------
    def new_link(self, peer: int) -> Link:
        """A QP (in INIT, receives posted) and slots towards ``peer``; `open_link` finishes it."""
        cap = verbs.QpCap(max_send_wr=4096, max_recv_wr=self._receives() + 2 * self.direct_credits + 32)
        qp = verbs.create_qp(
            self.ctx, verbs.QpInitAttr(send_cq=self.cq, recv_cq=self.cq, pd=self.pd, cap=cap)
        )
        slots = bytearray(self.nslots * self.chunk_bytes + 2 * MAILBOX * ADVERT_BYTES)  # (and mailboxes)
        mr = verbs.reg_mr(self.pd, slots, verbs.Access.LOCAL_WRITE | verbs.Access.REMOTE_WRITE)
        link = Link(peer, qp, slots, mr, self.nslots)
        self.links[peer] = link
        self.by_qpn[qp.qp_num] = link
        return link

    def link_info(self, link: Link) -> dict[str, int]:
        mailbox = link.mr.addr + self._mailbox()
        return {
            "qpn": link.qp.qp_num,
            "addr": link.mr.addr,
            "rkey": link.mr.rkey,
            "mailbox": mailbox,
        }

    def _mailbox(self) -> int:
        """Where the adverts received start in a link's slot memory (those sent: `MAILBOX` entries on)."""
        return self.nslots * self.chunk_bytes

    def post_receives(self, link: Link) -> None:
        self._post_receives(link, self._receives())

    def _receives(self) -> int:
        """Receives kept posted per link: the pieces a peer may have in flight into slots (its credits),
        with room to spare for its credit Writes (at most one per piece it took), its adverts and its
        goodbye (an MRC Write with Immediate that finds no receive fails the QP; pings take none). Direct
        credits post more: the rank that grants them as many (for the direct pieces, `_advertise`), the
        rank they are granted to as many (for the credit Writes that give them back, `_received`)."""
        return max(4 * self.nslots, 32) + MAILBOX + 32

    # -- a collective ----------------------------------------------------------------------------------------
    def _region(self, b: np.ndarray[Any, Any], exposed: bool = False) -> verbs.MemoryRegion:
        """``b`` registered: from the registration cache when numpy owns its memory (it cannot move or be
        freed while the cache holds it) and it is small enough for registering to weigh, else anew (and
        deregistered by `end`). ``exposed``: peers write into it (never cached: no peer can write it
        between collectives)."""
        access = verbs.Access.LOCAL_WRITE if b.flags.writeable else verbs.Access(0)
        if exposed:
            access |= verbs.Access.REMOTE_WRITE
        small = not exposed and b.nbytes <= REG_CACHE_BYTES and _numpy_owned(b)
        key = (b.__array_interface__["data"][0], b.nbytes, int(access)) if small else None
        if key is not None:
            hit = self._regs.get(key)
            if hit is not None:
                self._regs.move_to_end(key)
                return hit[0]
        mr = verbs.reg_mr(self.pd, b.view(np.uint8), access)  # bytes: bfloat16 has no format
        if key is None:
            self._temp.append(mr)
            return mr
        self._regs[key] = (mr, b)
        if len(self._regs) > REG_CACHE_ENTRIES:
            verbs.dereg_mr(self._regs.popitem(last=False)[1][0])
        return mr

    def begin(self, schedule: Schedule, buffers: list[np.ndarray[Any, Any]]) -> None:
        """Register the collective's buffers and start ``schedule`` (its links must exist)."""
        self.schedule = schedule
        self.itemsize = schedule.dtype.itemsize
        exposed = schedule.exposed
        self.mrs = [self._region(b, i in exposed) if b.nbytes else None for i, b in enumerate(buffers)]
        ping_at = self.clock() + self.ping_s
        for link in self.links.values():
            link.ping_at = ping_at
        schedule.start()
        for link in self.links.values():
            while link.backlog and schedule.wants(link.peer):
                self._arrive(schedule, link, link.backlog.popleft(), link)
        self._give_credits(schedule.take_consumed())
        self._post_adverts(schedule)
        self._post_sends()

    def end(self) -> None:
        if self.failed is None:
            with contextlib.suppress(CollectiveError):  # (a link that failed: the next step raises it)
                for link in self.links.values():
                    if link.freed > DEFERRED_SLOTS or link.dfreed:
                        self._send_credits(link)
        for mr in self._temp:
            verbs.dereg_mr(mr)
        for link in self.links.values():
            link.target = None
        self._temp = []
        self.mrs = []
        self.schedule = None

    def step(self) -> int:
        """Take what the CQ holds, feed it to the schedule, post what became ready; returns completions
        handled. Raises `CollectiveError` when a peer failed."""
        if self.failed is not None:
            raise self.failed
        wcs = verbs.poll_cq(self.cq, STEP_WCS)
        sched = self.schedule
        for wc in wcs:
            if wc.opcode == verbs.WcOpcode.RECV_RDMA_WITH_IMM:
                self._received(wc)
            elif wc.status != verbs.WcStatus.SUCCESS:
                self.unacked -= 1
                link = self.by_qpn.get(wc.qp_num)
                peer = link.peer if link is not None else None
                why = (link.qp.core.error_detail if link is not None else None) or wc.status.name
                self._fail(CollectiveError(f"rank {self.rank}: rank {peer} does not answer ({why})", peer))
            elif wc.wr_id == _ABORT_WR:
                self._aborts -= 1
            else:
                self.unacked -= 1
                if wc.wr_id != _CTRL_WR and sched is not None:
                    sched.sent(wc.wr_id - 1)
        if sched is not None:
            self._give_credits(sched.take_consumed())
            self._post_adverts(sched)
            self._post_sends()
        return len(wcs)

    def _received(self, wc: verbs.WorkCompletion) -> None:
        link = self.by_qpn.get(wc.qp_num)
        if link is None:
            return
        if wc.status != verbs.WcStatus.SUCCESS:  # (its QP failed)
            self._link_failed(link, wc.status.name)
        self._post_receives(link, 1)
        imm = wc.imm_data or 0
        kind, low = imm >> KIND_SHIFT, imm & LOW
        link.ping_at = self.clock() + self.ping_s
        if kind == CREDIT:
            self._credit(link, low & _SLOT_CREDITS, low >> _DCREDIT_SHIFT)
            return
        if kind == PING:
            if low == ADVERT:
                if len(link.adverts) >= MAILBOX:  # (it may not have more untaken than the mailbox holds)
                    self._disagree(
                        link,
                        f"rank {link.peer} sent more adverts than its mailbox here "
                        "holds (a protocol violation)",
                    )
                at = self._mailbox() + (link.adverts_in % MAILBOX) * ADVERT_BYTES
                link.adverts_in += 1
                addr, rkey, room, grant = _ADVERT.unpack_from(link.slots, at)
                if grant:
                    if link.dlimit or grant > DIRECT_CREDITS[1]:
                        self._disagree(
                            link,
                            f"rank {link.peer} granted {grant} direct credit(s) "
                            f"after {link.dlimit} (a protocol violation)",
                        )
                    link.dcredits = link.dlimit = grant
                    self._post_receives(link, grant)  # (for the credit Writes that give them back)
                link.adverts.append((addr, rkey, room))
            link.bye = link.bye or low == BYE
            return
        if kind == ABORT:
            why, who = low >> WHY_SHIFT, low & WHO
            rank = who if who < WHO else None  # (WHO: the peer did not know which rank failed)
            named = _ABORT_TEXT[why].format(who=f"rank {who}" if rank is not None else "a rank")
            err = CollectiveError(f"{named} (reported to rank {self.rank} by rank {link.peer})", rank)
            self._fail(err, why)
        if low >> CREDIT_SHIFT:
            self._credit(link, low >> CREDIT_SHIFT, 0)  # slots it gives back, riding on the piece
        if low & SEQ_MASK != link.recv_seq & SEQ_MASK:
            self._disagree(
                link,
                f"piece {low & SEQ_MASK} from rank {link.peer}, expected {link.recv_seq & SEQ_MASK}",
            )
        link.recv_seq += 1
        self.stats["pieces_received"] += 1
        sched = self.schedule
        early = link.backlog or sched is None or not sched.wants(link.peer)
        if low & DIRECT:
            if low & FIRST:  # (the peer took an advert: room for one more in its mailbox)
                if link.begun >= link.adverts_out:
                    self._disagree(
                        link,
                        f"rank {link.peer} began a direct message this rank never "
                        "advertised (a protocol violation)",
                    )
                link.begun += 1
                self._flush_adverts(link)
            if early:  # (it had this rank's advert: it cannot be a collective ahead)
                self._disagree(
                    link,
                    f"a direct piece from rank {link.peer} that no receive of this "
                    "collective expects (the ranks are not running the same collective)",
                )
            assert sched is not None
            link.dfreed += 1  # (its receive is posted again: the credit it spent goes back)
            if link.dfreed >= self.direct_credits // 2:
                self._send_credits(link)
            self._arrive(sched, link, wc.byte_len, None)
            return
        slot = link.recv_slot % self.nslots
        link.recv_slot += 1
        start = slot * self.chunk_bytes
        view = memoryview(link.slots)[start : start + wc.byte_len]
        if early:
            link.backlog.append(view)  # the peer is a collective ahead: keep it (and its slot) for the next
            return
        assert sched is not None
        self._arrive(sched, link, view, link)

    def _arrive(self, sched: Schedule, link: Link, data: Any, token: Any) -> None:
        try:
            sched.arrived(link.peer, data, token)
        except ScheduleError as exc:
            self._disagree(link, str(exc))

    def _credit(self, link: Link, n: int, d: int) -> None:
        """``n`` slots of the peer's ring and ``d`` direct credits given back."""
        # a peer can only give back slots this rank has filled: more would let it overwrite unread ones
        if (n == 0 and d == 0) or link.credits + n > self.nslots or link.dcredits + d > link.dlimit:
            self._disagree(
                link,
                f"rank {link.peer} gave back {n} slot(s) with {link.credits} of "
                f"{self.nslots} free and {d} direct credit(s) with {link.dcredits} of {link.dlimit} "
                "(the ranks disagree: a protocol violation)",
            )
        link.credits += n
        link.dcredits += d

    def _give_credits(self, consumed: Iterable[Any]) -> None:
        """Slots the schedule consumed: owed to their peers, given back with the next piece to them, or at
        once when half of the ring is owed."""
        for link in consumed:
            link.freed += 1
            if link.freed >= self._credit_batch:
                self._send_credits(link)

    def _send_credits(self, link: Link) -> None:
        self._control(link, CREDIT, link.dfreed << _DCREDIT_SHIFT | link.freed)
        self.stats["credits_sent"] += 1
        link.freed = link.dfreed = 0

    def idle(self) -> None:
        """This rank is about to wait (or, driven by an event loop, has nothing left to do until its next
        completion): give back every slot it owes, so that no peer waits for one."""
        for link in self.links.values():
            if link.freed or link.dfreed:
                self._send_credits(link)

    def _post_sends(self) -> None:
        sched = self.schedule
        if sched is None:
            return
        for i, op in sched.take_sends():
            self.links[op.peer].pending.append((i, op))
        for link in self.links.values():
            pending = link.pending
            while pending:
                i, op = pending[0]
                if op.remote < 0:
                    if link.credits <= 0:  # (a piece into a slot: once one is free)
                        break
                elif link.dcredits <= 0:
                    break
                elif op.remote == 0:  # a direct message: once the peer's advert for it is here
                    if not link.adverts:
                        break
                    link.target = link.adverts.popleft()
                pending.popleft()
                self._write(link, i, op)

    def _write(self, link: Link, i: int, op: Any) -> None:
        nbytes = op.n * self.itemsize
        if op.remote >= 0:
            addr, rkey, room = link.target or (0, 0, 0)
            at = op.remote * self.itemsize
            if at + nbytes > room:
                self._disagree(
                    link,
                    f"rank {link.peer} advertised {room} B, a direct piece goes to "
                    f"[{at}, {at + nbytes}) (the ranks are not running the same collective)",
                )
            remote, flag = addr + at, DIRECT if op.remote else DIRECT | FIRST
            self.stats["pieces_direct"] += 1
            link.dcredits -= 1
        else:
            if nbytes > self.chunk_bytes:
                raise AssertionError(f"a piece of {nbytes} B exceeds the {self.chunk_bytes} B slot")
            slot = link.send_slot % self.nslots
            remote, rkey, flag = link.remote_addr + slot * self.chunk_bytes, link.remote_rkey, 0
            link.send_slot += 1
            link.credits -= 1
        mr = self.mrs[op.buf]
        sge = (
            [] if not nbytes or mr is None else [verbs.Sge(mr.addr + op.off * self.itemsize, nbytes, mr.lkey)]
        )
        imm = (DATA << KIND_SHIFT) | (link.freed << CREDIT_SHIFT) | flag | (link.send_seq & SEQ_MASK)
        wr = verbs.SendWR(i + 1, verbs.WrOpcode.RDMA_WRITE_WITH_IMM, sge, remote, rkey, imm)
        if link.freed:
            self.stats["credits_carried"] += 1
            link.freed = 0
        link.send_seq += 1
        self.stats["pieces_sent"] += 1
        self._post(link, wr)

    def _post_adverts(self, sched: Schedule) -> None:
        """Advertise the direct messages whose regions became ready."""
        for peer, buf, off, n in sched.take_adverts():
            mr = self.mrs[buf]
            assert mr is not None  # (a direct message is never empty)
            link = self.links[peer]
            link.held.append((mr.addr + off * self.itemsize, mr.rkey, n * self.itemsize))
            self._flush_adverts(link)

    def _flush_adverts(self, link: Link) -> None:
        """Send the held adverts the peer's mailbox has room for (it takes them in order)."""
        while link.held and link.adverts_out - link.begun < MAILBOX:
            self._advertise(link, *link.held.popleft())

    def _advertise(self, link: Link, addr: int, rkey: int, room: int) -> None:
        """Tell ``link``'s peer where its next direct message goes: from ``addr``, ``room`` bytes (the
        sent advert stays in place until its entry comes round again: the NIC reads it again if it
        resends)."""
        k = link.adverts_out % MAILBOX
        link.adverts_out += 1
        at = self._mailbox() + (MAILBOX + k) * ADVERT_BYTES
        grant = 0
        if not link.granted:  # its first: the receives the direct pieces it grants take, posted
            link.granted = True
            grant = self.direct_credits
            self._post_receives(link, grant)
        _ADVERT.pack_into(link.slots, at, addr, rkey, room, grant)
        sge = [verbs.Sge(link.mr.addr + at, _ADVERT.size, link.mr.lkey)]
        remote = link.remote_mailbox + k * ADVERT_BYTES
        imm = (PING << KIND_SHIFT) | ADVERT
        op, flags = verbs.WrOpcode.RDMA_WRITE_WITH_IMM, verbs.SendFlags.NONE
        self._post(link, verbs.SendWR(_CTRL_WR, op, sge, remote, link.remote_rkey, imm, flags))

    def _control_wr(
        self, link: Link, kind: int, value: int, wr_id: int = _CTRL_WR, signaled: bool = True
    ) -> verbs.SendWR:
        """A zero-length Write with Immediate: credits, a goodbye or an abort."""
        imm = (kind << KIND_SHIFT) | (value & LOW)
        op = verbs.WrOpcode.RDMA_WRITE_WITH_IMM
        flags = verbs.SendFlags.SIGNALED if signaled else verbs.SendFlags.NONE
        return verbs.SendWR(wr_id, op, [], link.remote_addr, link.remote_rkey, imm, flags)

    def _control(self, link: Link, kind: int, value: int, signaled: bool = False) -> None:
        """Credits complete unsignaled (a failure still completes, with an error): one completion fewer
        per piece; a goodbye is signaled (`goodbye` waits for it)."""
        self._post(link, self._control_wr(link, kind, value, signaled=signaled))

    def _post(self, link: Link, wr: verbs.SendWR) -> None:
        try:
            verbs.post_send(link.qp, wr)
            if wr.send_flags & verbs.SendFlags.SIGNALED:
                self.unacked += 1
        except verbs.VerbsError as exc:
            self._link_failed(link, exc)

    def _post_receives(self, link: Link, n: int) -> None:
        try:
            verbs.post_recv(link.qp, [verbs.RecvWR(0) for _ in range(n)])
        except verbs.VerbsError as exc:
            self._link_failed(link, exc)

    def _link_failed(self, link: Link, what: object) -> None:
        """``link``'s QP failed (``what``: a refused post, a receive's status), and why, as the transport
        tells it."""
        why = link.qp.core.error_detail
        err = f"{what} ({why})" if why else str(what)
        self._fail(CollectiveError(f"rank {self.rank}: link to rank {link.peer}: {err}", link.peer))

    # -- liveness --------------------------------------------------------------------------------------------
    def check_peers(self) -> None:
        """Ping the peers the schedule waits for that have been silent for ``ping_s``: those it expects
        pieces from, and those its sends wait for (a slot, or the advert of a direct message: nothing in
        flight to them would fail)."""
        now = self.clock()
        for p in self._waits_for():
            link = self.links.get(p)
            if link is not None and link.bye and self._missing(p):  # (nothing more comes from it)
                err = CollectiveError(
                    f"rank {self.rank}: rank {p} closed its communicator while this rank waits for it", p
                )
                self._fail(err, CLOSED)
            if link is not None and now >= link.ping_at:
                link.ping_at = now + self.ping_s
                self.stats["pings"] += 1
                self._ping(link)

    def _waits_for(self) -> list[int]:
        """The peers the schedule waits for: those it expects pieces from, and those its sends wait for (a
        slot, or the advert of a direct message)."""
        sched = self.schedule
        if sched is None:
            return []
        waits = set(sched.expects_from())
        waits.update(p for p, link in self.links.items() if link.pending)
        return sorted(waits)

    def _missing(self, peer: int) -> bool:
        """Whether this rank waits for something ``peer`` has not done yet: a piece of a receive that has
        none from it so far, or a slot or an advert for a send to it. (A receive whose pieces are all in,
        waiting on another of the program's steps, waits for nothing more from the peer, which may well
        have finished and closed: the last rank of a tree reduce.)"""
        link = self.links.get(peer)
        sched = self.schedule
        return bool(link is not None and link.pending) or (sched is not None and sched.wants(peer))

    def _ping(self, link: Link) -> None:
        """A zero-length RDMA Write without an immediate: the peer's NIC acknowledges it (or, dead, does
        not: the Write fails), and it takes none of the peer's posted receives."""
        op, flags = verbs.WrOpcode.RDMA_WRITE, verbs.SendFlags.NONE
        self._post(link, verbs.SendWR(_CTRL_WR, op, [], link.remote_addr, link.remote_rkey, None, flags))

    def _fail(self, err: CollectiveError, why: int = FAILED, who: int | None = None) -> NoReturn:
        """Stop: tell the peers (once) which rank stopped the collective and ``why`` (an abort), then raise
        ``err``. FAILED (the default): ``err.rank`` failed, and is not told; otherwise ``who`` (default
        ``err.rank``) is the rank that stopped it, and every peer is told: one that disagrees, or that
        closed, is alive and would wait for this rank."""
        if self.failed is None:
            self.failed = err
            if who is None:
                who = err.rank
            code = why << WHY_SHIFT | (who if who is not None else WHO)
            # (not told: a failed rank; the rank that stopped the collective, when this rank forwards it,
            # except one that closed, which may still wait for this rank's goodbye)
            skip = err.rank if why == FAILED else who if why != CLOSED else None
            for link in self.links.values():
                if link.peer != skip and link.qp.state == verbs.QpState.RTS:
                    with contextlib.suppress(verbs.VerbsError):
                        verbs.post_send(link.qp, self._control_wr(link, ABORT, code, _ABORT_WR))
                        self._aborts += 1
        raise self.failed

    def _disagree(self, link: Link, text: str) -> NoReturn:
        """Stop: ``link``'s peer is alive, but this rank and it are not running the same collective (or it
        broke the protocol); both it and the other peers are told."""
        self._fail(CollectiveError(f"rank {self.rank}: {text}", link.peer), DISAGREED, self.rank)

    def give_up(self, what: str, timeout: float) -> NoReturn:
        """Stop: the collective did not complete within ``timeout`` s (its communicator's); every peer is
        told, so that none waits for this rank in turn."""
        waits = [p for p in self._waits_for() if self._missing(p)] or self._waits_for()
        on = f", waiting for rank{'s' * (len(waits) > 1)} {', '.join(map(str, waits))}" if waits else ""
        self._fail(
            CollectiveError(
                f"rank {self.rank}: {what} did not complete within {timeout:g} s{on} (a rank away from the "
                "library, or ranks not running the same collective)",
                waits[0] if len(waits) == 1 else None,
            ),
            TIMED_OUT,
            self.rank,
        )

    def goodbye(self, timeout: float) -> None:
        """Before the QPs go: wait until what this rank sent is acknowledged, tell every peer so (BYE), and
        answer the peers until each has said the same (or failed), at most ``timeout`` s. A peer's last
        acknowledgement can be lost; a rank that closed at once would leave the peer resending to nobody
        until its QP failed."""
        if self.failed is not None:
            return
        end = self.clock() + timeout

        def live() -> list[Link]:
            return [k for k in self.links.values() if k.qp.state == verbs.QpState.RTS]

        try:
            self.idle()  # (the slots it owes go back before its goodbye, which says nothing more follows)
            self.settle(lambda: self.unacked <= 0, end)
            for link in live():
                self._control(link, PING, BYE, signaled=True)
            self.settle(lambda: self.unacked <= 0 and all(k.bye for k in live()), end)
        except CollectiveError:
            pass  # a peer failed while closing: nothing more to wait for

    def settle(self, done: Callable[[], bool], end: float | None = None) -> None:
        """Step until ``done()`` (or the clock reaches ``end``), sleeping on the completion channel between
        completions and pinging the peers the schedule waits for (`check_peers`). Raises `CollectiveError`
        when a peer fails."""
        while not done():
            left = None if end is None else end - self.clock()
            if left is not None and left <= 0:
                return
            if self.step():
                continue
            self.idle()
            self._arm()
            if self.step():
                continue
            self._wait(min(0.05, self.ping_s, left if left is not None else 0.05))
            self.check_peers()

    def flush_aborts(self, timeout: float) -> None:
        """Give the abort messages up to ``timeout`` s to reach the peers (before the QPs go away)."""
        end = self.clock() + timeout
        while self._aborts > 0 and self.clock() < end:
            for wc in verbs.poll_cq(self.cq, 512):
                if wc.wr_id == _ABORT_WR and wc.opcode != verbs.WcOpcode.RECV_RDMA_WITH_IMM:
                    self._aborts -= 1
            time.sleep(0.001)

    # -- waiting ---------------------------------------------------------------------------------------------
    def _arm(self) -> None:
        """Ask for an event at the next completion (then `step` once more before `_wait`: what completed
        before arming raises no event)."""
        verbs.req_notify_cq(self.cq)

    def _wait(self, timeout: float) -> None:
        """Sleep until the armed CQ reports a completion (or ``timeout`` s)."""
        if self.channel is None:
            raise CollectiveError("this rank is driven by an event loop; it cannot wait")
        try:
            cq, _ = verbs.get_cq_event(self.channel, timeout)
            verbs.ack_cq_events(cq, 1)
        except verbs.VerbsError as exc:
            if exc.errno != errno.EAGAIN:
                raise

    def close(self) -> None:
        steps: list[Callable[[], None]] = []
        for mr, _b in self._regs.values():
            steps.append(partial(verbs.dereg_mr, mr))
        self._regs.clear()
        for link in self.links.values():
            steps += [partial(verbs.destroy_qp, link.qp), partial(verbs.dereg_mr, link.mr)]
        steps.append(partial(verbs.destroy_cq, self.cq))
        if self.channel is not None:
            steps.append(partial(verbs.destroy_comp_channel, self.channel))
        steps += [partial(verbs.dealloc_pd, self.pd), partial(verbs.destroy_context, self.ctx)]
        self.links.clear()
        self.by_qpn.clear()
        for step in steps:
            with contextlib.suppress(verbs.VerbsError):
                step()
