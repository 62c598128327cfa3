"""A collective as data: a `Program` of sends, receives and local steps, and the `Schedule` that runs it.

Theory of operation. An algorithm (`openmrc.collectives.algorithms`) writes, for one rank, the steps of a
collective in an order that would be correct if each step ran to completion before the next: send piece
``[off, off+n)`` of buffer ``b`` to rank ``p``; receive the next piece from rank ``q`` and copy it into a
region, or reduce it with a local region into one; copy or scale a local region. `Program` derives from that
sequential order the only orderings that matter -- a read waits for the last write of the elements it reads
(RAW), a write waits for earlier reads and writes of its elements (WAR, WAW) -- by keeping, per buffer, an
interval map of the last writer and the readers since. A send's source must stay intact until the send
completes (the NIC reads it when it segments and again when it retransmits), so a send is a reader until its
completion. What remains is a dependency graph; everything else may overlap: reducing piece i while piece i+1
is on the wire, sending to one peer while receiving from another.

`Schedule` runs a program sans-IO, in the shape of the transport core: it is told that a send completed
(`sent`) or that the next piece from a peer arrived (`arrived`, with the bytes, in the order the peer sent
them), and hands back the sends that became ready (`take_sends`), the arrivals it has finished with
(`take_consumed`, so the driver can give their buffer slots back) and the regions of direct messages that
are ready for their peers to write (`take_adverts`, see `Program`). Local work (reductions, copies) happens
inside those calls, with numpy ufuncs writing ``out=`` the destination. Pieces between two ranks match by
order: the k-th send of rank a to rank b is the k-th receive of rank b from rank a, so a driver must post each
peer's sends in the order `take_sends` hands them out (it does so per peer) and deliver arrivals in order.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np

from openmrc.collectives.ops import finish_avg

__all__ = ["COPY", "RECV", "SCALE", "SEND", "Messages", "Op", "Program", "Schedule", "ScheduleError"]

SEND: Final = 0
RECV: Final = 1
COPY: Final = 2
SCALE: Final = 3
_KIND_NAMES: Final = ("send", "recv", "copy", "scale")


class ScheduleError(Exception):
    """An arrival that does not fit the program (wrong size, or more pieces than it expects)."""


class Op:
    """One step. SEND: ``buf[off:off+n]`` to ``peer``. RECV: the next piece from ``peer`` (``n`` elements)
    into ``buf[off:off+n]``, copied (``src_buf`` -1) or reduced with ``src_buf[src_off:src_off+n]``
    (``first``: the incoming piece is the left operand). COPY: ``src_buf[src_off:]`` to ``buf[off:]``.
    SCALE: divide ``buf[off:off+n]`` by the world size (``avg``). ``remote`` >= 0: a piece of a direct
    message (see `Program`), at that element offset from the message's start (0: its first piece)."""

    __slots__ = ("after", "buf", "deps", "first", "kind", "n", "off", "peer", "remote", "src_buf", "src_off")

    def __init__(
        self,
        kind: int,
        peer: int,
        buf: int,
        off: int,
        n: int,
        src_buf: int,
        src_off: int,
        first: bool,
        remote: int = -1,
    ) -> None:
        self.kind = kind
        self.remote = remote
        self.peer = peer
        self.buf = buf
        self.off = off
        self.n = n
        self.src_buf = src_buf
        self.src_off = src_off
        self.first = first
        self.deps = 0
        self.after: list[int] = []  # ops that wait for this one

    def __repr__(self) -> str:
        where = f"{self.buf}[{self.off}:{self.off + self.n}]"
        src = f" with {self.src_buf}[{self.src_off}:]" if self.src_buf >= 0 else ""
        peer = f" peer {self.peer}" if self.kind in (SEND, RECV) else ""
        direct = "" if self.remote < 0 else f" direct+{self.remote}"
        return f"<{_KIND_NAMES[self.kind]}{peer} {where}{src}{direct}>"


