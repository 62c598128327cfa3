"""Run every rank's `Schedule` of a collective in one process, with an adversarial in-memory network: each
pair's pieces arrive in order, but which rank moves next, when a send completes and when its bytes are read
(any time between post and completion, as a NIC may) are drawn at random."""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import numpy as np

from openmrc.collectives.program import Program, Schedule


def run_ranks(
    programs: list[Program],
    buffers: list[list[np.ndarray[Any, Any]]],
    ufunc: np.ufunc | None = None,
    avg_of: int = 1,
    seed: int = 0,
    slots: int = 4,
) -> list[Schedule]:
    """Run the programs to completion (raises AssertionError on a deadlock); returns the schedules."""
    rng = random.Random(seed)
    n = len(programs)
    scheds = [Schedule(p, b, ufunc, avg_of) for p, b in zip(programs, buffers, strict=True)]
    credits = {(a, b): slots for a in range(n) for b in range(n)}
    waiting: dict[tuple[int, int], deque[tuple[int, Any]]] = {k: deque() for k in credits}
    wire: dict[tuple[int, int], deque[tuple[int, int, Any, bool]]] = {k: deque() for k in credits}
    inflight: list[tuple[int, int]] = []  # (rank, op) sent, not completed
    for s in scheds:
        s.start()

    def pump(r: int) -> None:
        s = scheds[r]
        for link in s.take_consumed():
            credits[link] += 1
        for i, op in s.take_sends():
            waiting[(r, op.peer)].append((i, op))
        for (a, b), q in waiting.items():  # r's sends, and those the credits r gave back free
            while q and credits[(a, b)] > 0:
                i, op = q.popleft()
                credits[(a, b)] -= 1
                wire[(a, b)].append((i, r, op, False))

    for r in range(n):
        pump(r)
    for _ in range(10_000_000):
        if all(s.done for s in scheds):
            return scheds
        moves: list[tuple[str, Any]] = [("deliver", k) for k, q in wire.items() if q]
        moves += [("complete", x) for x in inflight]
        assert moves, f"deadlock: {[s.left for s in scheds]} ops left"
        kind, what = rng.choice(moves)
        if kind == "deliver":
            a, b = what
            i, r, op, _ = wire[what].popleft()
            src = scheds[a].bufs[op.buf][op.off : op.off + op.n]
            data = src.tobytes()  # the NIC reads the source now; the send completes later
            inflight.append((a, i))
            scheds[b].arrived(a, data, (a, b))  # token: the link whose slot frees
            pump(b)
        else:
            inflight.remove(what)
            a, i = what
            scheds[a].sent(i)
            pump(a)
    raise AssertionError("did not finish")
