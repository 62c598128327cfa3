"""EV event queues (mrc_ctl_create_ev_event_cq, mrc_ctl_poll_ev_event): the EV state changes each EV
profile's event mask selects, queued for the controller with a count of those dropped when it fell behind."""

from __future__ import annotations

import errno
from collections import deque
from typing import Any

from openmrc import verbs
from openmrc.ctl._state import _priv
from openmrc.ctl.records import CtlError, CtlEvEvent, Ev
from openmrc.ev import controller_state
from openmrc.transport import EvEvent


class EvEventCq(verbs.Cq):
    """An EV event queue (mrc_ctl_create_ev_event_cq): at most ``cqe`` events wait; past that the newest
    are dropped and counted, and the next event delivered carries the count (it never overruns). Armed with
    `verbs.req_notify_cq`, it reports to its channel like a CQ; destroyed with `verbs.destroy_cq`."""

    def __init__(
        self, ctx: verbs.Context, cqe: int, cq_context: Any, channel: verbs.CompChannel | None
    ) -> None:
        from openmrc.transport import CompletionQueue

        super().__init__(ctx, CompletionQueue(1), cq_context, channel)
        self._events: deque[CtlEvEvent] = deque()
        self._cap = cqe
        self._dropped = 0
        self._profiles = ctx.dev.nic.profiles

    def _sink(self, ev: EvEvent) -> None:  # from the progress path, under the device lock
        if len(self._events) >= self._cap:
            self._dropped += 1
            return
        self._events.append(
            CtlEvEvent(
                ev.profile_id, Ev(ev.ev, ev.port), self._dropped, controller_state(ev.state), ev.qp_num
            )
        )
        self._dropped = 0
        core = self.core
        if core.armed and core.notify is not None:
            core.armed = 0
            core.notify(core)

    def _released(self) -> None:
        if self._sink in self._profiles.sinks:
            self._profiles.sinks.remove(self._sink)


def create_ev_event_cq(
    ctx: verbs.Context,
    cqe: int,
    cq_context: Any = None,
    channel: verbs.CompChannel | None = None,
    comp_vector: int = 0,
) -> EvEventCq:
    """mrc_ctl_create_ev_event_cq: a queue of the EV state changes every EV profile's event mask selects."""
    _priv(ctx)
    if isinstance(cqe, bool) or not isinstance(cqe, int) or not 1 <= cqe <= verbs.MAX_CQE:
        raise CtlError(errno.EINVAL, f"cqe: {cqe!r} outside 1..{verbs.MAX_CQE}")
    if comp_vector != 0:
        raise CtlError(errno.EINVAL, f"comp_vector: {comp_vector!r}; this device has one vector, 0")
    if channel is not None and (not channel.alive or channel.ctx is not ctx):
        raise CtlError(errno.EINVAL, "channel: destroyed, or of another context")
    cq = EvEventCq(ctx, cqe, cq_context, channel)
    dev = ctx.dev
    with dev.lock:
        if channel is not None:
            cq.core.notify = lambda _c, cq=cq, ch=channel: ch._post(cq)
            channel.cqs.append(cq)
        dev.nic.profiles.sinks.append(cq._sink)
    ctx.cqs.append(cq)
    return cq


def poll_ev_event(ev_cq: EvEventCq, num_entries: int) -> list[CtlEvEvent]:
    """mrc_ctl_poll_ev_event: up to ``num_entries`` events, oldest first (the device makes progress first
    unless its own thread does)."""
    if not isinstance(ev_cq, EvEventCq):
        raise CtlError(errno.EINVAL, "ev_cq: an EV event CQ (create_ev_event_cq)")
    ev_cq._check()
    if isinstance(num_entries, bool) or not isinstance(num_entries, int) or num_entries < 0:
        raise CtlError(errno.EINVAL, f"num_entries: {num_entries!r} is not a count")
    ev_cq.ctx.progress()
    out: list[CtlEvEvent] = []
    with ev_cq.ctx.dev.lock:
        while ev_cq._events and len(out) < num_entries:
            out.append(ev_cq._events.popleft())
    return out
