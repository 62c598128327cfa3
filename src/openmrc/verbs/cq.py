"""Completion channels and CQs: `create_cq` (on a channel or not), `poll_cq`, and notification through the
channel's file descriptor (`req_notify_cq`, `get_cq_event`, `ack_cq_events`)."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import threading
import time
from collections import deque
from typing import Any

from openmrc.transport import CompletionQueue, LocalProtocolError, WorkCompletion
from openmrc.verbs._errors import VerbsError, _err
from openmrc.verbs.device import Context


class CompChannel:
    """mrc_comp_channel: where armed CQs report their next completion. ``fileno()`` is readable while a
    CQ event waits (for `select`, `selectors` and asyncio's ``add_reader``)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.cqs: list[Cq] = []
        self._events: deque[Cq] = deque()
        self._lock = threading.Lock()
        self._rfd, self._wfd = _signal_fd()
        self.alive = True

    def fileno(self) -> int:
        return self._rfd

    def _post(self, cq: Cq) -> None:  # from the progress path, under the device lock
        with self._lock:
            self._events.append(cq)
            with contextlib.suppress(OSError):
                os.write(self._wfd, b"\x01" if self._rfd != self._wfd else (1).to_bytes(8, "little"))

    def _take(self) -> Cq | None:
        with self._lock:
            if not self._events:
                return None
            cq = self._events.popleft()
            if not self._events:  # nothing more waits: the descriptor stops being readable
                with contextlib.suppress(OSError):
                    os.read(self._rfd, 4096)
            return cq

    def _close(self) -> None:
        for fd in {self._rfd, self._wfd}:
            with contextlib.suppress(OSError):
                os.close(fd)


def _signal_fd() -> tuple[int, int]:
    """A non-blocking descriptor pair that can be made readable: an eventfd where there is one."""
    eventfd = getattr(os, "eventfd", None)
    if eventfd is not None:
        fd = eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        return fd, fd
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def create_comp_channel(ctx: Context) -> CompChannel:
    """mrc_create_comp_channel."""
    ctx._check()
    ch = CompChannel(ctx)
    ctx.channels.append(ch)
    return ch


def get_comp_channel_fd(channel: CompChannel) -> int:
    """mrc_get_comp_channel_fd."""
    if not channel.alive:
        raise VerbsError(errno.EINVAL, "the completion channel has been destroyed")
    return channel.fileno()


def destroy_comp_channel(channel: CompChannel) -> None:
    """mrc_destroy_comp_channel: EBUSY while CQs report to it."""
    if not channel.alive:
        raise VerbsError(errno.EINVAL, "the completion channel has been destroyed already")
    if channel.cqs:
        raise VerbsError(errno.EBUSY, f"{len(channel.cqs)} CQ(s) still report to the channel")
    channel.alive = False
    channel.ctx.channels.remove(channel)
    channel._close()


class Cq:
    """mrc_cq: a completion queue of at least ``cqe`` entries, with the application's ``cq_context``."""

    def __init__(
        self, ctx: Context, core: CompletionQueue, cq_context: Any, channel: CompChannel | None
    ) -> None:
        self.ctx = ctx
        self.core = core
        self.cq_context = cq_context
        self.channel = channel
        self.events_unacked = 0
        self.alive = True
        self.overrun_reported = False

    @property
    def cqe(self) -> int:
        return self.core.depth

    def _released(self) -> None:
        """Called once `destroy_cq` has taken the CQ apart (a kind of CQ with more to release extends it)."""

    def _check(self) -> None:
        if not self.alive:
            raise VerbsError(errno.EINVAL, "the CQ has been destroyed")
        self.ctx._check()


MAX_CQE = 1 << 22


def create_cq(
    ctx: Context, cqe: int, cq_context: Any = None, channel: CompChannel | None = None, comp_vector: int = 0
) -> Cq:
    """mrc_create_cq: ``cqe`` entries at least (1 .. 2^22); ``channel``: where `req_notify_cq` reports;
    ``comp_vector`` 0 (a software NIC has one completion vector)."""
    ctx._check()
    if isinstance(cqe, bool) or not isinstance(cqe, int) or not 1 <= cqe <= MAX_CQE:
        raise VerbsError(errno.EINVAL, f"cqe: {cqe!r} outside 1..{MAX_CQE}")
    if comp_vector != 0:
        raise VerbsError(errno.EINVAL, f"comp_vector: {comp_vector!r}; this device has one vector, 0")
    if channel is not None and (not channel.alive or channel.ctx is not ctx):
        raise VerbsError(errno.EINVAL, "channel: destroyed, or of another context")
    dev = ctx.dev
    with dev.lock:
        core = dev.create_cq(cqe)
        cq = Cq(ctx, core, cq_context, channel)
        if channel is not None:
            core.notify = lambda _c, cq=cq, ch=channel: ch._post(cq)
            channel.cqs.append(cq)
    ctx.cqs.append(cq)
    return cq


def poll_cq(cq: Cq, num_entries: int) -> list[WorkCompletion]:
    """mrc_poll_cq: up to ``num_entries`` completions, oldest first (fewer: the CQ is empty). Without a
    progress thread the device makes one round of progress first."""
    cq._check()
    if isinstance(num_entries, bool) or not isinstance(num_entries, int) or num_entries < 0:
        raise VerbsError(errno.EINVAL, f"num_entries: {num_entries!r} is not a count")
    cq.ctx.progress()
    with cq.ctx.dev.lock:
        return cq.core.poll(num_entries)


def req_notify_cq(cq: Cq, solicited_only: bool = False) -> None:
    """mrc_req_notify_cq: report the CQ's next completion on its channel (``solicited_only``: the next
    receive (Write with Immediate) or error completion; MRC Writes carry no solicited flag of their own,
    so every Write with Immediate counts as solicited). A completion already in the CQ does not count."""
    cq._check()
    if cq.channel is None:
        raise VerbsError(errno.EINVAL, "the CQ was created without a completion channel")
    with cq.ctx.dev.lock:
        cq.core.arm(bool(solicited_only))


def get_cq_event(channel: CompChannel, timeout: float | None = None) -> tuple[Cq, Any]:
    """mrc_get_cq_event: the next CQ that reported (and its ``cq_context``), waiting up to ``timeout``
    seconds (None: until one does; EAGAIN when the time is up). Every event must be acknowledged with
    `ack_cq_events`. Without a progress thread, the device makes progress while this waits."""
    if not channel.alive:
        raise VerbsError(errno.EINVAL, "the completion channel has been destroyed")
    ctx = channel.ctx
    end = None if timeout is None else time.monotonic() + max(0.0, timeout)
    while True:
        cq = channel._take()
        if cq is not None:
            cq.events_unacked += 1
            return cq, cq.cq_context
        ctx._check()
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            raise VerbsError(errno.EAGAIN, "no CQ event within the timeout")
        step = 0.01 if left is None else min(left, 0.01)
        dev = ctx.dev
        if dev.threaded:
            select.select([channel._rfd], [], [], step)
        else:
            dev.progress(step)


def ack_cq_events(cq: Cq, nevents: int) -> None:
    """mrc_ack_cq_events: acknowledge ``nevents`` events `get_cq_event` returned for ``cq`` (EINVAL if that
    is more than it returned)."""
    if isinstance(nevents, bool) or not isinstance(nevents, int) or not 0 <= nevents <= cq.events_unacked:
        raise VerbsError(errno.EINVAL, f"nevents: {nevents!r}; {cq.events_unacked} event(s) unacknowledged")
    cq.events_unacked -= nevents


def destroy_cq(cq: Cq) -> None:
    """mrc_destroy_cq: EBUSY while a QP uses it or events of it are unacknowledged (mrc.h waits for the
    acknowledgements; a Python program that forgot one gets the reason instead of a hang)."""
    cq._check()
    users = [qp for qp in cq.ctx.qps if cq in (qp.send_cq, qp.recv_cq)]
    if users:
        raise VerbsError(errno.EBUSY, f"the CQ is in use by {len(users)} QP(s)")
    if cq.events_unacked:
        raise VerbsError(errno.EBUSY, f"{cq.events_unacked} CQ event(s) not acknowledged (ack_cq_events)")
    dev = cq.ctx.dev
    with dev.lock:
        try:
            dev.destroy_cq(cq.core)
        except LocalProtocolError as exc:
            raise _err(exc) from None
        cq.core.notify = None
        cq.core.armed = 0
        cq._released()
    cq.alive = False
    cq.ctx.cqs.remove(cq)
    if cq.channel is not None:
        cq.channel.cqs.remove(cq)
        with cq.channel._lock:
            kept = [c for c in cq.channel._events if c is not cq]
            cq.channel._events.clear()
            cq.channel._events.extend(kept)
