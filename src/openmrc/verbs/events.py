"""Asynchronous events (mrc_get_async_event): QPs the transport failed, CQs that overran, ports that went
down or up, each handed out once and acknowledged."""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass, field
from enum import IntEnum

from openmrc.transport import QpState
from openmrc.verbs._errors import VerbsError
from openmrc.verbs.cq import Cq
from openmrc.verbs.device import Context
from openmrc.verbs.qp import Qp


class AsyncEventType(IntEnum):
    """ibv_event_type values of the events an MRC device reports."""

    CQ_ERR = 0
    QP_FATAL = 1
    QP_REQ_ERR = 2
    QP_ACCESS_ERR = 3
    DEVICE_FATAL = 8
    PORT_ACTIVE = 9
    PORT_ERR = 10


@dataclass(frozen=True, slots=True, eq=False)
class AsyncEvent:
    """mrc_async_event: ``element`` is the `Qp`, the `Cq` or the port number the event is about."""

    event_type: AsyncEventType
    element: Qp | Cq | int
    context: Context = field(repr=False)


def _scan(ctx: Context) -> None:
    """Queue the events that happened since the last look: QPs the transport moved to ERROR, CQs that
    overran, ports that went down or up."""
    dev = ctx.dev
    with dev.lock:
        for qp in ctx.qps:
            if qp.core.state is QpState.ERROR and not qp.user_error and not qp.error_reported:
                qp.error_reported = True
                ctx._events.append(AsyncEvent(AsyncEventType.QP_FATAL, qp, ctx))
        for cq in ctx.cqs:
            if cq.core.overrun and not cq.overrun_reported:
                cq.overrun_reported = True
                ctx._events.append(AsyncEvent(AsyncEventType.CQ_ERR, cq, ctx))
        up = dev.nic.ports_up
        for port in range(1, len(up)):
            if up[port] != ctx._ports_seen[port]:
                ctx._ports_seen[port] = up[port]
                kind = AsyncEventType.PORT_ACTIVE if up[port] else AsyncEventType.PORT_ERR
                ctx._events.append(AsyncEvent(kind, port, ctx))


def get_async_event(ctx: Context, timeout: float | None = None) -> AsyncEvent:
    """mrc_get_async_event: the next event (a QP the transport failed: QP_FATAL; a CQ overrun: CQ_ERR;
    a port down or up: PORT_ERR / PORT_ACTIVE), waiting up to ``timeout`` seconds (None: until one comes;
    EAGAIN when the time is up). Each must be acknowledged with `ack_async_event`."""
    ctx._check()
    end = None if timeout is None else time.monotonic() + max(0.0, timeout)
    while True:
        _scan(ctx)
        if ctx._events:
            ev = ctx._events.popleft()
            ctx._unacked[id(ev)] = ev
            return ev
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            raise VerbsError(errno.EAGAIN, "no async event within the timeout")
        step = 0.01 if left is None else min(left, 0.01)
        if ctx.dev.threaded:
            time.sleep(step)
        else:
            ctx.dev.progress(step)


def ack_async_event(event: AsyncEvent) -> None:
    """mrc_ack_async_event (EINVAL for an event not handed out, or acknowledged already)."""
    if not isinstance(event, AsyncEvent) or event.context._unacked.pop(id(event), None) is not event:
        raise VerbsError(errno.EINVAL, "the event was not handed out by get_async_event, or is acknowledged")
