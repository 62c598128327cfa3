"""Ctrl-C during long runs: stop at the next safe point, not inside compiled code.

A KeyboardInterrupt raised asynchronously inside the simulator's compiled (mypyc) modules can abort the
process ("fatal: out of memory", SIGABRT), losing every result. While `deferred_interrupt` is active, the
first Ctrl-C only records the request (`Stop.requested`); the run checks it between steps, in Python, and
stops there cleanly. A second Ctrl-C quits at once with exit status 130.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["Stop", "deferred_interrupt"]


class Stop:
    """Whether Ctrl-C was pressed while `deferred_interrupt` was active."""

    def __init__(self) -> None:
        self.requested = False

    def check(self) -> None:
        """Raise KeyboardInterrupt if a stop was requested (call it where stopping is safe)."""
        if self.requested:
            raise KeyboardInterrupt


@contextmanager
def deferred_interrupt(what: str = "the run") -> Iterator[Stop]:
    """Defer Ctrl-C to `Stop.check` while inside (only in the main thread; elsewhere nothing changes)."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(_signum: int, _frame: FrameType | None) -> None:
        if stop.requested:
            sys.stderr.write("\ninterrupted again: quitting now\n")
            sys.stderr.flush()
            os._exit(130)
        stop.requested = True
        sys.stderr.write(f"\ninterrupt: stopping {what} at the next step (Ctrl-C again to quit now)\n")
        sys.stderr.flush()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
