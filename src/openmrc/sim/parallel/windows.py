"""The window loop of a split run (`openmrc.sim.parallel`): each rank runs its share window after window,
exchanging what crosses between them after each.

Synchronisation is conservative and window-based, as in ns-3's and OMNeT++'s distributed simulators, and
pipelined: the lookahead ``L`` is the shortest link latency of the fabric, so a packet sent at ``s``
arrives at ``s + L`` or later, and each window is ``W = L / (LAG + 1)`` long. After each window a rank
posts every other one the packets that cross to it, its next event time (with the earliest arrival of
what it posted and may not have been read back yet) and its unfinished flows, without waiting; before
window ``k`` it reads back what every rank posted after window ``k - LAG - 1``: the packets crossing into
window ``k`` or later. So a rank runs up to ``LAG`` windows ahead of the slowest, and a rank that the
machine slows for a while is waited for only when it falls further behind (with ``LAG`` 0, each window
waits for the one before everywhere). What a rank reads back before window ``k`` decides, the same on
every rank: the run ends before window ``k`` when no flow was left after window ``k - LAG - 1`` (the run
ends ``LAG`` windows after the one in which the last flow finished, or at ``until``), and window ``k``
starts at the earliest event anywhere when nothing was left to run before it (idle time is skipped
``LAG`` windows late: those windows ran nothing, so nothing crossed in them). Windows, and where a run
ends, are the same whatever the split.

What a rank posts after a window is a `Window`; what crosses in it, and how it is packed and read back, is
`openmrc.sim.parallel.exchange`. The loop runs with the garbage collector paused, like the engine: the
objects packing and unpacking make would otherwise have it rescan the whole fabric again and again.
"""

from __future__ import annotations

import pickle
import resource
import time
from collections.abc import Callable
from pickle import PickleBuffer
from typing import Any, NamedTuple

from openmrc.sim.engine import PausedGc, Simulator
from openmrc.sim.fabric_sim import FabricSim, Partition, shared_switches
from openmrc.sim.hosts import MrcHost, RemoteHost, set_dest_qp
from openmrc.sim.metrics import SimResults
from openmrc.sim.parallel.channels import LAG, Exchange, Pipelined, pipelined
from openmrc.sim.parallel.exchange import _NEVER, _ROUTE_THERE, _Cut, _dumps
from openmrc.sim.parallel.merge import Share, merge, share
from openmrc.sim.parallel.ranks import PartitionError, owned_of, ranks_of, shortest_link, usable

PROGRESS_S = 0.2
"""Seconds between two calls of a run's ``progress`` (on rank 0)."""


class Ready(NamedTuple):
    """What each rank tells the others before a run: whether it can run its part as asked."""

    problem: str
    """Why it cannot ("": it can)."""
    sharing: bool
    """Its part shares the top switches out by port (`Partition.shared`): every rank's must, or none's."""


class FlowMemory(NamedTuple):
    """A host's flow buffer, as the other ranks' QPs write into it (`_connect_parts`)."""

    host: int
    addr: int
    rkey: int


class Connect(NamedTuple):
    """What a rank tells each other before a run built in parts (`_connect_parts`)."""

    memory: list[FlowMemory]
    """Its hosts' flow buffers."""
    qp_nums: list[int]
    """The numbers of its QPs whose peers the receiving rank made, in flow order."""


class Window(NamedTuple):
    """What a rank posts every other after each window."""

    next_ns: int
    """Its next event's time, or the earliest arrival of what it posted and may not have been read back,
    whichever comes first (`_NEVER`: none)."""
    undone: int
    """Its flows not finished (at their sender, and at their receiver for those it must see end)."""
    head: bytes
    """The head of what crosses to the receiving rank (`exchange._Lane.message`, pickled by `_dumps`;
    b"": nothing crosses)."""
    halt: bool
    """A stop was asked for (on rank 0): every rank stops after the same window."""
    busy_cpu_s: float
    """The CPU seconds the window took it, but its pickling (`SimResults.timings`: ``critical_cpu_s``)."""
    rows: Any
    """The packed rows of what crosses (None with no head): a `PickleBuffer` (out of band: no copy of them
    but the pipe's), or what the exchange hands over of it (a memoryview, bytes)."""