class _Track:
    """Per buffer: a partition of ``[0, size)`` into intervals, each with its last writer and the readers
    since that write (op indices)."""

    __slots__ = ("readers", "size", "starts", "writer")

    def __init__(self, size: int) -> None:
        self.size = size
        self.starts = [0]
        self.writer = [-1]
        self.readers: list[list[int]] = [[]]

    def _cut(self, x: int) -> int:
        """Make ``x`` an interval start; the index of the interval starting there (len: at the end)."""
        if x >= self.size:
            return len(self.starts)
        i = bisect_right(self.starts, x) - 1
        if self.starts[i] != x:
            i += 1
            self.starts.insert(i, x)
            self.writer.insert(i, self.writer[i - 1])
            self.readers.insert(i, list(self.readers[i - 1]))
        return i

    def read(self, off: int, n: int, op: int, deps: set[int]) -> None:
        a, b = self._cut(off), self._cut(off + n)
        for i in range(a, b):
            if self.writer[i] >= 0:
                deps.add(self.writer[i])
            self.readers[i].append(op)

    def write(self, off: int, n: int, op: int, deps: set[int]) -> None:
        a, b = self._cut(off), self._cut(off + n)
        for i in range(a, b):
            if self.writer[i] >= 0:
                deps.add(self.writer[i])
            deps.update(self.readers[i])
        del self.starts[a + 1 : b], self.writer[a + 1 : b], self.readers[a + 1 : b]
        self.writer[a] = op
        self.readers[a] = []


