"""Start ``n`` ranks as local processes, each with a `Communicator`, and collect what each returns.

    results = run_local(4, my_job, arg)            # my_job(comm, arg) in 4 processes

The parent serves the store (`TCPStore`); every rank runs ``fn(comm, *args)`` (``fn`` must be importable:
a module-level function) and its return value comes back in rank order. A rank that raises makes
`run_local` raise `RankFailed` with every rank's outcome once the others have finished or failed (they do:
a dead rank is reported to the survivors by the communicator); ``timeout`` bounds the whole run, after
which every rank still running is killed. Ctrl-C in the parent stops every rank.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

from openmrc.collectives.bootstrap import TCPStore

__all__ = ["RankFailed", "run_local"]


class RankFailed(RuntimeError):
    """One or more ranks failed: ``outcomes[r]`` is ``("ok", value)``, ``("error", text)`` or ``("lost",
    reason)`` for rank r."""

    def __init__(self, outcomes: list[tuple[str, Any]]) -> None:
        bad = [f"rank {r}: {o[1]}".rstrip() for r, o in enumerate(outcomes) if o[0] != "ok"]
        super().__init__("; ".join(line.splitlines()[-1] if line else line for line in bad))
        self.outcomes = outcomes


def _rank_main(
    rank: int,
    size: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    results: Any,
) -> None:
    from openmrc.collectives.communicator import Communicator

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops every rank
    try:
        store = TCPStore("127.0.0.1", port, timeout=60)
        with Communicator(rank, size, store, **kwargs) as comm:
            value = fn(comm, *args)
        results.put((rank, "ok", value))
    except KeyboardInterrupt:
        results.put((rank, "error", "interrupted"))
    except BaseException as exc:  # reported to the parent, which decides
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        results.put((rank, "error", text))


def run_local(
    n: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 300.0,
    comm_kwargs: dict[str, Any] | None = None,
    on_start: Callable[[list[Any]], None] | None = None,
) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``n`` local ranks; their return values in rank order (see the module).
    ``on_start(processes)``: called once the ranks are started (tests kill one from there)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 256:
        raise ValueError(f"n: {n!r} outside 1..256 local ranks")
    ctx = mp.get_context("spawn")
    server = TCPStore("127.0.0.1", 0, is_master=True, timeout=60)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(r, n, server.port, fn, args, dict(comm_kwargs or {}), results),
            name=f"openmrc-rank-{r}",
            daemon=True,
        )
        for r in range(n)
    ]
    outcomes: list[tuple[str, Any] | None] = [None] * n
    try:
        for p in procs:
            p.start()
        if on_start is not None:
            on_start(procs)
        end = time.monotonic() + timeout
        while any(o is None for o in outcomes):
            left = end - time.monotonic()
            if left <= 0:
                for r, o in enumerate(outcomes):
                    if o is None:
                        outcomes[r] = ("lost", f"still running after {timeout:g} s (killed)")
                break
            try:
                r, kind, value = results.get(timeout=min(left, 0.2))
                outcomes[r] = (kind, value)
            except queue.Empty:
                for r, p in enumerate(procs):
                    if outcomes[r] is None and not p.is_alive() and p.exitcode is not None:
                        with contextlib.suppress(queue.Empty):  # its last words may still be on the way
                            rr, kind, value = results.get(timeout=0.5)
                            outcomes[rr] = (kind, value)
                            continue
                        outcomes[r] = ("lost", f"exited with code {p.exitcode} without a result")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
        server.close()
    final = [o if o is not None else ("lost", "no result") for o in outcomes]
    if any(o[0] != "ok" for o in final):
        raise RankFailed(final)
    return [o[1] for o in final]