def _check(sim: FabricSim, ranks: int) -> None:
    cfg = sim.config
    if sim.part is not None and sim.part.built and ranks == 1:
        raise PartitionError("a fabric built in parts runs on the ranks it was built for")
    if not cfg.ordered:
        raise PartitionError("a split run needs FabricSimConfig.ordered (set by --ranks)")
    if ranks > 1:
        if any(f.trigger or f.send_done or f.recv_done for f in sim.flows):
            raise PartitionError(
                "flow triggers start one host's flow at another's completion at once: 1 rank only"
            )
        if cfg.validate_wire:
            raise PartitionError("validate_wire: 1 rank only")
        for n, node in enumerate(sim.nodes):  # a cut port is named node << 16 | port (`exchange._Cut`)
            if len(node.ports) >= _ROUTE_THERE:
                raise PartitionError(f"node {n}: {len(node.ports)} ports, a split run names at most 65,534")


def run_split(
    sim: FabricSim,
    ex: Exchange,
    until: int,
    progress: Callable[[FabricSim], None] | None = None,
    *,
    lag: int = LAG,
) -> SimResults:
    """Run this rank's share of ``sim`` to the end (every flow done) or ``until``; every rank gets the
    results of the whole run. ``progress(sim)`` is called on rank 0 about every `PROGRESS_S` seconds; a
    KeyboardInterrupt it raises (Ctrl-C) travels with the next exchange, and every rank raises it after
    the same window. ``lag`` (0 to `LAG`): windows a rank may run ahead of the others (the window is the
    lookahead over ``lag + 1``; the results of a run do not depend on its split, for a given ``lag``)."""
    built = {} if sim.part is None else dict(sim.part.build_times)
    results = _run_rank(sim, ex, until, progress, True, lag, built)
    assert results is not None  # every rank has them
    return results