class Program:
    """The steps of one collective on one rank (see the module's docstring). ``sizes``: elements of each
    buffer the steps name by index; ``alias``: buffer indices that are the same memory as another (an
    in-place call: ``{0: 1}`` makes buffer 0 buffer 1).

    Direct messages. The pieces of a message a receive only places (no reduction) may go *direct*: the
    peer writes them straight into their region, no slot and no copy. Such a message is a run of
    receives from one peer into consecutive regions of one buffer (`recv`'s ``direct``: where the
    message starts); once every one of them is ready -- nothing earlier still reads or writes its region --
    the `Schedule` hands out an advert of the region for the driver to send the peer, which holds the
    message's pieces until it has it (a rendezvous, as MPI's for large messages). The peer's sends name
    each piece's offset from the message's start (`send`'s ``remote``). An algorithm gives both sides of
    a pair the same messages, direct or not."""

    def __init__(self, sizes: Sequence[int], alias: dict[int, int] | None = None) -> None:
        self.sizes = list(sizes)
        self.alias = dict(alias or {})
        self.ops: list[Op] = []
        self._tracks = [_Track(s) for s in self.sizes]
        self.peers: set[int] = set()
        self._last_direct: dict[int, tuple[int, int]] = {}  # per peer: where its direct message goes on
        self._messages: Messages | None = None  # (`messages`, once the program is built)

    def _buf(self, b: int) -> int:
        b = self.alias.get(b, b)
        if not 0 <= b < len(self.sizes):
            raise ValueError(f"buffer {b}: the program has {len(self.sizes)}")
        return b

    def _check(self, b: int, off: int, n: int) -> None:
        if n < 0 or off < 0 or off + n > self.sizes[b]:
            raise ValueError(f"region [{off}, {off + n}) outside buffer {b} of {self.sizes[b]} elements")

    def _add(self, op: Op, deps: set[int], after: Iterable[int]) -> int:
        self._messages = None
        i = len(self.ops)
        deps.update(after)
        deps.discard(i)
        op.deps = len(deps)
        for d in deps:
            self.ops[d].after.append(i)
        self.ops.append(op)
        return i

    def send(
        self, peer: int, buf: int, off: int, n: int, after: Iterable[int] = (), *, remote: int | None = None
    ) -> int:
        """``remote``: a piece of a direct message, written at that element offset from the start of the
        region ``peer`` advertises for it (0: the message's first piece; an empty piece is never direct)."""
        b = self._buf(buf)
        self._check(b, off, n)
        deps: set[int] = set()
        i = len(self.ops)
        if n:
            self._tracks[b].read(off, n, i, deps)
        self.peers.add(peer)
        if remote is not None and remote < 0:
            raise ValueError(f"remote: {remote}, an element offset >= 0")
        if remote is None or not n:
            remote = -1
        return self._add(Op(SEND, peer, b, off, n, -1, 0, False, remote), deps, after)

    def recv(
        self,
        peer: int,
        buf: int,
        off: int,
        n: int,
        local: tuple[int, int] | None = None,
        *,
        first: bool = True,
        after: Iterable[int] = (),
        direct: int | None = None,
    ) -> int:
        """``direct``: a piece of a direct message (see the class's docstring) that starts at element
        ``direct`` of ``buf`` (``off``: its first piece; an empty piece is never direct)."""
        b = self._buf(buf)
        self._check(b, off, n)
        sb, so = (-1, 0) if local is None else (self._buf(local[0]), local[1])
        deps: set[int] = set()
        i = len(self.ops)
        if n:
            if sb >= 0:
                self._check(sb, so, n)
                self._tracks[sb].read(so, n, i, deps)
            self._tracks[b].write(off, n, i, deps)
        self.peers.add(peer)
        remote = -1
        if direct is not None and n:
            if sb >= 0 or not 0 <= direct <= off:
                raise ValueError(
                    f"a direct receive from rank {peer} into {b}[{off}:{off + n}] of a message from "
                    f"{direct}: only a copy (no reduction), at or after its message's start, can be direct"
                )
            if direct < off and self._last_direct.get(peer) != (b, off):
                raise ValueError(
                    f"a direct receive from rank {peer} into {b}[{off}:{off + n}]: not the next region of "
                    f"the message from {direct} (a message is a run of receives into consecutive regions)"
                )
            self._last_direct[peer] = (b, off + n)
            remote = off - direct
        else:
            self._last_direct.pop(peer, None)
        return self._add(Op(RECV, peer, b, off, n, sb, so, first, remote), deps, after)

    def copy(self, src_buf: int, src_off: int, buf: int, off: int, n: int, after: Iterable[int] = ()) -> int:
        """Copy a local region; nothing (-1) when source and destination are the same elements."""
        b, sb = self._buf(buf), self._buf(src_buf)
        self._check(b, off, n)
        self._check(sb, src_off, n)
        if n == 0 or (b == sb and off == src_off):
            return -1
        deps: set[int] = set()
        i = len(self.ops)
        self._tracks[sb].read(src_off, n, i, deps)
        self._tracks[b].write(off, n, i, deps)
        return self._add(Op(COPY, -1, b, off, n, sb, src_off, False), deps, after)

    def scale(self, buf: int, off: int, n: int) -> int:
        b = self._buf(buf)
        self._check(b, off, n)
        deps: set[int] = set()
        i = len(self.ops)
        if n:
            self._tracks[b].write(off, n, i, deps)
        return self._add(Op(SCALE, -1, b, off, n, -1, 0, False), deps, ())

    def __len__(self) -> int:
        return len(self.ops)

    def messages(self) -> Messages:
        """The direct messages this rank receives (worked out once for a program run many times)."""
        if self._messages is None:
            self._messages = Messages(self.ops)
        return self._messages


class Messages:
    """A program's direct messages, each peer's in order: ``regions[m]`` (peer, buffer, first element,
    elements) and ``receives[m]`` (how many receives it is), ``of[i]`` the message of receive ``i``,
    ``order[peer]`` that peer's messages; ``exposed``: the buffers peers write them into."""

    __slots__ = ("exposed", "of", "order", "receives", "regions")

    def __init__(self, ops: Sequence[Op]) -> None:
        self.regions: list[tuple[int, int, int, int]] = []
        self.receives: list[int] = []
        self.of: dict[int, int] = {}
        self.order: dict[int, list[int]] = {}
        for i, op in enumerate(ops):
            if op.kind != RECV or op.remote < 0:
                continue
            if op.remote == 0:
                self.order.setdefault(op.peer, []).append(len(self.regions))
                self.regions.append((op.peer, op.buf, op.off, 0))
                self.receives.append(0)
            m = self.order[op.peer][-1]
            peer, buf, off, _ = self.regions[m]
            self.regions[m] = (peer, buf, off, op.off + op.n - off)
            self.receives[m] += 1
            self.of[i] = m
        self.exposed = {r[1] for r in self.regions}


