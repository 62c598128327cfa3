"""Completion queues."""

from __future__ import annotations

import errno
from collections import deque

from openmrc.transport.types import LocalProtocolError, WorkCompletion

__all__ = ["CompletionQueue"]


class CompletionQueue:
    """A FIFO of work completions. Overrunning ``depth`` is an error, as in verbs (CQ overrun)."""

    def __init__(self, depth: int = 65536) -> None:
        if depth < 1:
            raise LocalProtocolError(errno.EINVAL, f"CQ depth {depth} < 1")
        self.depth = depth
        self._q: deque[WorkCompletion] = deque()
        self.overrun = False

    def push(self, wc: WorkCompletion) -> None:
        if len(self._q) >= self.depth:
            self.overrun = True
            return
        self._q.append(wc)

    def poll(self, n: int = 1) -> list[WorkCompletion]:
        """Up to ``n`` completions, oldest first."""
        out: list[WorkCompletion] = []
        q = self._q
        while q and len(out) < n:
            out.append(q.popleft())
        return out

    def __len__(self) -> int:
        return len(self._q)