def _run_rank(
    sim: FabricSim,
    ex: Exchange,
    until: int,
    progress: Callable[[FabricSim], None] | None,
    everyone: bool,
    lag: int,
    built: dict[str, float],
) -> SimResults | None:
    """`run_split`; with ``everyone`` False only rank 0 gathers the shares and merges them into the
    results (the others return None): what forked ranks, whose results nobody reads, leave out.
    ``built``: what building this rank's part took (`SimResults.timings`)."""
    with PausedGc():  # the set-up, the loop, and the results' millions of rows: see PausedGc
        part = sim.part
        in_parts = part is not None and part.built
        try:
            _check(sim, ex.size)
            if not 0 <= lag <= LAG:
                raise PartitionError(f"lag {lag}: from 0 to {LAG} windows")
            rank_of = ranks_of(sim, ex.size)
            owned = owned_of(sim.topo, rank_of, ex.rank)
            if part is not None and in_parts and part.owned != owned:
                whole = [r == ex.rank for r in rank_of]  # (a part built with each switch whole: runs so)
                if part.shared is not None or part.owned != whole:
                    raise PartitionError(f"rank {ex.rank}: the fabric was built for another part")
                owned = whole
            problem = ""
        except PartitionError as exc:
            problem = str(exc)
        shared = part.shared if part is not None and in_parts else shared_switches(sim.topo)
        sharing = shared is not None
        got: list[Ready] = ex.alltoall([Ready(problem, sharing)] * ex.size)
        problems = [g.problem for g in got if g.problem]  # every rank stops, or none
        if not problems and any(g.sharing != sharing for g in got):
            problems = [
                "the ranks' parts were built apart: some share the top switches out by port, some not"
            ]
        if problems:
            raise PartitionError(problems[0])
        w_start = time.perf_counter()
        if part is not None and in_parts:
            part.rank, part.size, part.rank_of = ex.rank, ex.size, rank_of
            _connect_parts(sim, rank_of, ex)
        else:  # every node built: the others stay idle replicas
            part = sim.part = Partition(owned, rank=ex.rank, size=ex.size, rank_of=rank_of, built=False)
            part.shared = shared
            for h in sim.hosts:  # the same memory keys on every rank
                if isinstance(h, MrcHost):
                    h.register_flow_memory()
        sim.faults.owned = owned
        cut = _Cut(sim, rank_of, ex.rank, ex.size)
        lookahead = _lookahead(sim, owned, ex)
        lag = min(lag, lookahead - 1)  # (a window of at least 1 ns)
        start_s = time.perf_counter() - w_start
        times = _windows(sim, cut, ex, until, progress, lag, lookahead // (lag + 1), owned)
        times |= _memory_mb()
        times |= built
        times["start_s"] = start_s
        w_end = time.perf_counter()
        mine = share(sim, part, times)
        times["partial_s"] = time.perf_counter() - w_end
        shares: list[Share]
        if everyone:
            shares = ex.alltoall([mine] * ex.size)
        else:  # rank 0 alone merges: the others send it their share, and no one sends them anything
            shares = ex.alltoall([mine] + [None] * (ex.size - 1))  # (rank 0's own stays here)
            if ex.rank:
                return None
        w_merge = time.perf_counter()
        merge(sim, part, shares[ex.rank :] + shares[: ex.rank])
        results = sim.results()
        results.timings = [s.times for s in shares]
        results.timings[ex.rank]["gather_s"] = w_merge - w_end  # (this rank's share, maybe a copy of `times`)
        results.timings[ex.rank]["merge_s"] = time.perf_counter() - w_merge
        return results


def _lookahead(sim: FabricSim, owned: list[bool], ex: Exchange) -> int:
    """`openmrc.sim.parallel.ranks.lookahead_ns`, each rank looking at the links of its own nodes only
    (every link has a node somewhere)."""
    return usable(min(ex.alltoall([shortest_link(sim.topo, owned)] * ex.size)))


def _windows(
    sim: FabricSim,
    cut: _Cut,
    ex: Exchange,
    until: int,
    progress: Callable[[FabricSim], None] | None,
    lag: int,
    window: int,
    owned: list[bool],
) -> dict[str, float]:
    """`run_split`'s loop: window after window until the run ends (see the module's notes), every rank
    stopping after the same one; where this rank's time went (`SimResults.timings`)."""
    engine = sim.sim
    queued = pipelined(ex)
    mine_src = [f for f in sim.flows if owned[f.src]]
    mine_dst = [f for f in sim.flows if f.imm and owned[f.dst]]
    with PausedGc():  # packing and unpacking make short-lived objects too: see PausedGc
        times = {"run_s": 0.0, "pack_s": 0.0, "exchange_s": 0.0, "unpack_s": 0.0, "windows": 0, "crossing": 0}
        for phase in ("run", "pack", "exchange", "unpack", "loads"):
            times[f"{phase}_cpu_s"] = 0.0
        times["critical_cpu_s"] = 0.0
        c0 = time.process_time()
        shown = time.perf_counter()
        halt = False
        flying: list[int] = []  # the earliest arrival of each message posted and maybe not yet read back
        posted = collected = 0
        end = t = engine.now
        while True:
            c_after = time.process_time()  # (the window's CPU time counts from here, waiting left out)
            if posted > lag:  # what the others sent lag + 1 windows ago: for this window, and what it tells
                got, c_after = _collect(queued, cut, engine, times)
                collected += 1
                if any(
                    g.halt for g in got
                ):  # a stop asked for on rank 0: every rank stops at the same window
                    _drain(queued, cut, engine, times, posted - collected)
                    raise KeyboardInterrupt
                next_t = min(g.next_ns for g in got)  # the earliest event anywhere after that window
                if sum(g.undone for g in got) == 0 or next_t >= _NEVER:
                    break
                if next_t > end:  # nothing ran anywhere since: skip to it
                    t = next_t
            end = min(t + window, until + 1)
            w0, c0w = time.perf_counter(), time.process_time()
            engine.run(until=end - 1)
            w1, c1w = time.perf_counter(), time.process_time()
            nxt = engine.peek()
            soonest = min(lane.soonest for lane in cut.lanes)
            flying.append(soonest)
            del flying[: -(lag + 1)]  # (read back by now: the others run no later window without them)
            local_next = min(*flying, _NEVER if nxt is None else nxt)
            undone = sum(f.finish is None for f in mine_src) + sum(f.recv_finish is None for f in mine_dst)
            msgs = [lane.message() for lane in cut.lanes]
            busy = time.process_time() - c_after  # the window's share but its pickling (a few ms in all)
            # the packed rows beside the rest, out of band (`PipeExchange`: no copy of them but the pipe's)
            out = [
                Window(local_next, undone, b"", halt, busy, None)
                if m is None
                else Window(local_next, undone, _dumps(m.head), halt, busy, PickleBuffer(m.rows))
                for m in msgs
            ]
            w2, c2w = time.perf_counter(), time.process_time()
            queued.post(out)
            posted += 1
            times["run_s"] += w1 - w0
            times["pack_s"] += w2 - w1
            times["exchange_s"] += time.perf_counter() - w2
            times["run_cpu_s"] += c1w - c0w
            times["pack_cpu_s"] += c2w - c1w
            times["exchange_cpu_s"] += time.process_time() - c2w
            times["windows"] += 1
            if progress is not None and ex.rank == 0 and time.perf_counter() - shown > PROGRESS_S:
                shown = time.perf_counter()
                try:
                    progress(sim)
                except KeyboardInterrupt:  # (Ctrl-C): the others hear of it lag + 1 windows on
                    halt = True
            if end > until:
                break
            t = end
        _drain(queued, cut, engine, times, posted - collected)  # (every rank posted as many)
    if sim.sampler is not None:
        sim.sampler.sample()
    times["cpu_s"] = time.process_time() - c0
    return times


def _collect(
    queued: Pipelined, cut: _Cut, engine: Simulator, times: dict[str, float]
) -> tuple[list[Window], float]:
    """The next window's messages of every rank, their packets scheduled here: what each rank sent, and
    the CPU time when they were all here (waiting for them is not this rank's work)."""
    w, c = time.perf_counter(), time.process_time()
    got: list[Window] = queued.collect()
    w_got, c_got = time.perf_counter(), time.process_time()
    times["exchange_s"] += w_got - w
    times["exchange_cpu_s"] += c_got - c
    times["critical_cpu_s"] += max(g.busy_cpu_s for g in got)
    for r, g in enumerate(got):
        if r != cut.rank and g.head:
            c_load = time.process_time()
            head = pickle.loads(g.head)
            times["loads_cpu_s"] += time.process_time() - c_load
            rows = g.rows
            if isinstance(rows, PickleBuffer):  # (an exchange that hands objects over as they are)
                rows = rows.raw()
            times["crossing"] += cut.decode(r, head, rows, engine)
    times["unpack_s"] += time.perf_counter() - w_got
    times["unpack_cpu_s"] += time.process_time() - c_got
    return got, c_got


def _drain(queued: Pipelined, cut: _Cut, engine: Simulator, times: dict[str, float], left: int) -> None:
    """Read back the ``left`` windows' messages still on their way when the loop ends (every rank ends
    it after the same window, having sent as many), so the exchange starts clean."""
    for _ in range(left):
        _collect(queued, cut, engine, times)


def _connect_parts(sim: FabricSim, rank_of: list[int], ex: Exchange) -> None:
    """Before a run built in parts: every rank registers its hosts' flow buffers and tells the others
    their addresses and R_Keys, and the numbers of its QPs whose peers another rank made (each pair of
    ranks noted those QPs in the same order: that of the flows), which it then connects them to."""
    part = sim.part
    assert part is not None  # built in parts
    mrs = [FlowMemory(h.id, *h.register_flow_memory()) for h in sim.hosts if isinstance(h, MrcHost)]
    towards: list[list[Any]] = [[] for _ in range(ex.size)]  # by the peer's rank: its QPs here
    for _host, peer, qp in part.cut_qps:
        towards[rank_of[peer]].append(qp)
    got: list[Connect] = ex.alltoall([Connect(mrs, [qp.qp_num for qp in qps]) for qps in towards])
    for r, theirs in enumerate(got):
        if r == ex.rank:
            continue
        for mr in theirs.memory:
            host = sim.hosts[mr.host]
            assert isinstance(host, RemoteHost)
            host.flow_mr = (mr.addr, mr.rkey)
        for qp, qpn in zip(towards[r], theirs.qp_nums, strict=True):
            set_dest_qp(qp, qpn)


def _memory_mb() -> dict[str, float]:
    """This process's peak resident set (``peak_rss_mb``; a forked rank's counts the pages it still shares
    with the others) and, where Linux tells, its proportional share of what it maps now (``pss_mb``)."""
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["pss_mb"] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out