class Schedule:
    """Runs a `Program` over ``buffers`` (1-D numpy arrays, one per program buffer, of its dtype) for a
    reduction ``ufunc`` (and ``avg_of`` > 1: the world size SCALE divides by). See the module's docstring."""

    def __init__(
        self,
        program: Program,
        buffers: Sequence[np.ndarray[Any, Any]],
        ufunc: np.ufunc | None = None,
        avg_of: int = 1,
    ) -> None:
        if len(buffers) < len(program.sizes):
            raise ValueError(f"{len(buffers)} buffers for a program of {len(program.sizes)}")
        self.ops = program.ops
        self.program = program
        self.bufs = list(buffers)
        self.dtype = self.bufs[1].dtype if len(self.bufs) > 1 else self.bufs[0].dtype
        self.ufunc = ufunc
        self.avg_of = avg_of
        self._unmet = [op.deps for op in self.ops]
        self.left = len(self.ops)
        self._sendq: dict[int, deque[int]] = {}
        self._recvq: dict[int, deque[int]] = {}
        for i, op in enumerate(self.ops):
            if op.kind == SEND:
                self._sendq.setdefault(op.peer, deque()).append(i)
            elif op.kind == RECV:
                self._recvq.setdefault(op.peer, deque()).append(i)
        self._arrived: dict[int, deque[tuple[Any, Any]]] = {p: deque() for p in self._recvq}
        self._msgs = program.messages()
        self._unready = list(self._msgs.receives)  # per direct message: its receives not ready yet
        self._next_advert: dict[int, int] = {}  # per peer: its first message not advertised yet
        self.exposed = self._msgs.exposed
        """Buffers peers write direct messages into (the driver registers them for remote writes)."""
        self._adverts: list[tuple[int, int, int, int]] = []
        self._ready: set[int] = set()  # sends with no unmet dependency, not yet handed out
        self._sends: list[Op] = []
        self._send_ids: list[int] = []
        self._consumed: list[Any] = []
        self._dirty_peers: set[int] = set(self._sendq)
        self._started = False

    @property
    def done(self) -> bool:
        return self.left == 0

    def wants(self, peer: int) -> bool:
        """Whether a receive of this program has no arrival from ``peer`` yet (a piece beyond that belongs
        to the peer's next collective)."""
        q = self._recvq.get(peer)
        return q is not None and len(q) > len(self._arrived[peer])

    def expects_from(self) -> list[int]:
        """Peers a receive of this program still waits for (in no particular order)."""
        return [p for p, q in self._recvq.items() if q]

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._run([i for i, n in enumerate(self._unmet) if n == 0])

    def take_sends(self) -> list[tuple[int, Op]]:
        """Sends that may be posted now, each peer's in program order: ``(op index, op)``."""
        out: list[tuple[int, Op]] = []
        for p in self._dirty_peers:
            q = self._sendq[p]
            while q and q[0] in self._ready:
                i = q.popleft()
                self._ready.discard(i)
                out.append((i, self.ops[i]))
        self._dirty_peers.clear()
        return out

    def take_adverts(self) -> list[tuple[int, int, int, int]]:
        """Direct messages whose regions are ready, each peer's in program order: ``(peer, buffer, first
        element, elements)`` for the driver to advertise (the peer holds their pieces until then)."""
        out, self._adverts = self._adverts, []
        return out

    def take_consumed(self) -> list[Any]:
        """The tokens of arrivals this schedule has finished with, in the order they were consumed."""
        out, self._consumed = self._consumed, []
        return out

    def sent(self, i: int) -> None:
        """Send ``i`` completed: its source may change now."""
        self._run(self._complete(i))

    def arrived(self, peer: int, data: Any, token: Any = None) -> None:
        """The next piece from ``peer``: ``data`` a buffer-protocol object of its bytes (kept until the
        arrival is consumed: ``token``, unless None, is handed back by `take_consumed` then), or for a
        direct piece the number of bytes the peer wrote in place."""
        q = self._arrived.get(peer)
        if q is None or len(q) >= len(self._recvq[peer]):
            raise ScheduleError(f"a piece from rank {peer} that no receive of this collective expects")
        q.append((data, token))
        self._run(self._match(peer))

    def _match(self, peer: int) -> list[int]:
        """Consume what arrived from ``peer`` while its next receive is ready; returns the ops that freed."""
        rq, aq = self._recvq[peer], self._arrived[peer]
        freed: list[int] = []
        while rq and aq and self._unmet[rq[0]] == 0:
            i = rq.popleft()
            data, token = aq.popleft()
            self._place(self.ops[i], data)
            if token is not None:
                self._consumed.append(token)
            freed += self._complete(i)
        return freed

    def _place(self, op: Op, data: Any) -> None:
        size = op.n * self.dtype.itemsize
        direct = isinstance(data, int)
        if direct != (op.remote >= 0):
            raise ScheduleError(
                f"{'a direct piece' if direct else 'a piece in a slot'} from rank {op.peer} where this rank "
                f"expects {'one in a slot' if direct else 'a direct one'} "
                "(the ranks are not running the same collective)"
            )
        got = data if direct else memoryview(data).nbytes
        if got != size:
            raise ScheduleError(
                f"a piece of {got} B from rank {op.peer}: expected {size} B "
                "(the ranks are not running the same collective)"
            )
        if not op.n or direct:
            return
        incoming = np.frombuffer(data, dtype=self.dtype, count=op.n)
        dst = self.bufs[op.buf][op.off : op.off + op.n]
        if op.src_buf < 0:
            np.copyto(dst, incoming)
            return
        local = self.bufs[op.src_buf][op.src_off : op.src_off + op.n]
        assert self.ufunc is not None
        if op.first:
            self.ufunc(incoming, local, out=dst)
        else:
            self.ufunc(local, incoming, out=dst)

    def _ready_direct(self, i: int) -> None:
        """Receive ``i`` of a direct message is ready: advertise its message once all of it is, and the
        peer's messages in order."""
        msgs, unready = self._msgs, self._unready
        m = msgs.of[i]
        unready[m] -= 1
        peer = self.ops[i].peer
        order = msgs.order[peer]
        k = self._next_advert.get(peer, 0)
        while k < len(order) and unready[order[k]] == 0:
            self._adverts.append(msgs.regions[order[k]])
            k += 1
        self._next_advert[peer] = k

    def _complete(self, i: int) -> list[int]:
        """Mark ``i`` done; the ops it freed."""
        self.left -= 1
        freed = []
        for j in self.ops[i].after:
            self._unmet[j] -= 1
            if self._unmet[j] == 0:
                freed.append(j)
        return freed

    def _run(self, ready: list[int]) -> None:
        """Run every op made ready, and what running them makes ready, without recursion."""
        work = list(ready)
        while work:
            i = work.pop()
            op = self.ops[i]
            if op.kind == SEND:
                self._ready.add(i)
                self._dirty_peers.add(op.peer)
            elif op.kind == RECV:
                if op.remote >= 0:
                    self._ready_direct(i)
                q = self._recvq[op.peer]
                if q and q[0] == i:
                    work += self._match(op.peer)
            else:
                dst = self.bufs[op.buf][op.off : op.off + op.n]
                if op.kind == COPY:
                    np.copyto(dst, self.bufs[op.src_buf][op.src_off : op.src_off + op.n])
                else:
                    finish_avg(dst, self.avg_of)
                work += self._complete(i)
