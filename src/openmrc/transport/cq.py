"""Completion queues."""

from __future__ import annotations

import errno
from collections import deque
from collections.abc import Callable
from typing import Final

from openmrc.transport.types import LocalProtocolError, WcOpcode, WcStatus, WorkCompletion

__all__ = ["NOTIFY_ALL", "NOTIFY_NONE", "NOTIFY_SOLICITED", "CompletionQueue"]

NOTIFY_NONE: Final = 0
NOTIFY_ALL: Final = 1
NOTIFY_SOLICITED: Final = 2
_SUCCESS: Final = WcStatus.SUCCESS
_RECV_IMM: Final = WcOpcode.RECV_RDMA_WITH_IMM


class CompletionQueue:
    """A FIFO of work completions. Overrunning ``depth`` is an error, as in verbs (CQ overrun).

    Completion notification (``ibv_req_notify_cq``): `arm` asks for one call of ``notify`` at the next
    completion (``NOTIFY_SOLICITED``: the next receive completion or error completion only); the call
    disarms the queue, so each request gives at most one notification."""

    def __init__(self, depth: int = 65536) -> None:
        if depth < 1:
            raise LocalProtocolError(errno.EINVAL, f"CQ depth {depth} < 1")
        self.depth = depth
        self._q: deque[WorkCompletion] | None = None  # made at the first completion (most of a kilobyte)
        self.overrun = False
        self.armed = NOTIFY_NONE
        self.notify: Callable[[CompletionQueue], None] | None = None

    def push(self, wc: WorkCompletion) -> None:
        q = self._q
        if q is None:
            q = self._q = deque()
        if len(q) >= self.depth:
            self.overrun = True
            return
        q.append(wc)
        if self.armed:
            if self.armed == NOTIFY_SOLICITED and wc.status == _SUCCESS and wc.opcode != _RECV_IMM:
                return
            self.armed = NOTIFY_NONE
            if self.notify is not None:
                self.notify(self)

    def arm(self, solicited_only: bool = False) -> None:
        """Request one notification at the next (solicited) completion."""
        self.armed = NOTIFY_SOLICITED if solicited_only else NOTIFY_ALL

    def poll(self, n: int = 1) -> list[WorkCompletion]:
        """Up to ``n`` completions, oldest first."""
        out: list[WorkCompletion] = []
        q = self._q
        while q is not None and q and len(out) < n:
            out.append(q.popleft())
        return out

    def __len__(self) -> int:
        return 0 if self._q is None else len(self._q)
