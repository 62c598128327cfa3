"""How the UDP device makes progress: rounds run by the caller, with waits in between for a datagram, a
wake-up or the next thing due, or by a background thread; and the eventfd that turns readable when a round
finds completions."""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import socket
import threading
from collections.abc import Callable, Sequence

from openmrc.transport.cq import CompletionQueue

_EPOLL_TICK = 0.001  # epoll's timeout unit (s)


class Progress:
    """Runs ``run_round`` (under ``lock``; the datagrams it handled) on a background thread when started,
    and waits between rounds until one of ``sockets`` is readable, `kick` is called or ``due_in()``
    seconds pass (None: nothing is due). ``cqs``: the CQs whose completions `completion_fd` signals."""

    def __init__(
        self,
        *,
        lock: threading.RLock,
        run_round: Callable[[], int],
        due_in: Callable[[], float | None],
        sockets: Sequence[socket.socket],
        cqs: list[CompletionQueue],
    ) -> None:
        self._lock = lock
        self._run_round = run_round
        self._due_in = due_in
        self._cqs = cqs
        # not ``_thread``: mypyc would name its C field ``__thread``, a C keyword
        self._worker: threading.Thread | None = None
        self._stop = False
        self._closed = False
        self._sel = selectors.DefaultSelector()
        self._wake_fd = -1
        self._cq_fd = -1
        self._cq_signalled = False
        self._fds: list[int] = []
        try:
            self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._cq_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            for sock in sockets:
                self._sel.register(sock, selectors.EVENT_READ)
            self._sel.register(self._wake_fd, selectors.EVENT_READ)
            self._fds = [s.fileno() for s in sockets] + [self._wake_fd]
        except BaseException:
            self.close()
            raise

    @property
    def threaded(self) -> bool:
        return self._worker is not None

    def start(self) -> None:
        if self._worker is not None:
            return
        self._stop = False
        self._worker = threading.Thread(target=self._loop, name="openmrc-udp-progress", daemon=True)
        self._worker.start()

    def stop(self) -> None:
        t = self._worker
        if t is None:
            return
        self._stop = True
        self.kick()
        t.join()
        self._worker = None

    def _loop(self) -> None:
        while not self._stop:
            with self._lock:
                if self._closed:
                    return
                n = self._run_round()
            if not n:
                self.wait(0.1)

    def kick(self) -> None:
        """Wake the background thread (new work to send)."""
        if self._worker is not None:
            with contextlib.suppress(OSError):
                os.eventfd_write(self._wake_fd, 1)

    def wait(self, timeout: float | None) -> None:
        """Wait until a socket is readable, a wake-up or the next thing due, at most ``timeout`` s (None: no
        limit)."""
        with self._lock:
            if self._closed:
                return
            due = self._due_in()
            if due is not None:
                timeout = due if timeout is None else min(timeout, due)
        if timeout is not None and 0 < timeout < _EPOLL_TICK:
            # epoll waits in whole milliseconds (rounded up): a SACK due in 20 µs would leave 1 ms late, and
            # every small message's completion with it. select() waits in microseconds.
            try:
                ready, _w, _x = select.select(self._fds, [], [], timeout)
            except (OSError, ValueError):
                return
            if self._wake_fd in ready:
                with contextlib.suppress(OSError):
                    os.eventfd_read(self._wake_fd)
            return
        try:
            events = self._sel.select(timeout)
        except (OSError, ValueError):  # closed under our feet
            return
        for key, _mask in events:
            if key.fileobj == self._wake_fd:
                with contextlib.suppress(OSError):
                    os.eventfd_read(self._wake_fd)

    @property
    def completion_fd(self) -> int:
        return self._cq_fd

    def ack_completion_fd(self) -> None:
        with self._lock:
            with contextlib.suppress(OSError):
                os.eventfd_read(self._cq_fd)
            self._cq_signalled = False

    def note_completions(self) -> None:
        """Make `completion_fd` readable if a CQ holds completions (after a round)."""
        if not self._cq_signalled:
            for cq in self._cqs:
                if len(cq):
                    self._cq_signalled = True
                    os.eventfd_write(self._cq_fd, 1)
                    break

    def close(self) -> None:
        """Close the selector and the eventfds (the thread is stopped first: `stop`)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._sel.close()
        for fd in (self._wake_fd, self._cq_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
