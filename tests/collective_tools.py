"""Run every rank's `Schedule` of a collective in one process, with an adversarial in-memory network: each
pair's pieces arrive in order, but which rank moves next, when a send completes and when its bytes are read
(any time between post and completion, as a NIC may) are drawn at random. A direct message waits for the
receiver's advert of its region, needs no credit, and its pieces land in the receiver's buffer as soon as
they are delivered (which may be long before the receiver's program gets to them)."""

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
    adverts: dict[tuple[int, int], deque[tuple[int, int, int]]] = {k: deque() for k in credits}
    target: dict[tuple[int, int], tuple[int, int, int]] = {}  # the advert a's direct message to b uses
    for s in scheds:
        s.start()

    def pump(r: int) -> None:
        s = scheds[r]
        for link in s.take_consumed():
            credits[link] += 1
        for i, op in s.take_sends():
            waiting[(r, op.peer)].append((i, op))
        for peer, buf, off, count in s.take_adverts():
            adverts[(peer, r)].append((buf, off, count))
        for (a, b), q in waiting.items():  # r's sends, and those r's credits and adverts free
            while q:
                i, op = q[0]
                if op.remote == 0:
                    if not adverts[(a, b)]:
                        break
                    target[(a, b)] = adverts[(a, b)].popleft()
                elif op.remote < 0:
                    if credits[(a, b)] <= 0:
                        break
                    credits[(a, b)] -= 1
                q.popleft()
                wire[(a, b)].append((i, a, op, target.get((a, b))))

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
            i, r, op, where = wire[what].popleft()
            src = scheds[a].bufs[op.buf][op.off : op.off + op.n]
            data = src.tobytes()  # the NIC reads the source now; the send completes later
            inflight.append((a, i))
            if op.remote >= 0:  # direct: written into the region rank b advertised
                buf, at, count = where
                assert op.remote + op.n <= count, "a direct piece beyond its advertised region"
                dst = scheds[b].bufs[buf][at + op.remote : at + op.remote + op.n]
                dst[...] = np.frombuffer(data, dst.dtype)
                scheds[b].arrived(a, len(data))
            else:
                scheds[b].arrived(a, data, (a, b))  # token: the link whose slot frees
            pump(b)
        else:
            inflight.remove(what)
            a, i = what
            scheds[a].sent(i)
            pump(a)
    raise AssertionError("did not finish")
