"""How the ranks of a split run (`openmrc.sim.parallel`) reach each other: an all-to-all `Exchange`, and
a `Pipelined` one that also posts without waiting, so a rank may run up to `LAG` windows ahead of the
slowest. Two carry it: `PipeExchange` (processes forked from this one, no extra needed) and `MpiExchange`
(mpi4py, the ``mpi`` extra, under ``mpiexec``); any `Exchange` with an all-to-all alone runs as a
`Pipelined` one through `pipelined` (each window's then runs as it is posted: no rank runs ahead, the
results are the same).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import socket
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pickle import PickleBuffer
from typing import Any, Final, Protocol

from openmrc.sim.parallel.ranks import PartitionError

LAG: Final = 1
"""Windows a rank may run ahead of the slowest (`openmrc.sim.parallel.windows`): each window is the
lookahead over ``LAG + 1``, and what a rank sends after one window is read back only before its
``LAG + 1``-th next."""


class Exchange(Protocol):
    """All-to-all exchange among the ranks of one run."""

    rank: int
    size: int

    def alltoall(self, out: list[Any]) -> list[Any]:
        """Send ``out[r]`` to rank ``r`` (``out[rank]`` comes back as is); returns what each rank sent."""
        ...  # pragma: no cover - a protocol


class Pipelined(Exchange, Protocol):
    """An `Exchange` that also sends without waiting: what `post` sends reaches `collect` on each rank in
    the order it was posted (a rank may post further windows before the others collect the first)."""

    def post(self, out: list[Any]) -> None:
        """Send ``out[r]`` to rank ``r``; ``out[rank]`` comes back from the matching `collect`."""
        ...  # pragma: no cover - a protocol

    def collect(self) -> list[Any]:
        """What each rank posted, the earliest posts not yet collected (waits for them)."""
        ...  # pragma: no cover - a protocol


def pipelined(ex: Exchange) -> Pipelined:
    """``ex`` as a `Pipelined` exchange (itself when it is one)."""
    return ex if isinstance(ex, PipeExchange | MpiExchange) else _Queued(ex)


class _Queued:
    """An `Exchange` with `alltoall` alone, used as a `Pipelined` one: each window's all-to-all runs as it
    is posted and its result waits for `collect` (no window runs ahead of the others; same results)."""

    def __init__(self, ex: Exchange) -> None:
        self.ex = ex
        self.rank = ex.rank
        self.size = ex.size
        self.waiting: list[list[Any]] = []

    def alltoall(self, out: list[Any]) -> list[Any]:
        return self.ex.alltoall(out)

    def post(self, out: list[Any]) -> None:
        self.waiting.append(self.ex.alltoall(out))

    def collect(self) -> list[Any]:
        return self.waiting.pop(0)


class PipeExchange:
    """The exchange among processes forked from one (no MPI): a pipe (a Unix socket pair) between every
    two ranks."""

    def __init__(self, rank: int, size: int, conns: dict[int, Connection]) -> None:
        self.rank = rank
        self.size = size
        self.conns = conns
        self._inbox: dict[tuple[int, int], bytearray] = {}
        """Where each rank's out-of-band buffers are received, by (rank, place in its message)."""
        self.inline_max = min((_widened(c) for c in conns.values()), default=0) // (4 * (LAG + 1))
        """The largest message (bytes) sent from this thread as it is posted: small enough that the
        messages a rank may post before its peer reads the first (``2 * (LAG + 1)``) fit half the
        smallest send buffer, so it never waits for the peer; larger ones go from a thread (`_sender`)."""
        self._mine: list[Any] = []
        """What this rank posted to itself, not yet collected."""
        self._outbox: queue.SimpleQueue[list[tuple[Connection, bytes, list[memoryview]]]] = (
            queue.SimpleQueue()
        )
        self._queued = 0
        """Messages handed to the sending thread (counted by this thread)."""
        self._sent = 0
        """Of them, sent (counted by the sending thread: neither count is written by both threads)."""
        self._flushed = 0
        """Of them, known here to be sent (`flush`)."""
        self._each_sent = threading.Semaphore(0)
        """Released by the sending thread after each message (or when it gave up)."""
        self._broken = False
        """The sending thread gave up (a peer has gone)."""
        self._sender: threading.Thread | None = None

    def alltoall(self, out: list[Any]) -> list[Any]:
        """`post` and `collect`, returning once this rank's messages are all sent (the process may end)."""
        self.post(out)
        got = self.collect()
        self.flush()
        return got

    def flush(self) -> None:
        """Wait until the sending thread has sent every message handed to it (OSError: it could not: a
        peer has gone)."""
        while self._flushed < self._queued and not self._broken:
            self._each_sent.acquire()
            self._flushed += 1
        if self._broken:
            raise OSError("a rank's message could not be sent: its peer has gone")

    def post(self, out: list[Any]) -> None:
        """Each object pickled, its `PickleBuffer`s apart (out of band), to be sent from where they are (the
        caller leaves them as they are until they are collected back); a small message at once, a large
        one (or any while the thread still has some to send: they keep their order) from a thread."""
        self._mine.append(out[self.rank])
        if not self.conns:  # one rank: nothing to send
            return
        msgs: list[tuple[Connection, bytes, list[memoryview]]] = []
        size = 0
        for r, c in self.conns.items():
            bufs: list[PickleBuffer] = []
            head = pickle.dumps(out[r], 5, buffer_callback=bufs.append)
            views = [b.raw() for b in bufs]
            first = pickle.dumps((head, [v.nbytes for v in views]), 5)
            msgs.append((c, first, views))
            size = max(size, len(first) + sum(v.nbytes for v in views) + _FRAMING * (1 + len(views)))
        if size <= self.inline_max and self._sent == self._queued:  # (a thread to wake costs ~0.3 ms)
            _send(msgs)
            return
        if self._sender is None:
            self._sender = threading.Thread(target=self._sending, daemon=True)
            self._sender.start()
        self._queued += 1
        self._outbox.put(msgs)

    def _sending(self) -> None:
        """The sending thread: each message handed to it, in order (it ends when a peer has gone: that
        rank's next `collect` from it fails)."""
        while True:
            msgs = self._outbox.get()
            try:
                _send(msgs)
            except OSError:
                self._broken = True  # (`flush` hears of it; the next `collect` fails anyway)
                self._each_sent.release()
                return
            self._sent += 1
            self._each_sent.release()

    def collect(self) -> list[Any]:
        """What every rank posted earliest and this rank has not collected yet: each message's out-of-band
        buffers received into a buffer kept per rank and per place, so a window's tens of MB of packed
        packets are copied once, by the pipe, into memory touched before. A received buffer stays valid
        until the next collect."""
        got: list[Any] = [None] * self.size
        got[self.rank] = self._mine.pop(0)
        for r, c in self.conns.items():
            head, sizes = pickle.loads(c.recv_bytes())
            views = []
            for i, n in enumerate(sizes):
                into = self._inbox.get((r, i))
                if into is None or len(into) < n:  # (a new one: the last one's views may still be held)
                    into = self._inbox[r, i] = bytearray(n + n // 4)
                got_n = c.recv_bytes_into(into)  # (alone: compiled, a call in a slice bound may run twice)
                views.append(memoryview(into)[:got_n])
            got[r] = pickle.loads(head, buffers=views)
        return got


def _send(msgs: list[tuple[Connection, bytes, list[memoryview]]]) -> None:
    for c, first, views in msgs:
        c.send_bytes(first)
        for v in views:
            c.send_bytes(v)


_FRAMING: Final = 12
"""Bytes a `Connection` adds to each message it sends (at most)."""
_SEND_BUFFER: Final = 4 << 20
"""The send buffer asked for on each pipe between ranks (the system may grant less)."""


def _widened(conn: Connection) -> int:
    """``conn``'s send buffer (bytes), widened to `_SEND_BUFFER` where the system allows; 0 when it is not
    a socket."""
    try:
        sock = socket.socket(fileno=conn.fileno())
    except OSError:
        return 0
    try:
        with contextlib.suppress(OSError):  # (else the default one stays)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
    finally:
        sock.detach()  # (the descriptor stays the connection's)


class MpiExchange:
    """The exchange over MPI (mpi4py; the ``mpi`` extra), one rank per MPI process."""

    def __init__(self) -> None:
        try:
            from mpi4py import MPI  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:  # pragma: no cover - depends on the extra
            raise PartitionError("MPI runs need mpi4py: pip install 'openmrc[mpi]'") from exc
        self.waitall: Callable[[list[Any]], object] = MPI.Request.Waitall
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._mine: list[Any] = []
        self._sends: list[Any] = []
        """The posted messages' requests not known to be done."""

    def alltoall(self, out: list[Any]) -> list[Any]:
        if self._sends:  # (every rank collected them all: done, or about to be)
            self.waitall(self._sends)
            self._sends = []
        got: list[Any] = self.comm.alltoall(out)
        return got

    def post(self, out: list[Any]) -> None:
        self._mine.append(out[self.rank])
        for r in range(self.size):
            if r != self.rank:
                self._sends.append(self.comm.isend(out[r], dest=r, tag=_POSTED))

    def collect(self) -> list[Any]:
        got: list[Any] = [None] * self.size
        got[self.rank] = self._mine.pop(0)
        for r in range(self.size):
            if r != self.rank:
                got[r] = self.comm.recv(source=r, tag=_POSTED)  # (in the order that rank posted them)
        self._sends = [q for q in self._sends if not q.Test()]
        return got


_POSTED: Final = 7
"""The MPI tag of posted messages (a rank's reach the others in the order it sent them)."""


def mpi_world() -> MpiExchange | None:
    """The MPI exchange when this process is one of several started by ``mpiexec`` (None otherwise)."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"):
        if int(os.environ.get(var, "1") or 1) > 1:
            return MpiExchange()
    return None
