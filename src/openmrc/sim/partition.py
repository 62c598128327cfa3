"""One simulation split across processes (ranks), with the results of the same run in one process.

Theory of operation
-------------------
Every rank runs only its share of the nodes (`assign_ranks`, from the topology alone: hosts in contiguous
blocks with their T0s, a switch with the rank of its lower neighbours when they agree, the rest, the
spines, shared out in turn), and builds only that share (`FabricSim` with ``owned``): its hosts (NICs,
QPs), its switches and their ports. The top tier (every neighbour a tier below: a Clos's T1s, a fat
tree's cores) is shared out port by port instead (`openmrc.sim.fabric_sim.shared_switches`): every rank
runs each such switch with its ports towards its own nodes, and a packet sent up into one is routed as it
is sent (the switch's choice depends on the packet and the routing state; where ECMP may reconverge
before it arrives, every rank routes it at its arrival) and crosses, if at all, straight to the rank of
the port it leaves by: once when its ends are on different ranks, never when they share one (the whole
switch on one rank would have about half the packets cross twice). `run` and `run_local` take a
builder, called with ``(rank, size)`` in each rank's own process (forked before building, or started by
``mpiexec``); a whole fabric built beforehand still runs, its other nodes idle replicas. A packet
crossing to another rank is shipped there.

Building in parts keeps every value the results depend on the same as in one process:

- *Seeds.* Each NIC's rng is seeded from the simulation's rng in host order; every rank draws all the
  seeds (cheap) and builds the NICs of its hosts only, so each NIC has its one-process seed. Ports of an
  ordered fabric draw from streams seeded by (seed, node, port): no shared draw order at all.
- *QPs and memory.* A NIC draws its QP numbers, memory keys and EV table shuffles from its own rng, in
  the order its flows are set up. Every rank holds the whole flow list and sets up, in flow order, the
  QPs of flows with a local end: a host's draws are then those of one process, in the same order (its
  QP towards a host of another rank is made and connected, towards QP 0, when its pair would be made).
  Only two things cross, once, before the run (`_connect_parts`): the QP numbers of the pairs cut by the
  split (both ranks noted them in flow order, so the lists line up) and each host's flow buffer address
  and R_Key. Nothing changes for a run in one process.
- *The cut.* A port whose peer is on another rank ships what it sends (`crossing._Shipper`); one whose
  peer is a shared switch routes it there and ships it to the rank of the port it leaves by, or keeps it
  (`crossing._Splitter`). The port of another rank's node that leads into this rank (or into a shared
  switch) has a stand-in here (`FabricSim.ghosts`): it delivers what that port ships (through its epoch
  check once failures may hit it) and fails with its link.
- *Failures* are scheduled on every rank, as the same events, and change only the ports a rank has (its
  own and the stand-ins); which switch ports are down, all ECMP reconvergence needs, is kept by
  (node, port) everywhere (`openmrc.sim.failures`).
- *Results.* Each rank reports its flows' ends, its ports' figures (a stand-in's drops count for the
  port it stands for), its hosts' retransmissions and samples; every rank merges them (`_merge`) into
  the whole run's results (`FabricSim.totals`), or, among forked ranks (`run_local`), rank 0 alone:
  the others' results would go unread.

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

What crosses, and how it is packed and read back, is `openmrc.sim.crossing`. The loop runs with the
garbage collector paused, like the engine: the objects packing and unpacking make would otherwise have it
rescan the whole fabric again and again.

The results do not depend on the split because the engine runs in ordered mode
(`FabricSimConfig.ordered`, `Simulator.order_by_origin`): ties are broken by who scheduled an event and
that node's own scheduling order, and each port draws from its own random stream. A node's history therefore
depends only on the packets it receives, and by induction it is the same on any number of ranks. What
would let one host act on another at once (flow triggers, PFC pauses, the RoCEv2 baseline) is refused
when the run has more than one rank.

Two transports carry the exchange: `PipeExchange` (processes forked from this one, no extra needed) and
`MpiExchange` (mpi4py, the ``mpi`` extra, under ``mpiexec``), both `Pipelined`. `run_split` drives either,
or any `Exchange` with an all-to-all alone (each window's then runs as it is posted: no rank runs ahead,
the results are the same).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import os
import pickle
import queue
import resource
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe
from pickle import PickleBuffer
from typing import Any, Final, Protocol

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.topology import Topology
from openmrc.sim.crossing import _NEVER, _ROUTE_THERE, _Cut, _dumps
from openmrc.sim.engine import PausedGc, Simulator
from openmrc.sim.fabric_sim import FabricSim, PortTotals, shared_switches
from openmrc.sim.hosts import MrcHost, RemoteHost, set_dest_qp
from openmrc.sim.metrics import LinkStat, Sample, SimResults
from openmrc.sim.network import Unwired

__all__ = [
    "Exchange",
    "MpiExchange",
    "PartitionError",
    "PipeExchange",
    "assign_ranks",
    "lookahead_ns",
    "mpi_world",
    "owned_nodes",
    "run",
    "run_local",
    "run_split",
]

PROGRESS_S = 0.2
LAG: Final = 1
"""Windows a rank may run ahead of the slowest (`run_split`): each window is the lookahead over ``LAG + 1``,
and what a rank sends after one window is read back only before its ``LAG + 1``-th next."""
_SPARE_FDS: Final = 64
"""File descriptors left for everything but the forked ranks' pipes (`run_local`)."""
_LINK_ROW: Final = 12
"""Ints a link direction takes in a rank's share (`_partial`): node, port, peer, nominal rate, bytes sent,
drops, losses, trims, marks, pauses, time paused (ns), packets sent."""
_PACK_LINK: Final = struct.Struct(f"={_LINK_ROW}q").pack
last_times: list[dict[str, float]] = []
"""Where each rank's time went in this process's last split run, by rank: seconds running its share
(``run_s``), packing, in the exchange (waiting for the others included) and unpacking, the CPU seconds
of each (``*_cpu_s``; ``loads_cpu_s``: unpickling) and in all (``cpu_s``), the number of windows and of
packets it received (``crossing``), and its memory (`_memory_mb`), what building its part took
(`build_times`), the seconds before the loop (``start_s``: connecting the cut QP pairs, the cut) and after
it (``partial_s``: its share of the results; this process's own entry only: ``gather_s``, until every
share was here, and ``merge_s``, merging them into the results). ``critical_cpu_s`` (the same on every
rank): per window, the CPU time of the rank that took the most to run it, pack and unpack, summed: how long
the loop would take on idle cores with a free exchange (a figure a loaded machine does not blur)."""
build_times: dict[str, float] = {}
"""What building this process's part of its last split run took: ``build_s`` and ``build_cpu_s`` (the
builder's whole call) and the peak RSS after it (``build_rss_mb``); a builder may add figures of its own
phases. They travel with the rank's `last_times`."""


class PartitionError(ValueError):
    """A simulation that cannot be split as asked (one line, for the CLI)."""


class Exchange(Protocol):
    """All-to-all exchange among the ranks of one run."""

    rank: int
    size: int

    def alltoall(self, out: list[Any]) -> list[Any]:
        """Send ``out[r]`` to rank ``r`` (``out[rank]`` comes back as is); returns what each rank sent."""
        ...  # pragma: no cover - a protocol


class Pipelined(Exchange, Protocol):
    """An `Exchange` that also sends without waiting: what `post` sends reaches `collect` on each rank in
    the order it was posted (a rank may post further windows before the others collect the first)."""

    def post(self, out: list[Any]) -> None:
        """Send ``out[r]`` to rank ``r``; ``out[rank]`` comes back from the matching `collect`."""
        ...  # pragma: no cover - a protocol

    def collect(self) -> list[Any]:
        """What each rank posted, the earliest posts not yet collected (waits for them)."""
        ...  # pragma: no cover - a protocol


Build = Callable[[tuple[int, int] | None], FabricSim]
"""Builds a simulation, flows and failures included: only the part ``(rank, size)`` runs (`owned_nodes`),
or the whole fabric (None)."""


# -- the split -----------------------------------------------------------------------------------------------
def assign_ranks(fabric: FabricSim | Topology, ranks: int) -> list[int]:
    """The rank of every node: hosts in contiguous blocks of whole T0 groups, each switch with its lower
    neighbours' rank when they agree, the others (spines) shared out in turn."""
    topo = fabric.topo if isinstance(fabric, FabricSim) else fabric
    hosts = topo.num_hosts
    if not 1 <= ranks <= hosts:
        raise PartitionError(f"--ranks {ranks}: need 1..{hosts} (the fabric has {hosts} hosts)")
    if isinstance(topo, MultiPlaneClos):
        return _clos_ranks(topo, ranks)
    return _walk_ranks(topo, ranks)


def _clos_ranks(c: MultiPlaneClos, ranks: int) -> list[int]:
    """`assign_ranks` of a `MultiPlaneClos` from its shape (what the walk gives, without making its
    millions of port references): a T0 goes with its hosts, a T1 reaches every T0 of its plane."""
    hpt = c.hosts_per_t0
    group = [min(ranks - 1, i * hpt * ranks // c.num_hosts) for i in range(c.t0_per_plane)]
    rank = [group[h // hpt] for h in range(c.num_hosts)]
    below = set(group)
    t1s = c.t1_per_plane
    for p in range(c.planes):  # node ids: each plane's T0s, then its T1s
        rank.extend(group)
        if len(below) == 1:
            rank.extend([group[0]] * t1s)
        else:
            rank.extend((p * t1s + j) % ranks for j in range(t1s))
    return rank


def _walk_ranks(topo: Topology, ranks: int) -> list[int]:
    """`assign_ranks` of any topology, walking its links."""
    hosts, nodes = topo.num_hosts, topo.num_nodes()
    groups: dict[int, list[int]] = {}  # host groups by the switch behind their first port
    for h in range(hosts):
        groups.setdefault(topo.ports(h)[0].peer, []).append(h)
    rank = [-1] * nodes
    done = 0
    for g in groups.values():
        r = min(ranks - 1, done * ranks // hosts)
        for h in g:
            rank[h] = r
        done += len(g)
    shared = 0
    frontier = [n for n in range(hosts, nodes)]
    while frontier:
        later = []
        progress = False
        for n in frontier:
            below = {rank[r.peer] for r in topo.ports(n) if rank[r.peer] >= 0}
            if not below:
                later.append(n)
                continue
            if len(below) == 1:
                rank[n] = below.pop()
            else:
                rank[n] = shared % ranks
                shared += 1
            progress = True
        if not progress:  # switches out of reach of any host
            for n in later:
                rank[n] = shared % ranks
                shared += 1
            break
        frontier = later
    return rank


_assigned: list[tuple[list[bool], list[int], int]] = []
"""The last `owned_nodes` answer and the ranks it came of (a fabric built with it needs them again)."""


def owned_nodes(topo: Topology, part: tuple[int, int] | None) -> list[bool] | None:
    """Which nodes rank ``part[0]`` of ``part[1]`` runs (`FabricSim`'s ``owned``); None for no part."""
    if part is None:
        return None
    rank, size = part
    rank_of = assign_ranks(topo, size)
    owned = _owned(topo, rank_of, rank)
    _assigned[:] = [(owned, rank_of, size)]
    return owned


def _owned(topo: Topology, rank_of: list[int], rank: int) -> list[bool]:
    """The nodes rank ``rank`` runs: its own and the shared switches (`shared_switches`: each of their
    ports runs with its peer)."""
    shared = shared_switches(topo)
    if shared is None:
        return [r == rank for r in rank_of]
    return [r == rank or s for r, s in zip(rank_of, shared, strict=True)]


def _ranks_of(sim: FabricSim, size: int) -> list[int]:
    """`assign_ranks` of ``sim``'s fabric, not worked out again when it was built with `owned_nodes`."""
    for owned, rank_of, ranks in _assigned:
        if owned is sim.owned and sim.partial and ranks == size:
            return rank_of
    return assign_ranks(sim, size)


def _lookahead(sim: FabricSim, owned: list[bool], ex: Exchange) -> int:
    """`lookahead_ns`, each rank looking at the links of its own nodes only (every link has a node
    somewhere)."""
    return _usable(min(ex.alltoall([_shortest_link(sim.topo, owned)] * ex.size)))


def lookahead_ns(fabric: FabricSim | Topology) -> int:
    """The lookahead: the shortest link latency anywhere (not only across ranks, so that the windows, the
    lookahead over ``LAG + 1`` each, and with them where a run ends, are the same for every split)."""
    return _usable(_shortest_link(fabric.topo if isinstance(fabric, FabricSim) else fabric, None))


def _shortest_link(topo: Topology, owned: list[bool] | None) -> int:
    """The shortest latency of the links of the ``owned`` nodes (None: of every node; a `MultiPlaneClos`:
    of its two kinds of link, whatever a rank owns, from its shape)."""
    if isinstance(topo, MultiPlaneClos):
        return min(topo.host_link_latency_ns, topo.link_latency_ns if topo.uplinks else _NEVER)
    nodes = range(topo.num_nodes())
    return min(
        (r.latency_ns for n in nodes if owned is None or owned[n] for r in topo.ports(n)), default=_NEVER
    )


def _usable(lat: int) -> int:
    if lat < 1:
        raise PartitionError("a split run needs every link to have a latency of at least 1 ns")
    return lat


def _check(sim: FabricSim, ranks: int) -> None:
    cfg = sim.config
    if sim.partial and ranks == 1:
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
        for n, node in enumerate(sim.nodes):  # a cut port is named node << 16 | port (`crossing._Cut`)
            if len(node.ports) >= _ROUTE_THERE:
                raise PartitionError(f"node {n}: {len(node.ports)} ports, a split run names at most 65,534")


# -- running -------------------------------------------------------------------------------------------------
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
    results = _run_rank(sim, ex, until, progress, True, lag)
    assert results is not None  # every rank has them
    return results


def _run_rank(
    sim: FabricSim,
    ex: Exchange,
    until: int,
    progress: Callable[[FabricSim], None] | None,
    everyone: bool,
    lag: int,
) -> SimResults | None:
    """`run_split`; with ``everyone`` False only rank 0 gathers the shares and merges them into the
    results (the others return None): what forked ranks, whose results nobody reads, leave out."""
    with PausedGc():  # the set-up, the loop, and the results' millions of rows: see PausedGc
        try:
            _check(sim, ex.size)
            if not 0 <= lag <= LAG:
                raise PartitionError(f"lag {lag}: from 0 to {LAG} windows")
            rank_of = _ranks_of(sim, ex.size)
            owned = _owned(sim.topo, rank_of, ex.rank)
            if sim.partial and sim.owned != owned:
                whole = [r == ex.rank for r in rank_of]  # (a part built with each switch whole: runs so)
                if sim.shared is not None or sim.owned != whole:
                    raise PartitionError(f"rank {ex.rank}: the fabric was built for another part")
                owned = whole
            problem = ""
        except PartitionError as exc:
            problem = str(exc)
        sharing = sim.shared is not None
        got = ex.alltoall([(problem, sharing)] * ex.size)
        problems = [p for p, _ in got if p]  # every rank stops, or none
        if not problems and any(s != sharing for _, s in got):
            problems = [
                "the ranks' parts were built apart: some share the top switches out by port, some not"
            ]
        if problems:
            raise PartitionError(problems[0])
        w_start = time.perf_counter()
        if sim.partial:
            _connect_parts(sim, rank_of, ex)
        else:  # every node built: the others stay idle replicas
            sim.owned = owned
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
        times |= build_times
        times["start_s"] = start_s
        w_end = time.perf_counter()
        part = _partial(sim, owned, rank_of, ex.rank)
        times["partial_s"] = time.perf_counter() - w_end
        part["times"] = times
        if everyone:
            parts = ex.alltoall([part] * ex.size)
        else:  # rank 0 alone merges: the others send it their share, and no one sends them anything
            parts = ex.alltoall([part] + [None] * (ex.size - 1))  # (rank 0's own stays here)
            if ex.rank:
                return None
        w_merge = time.perf_counter()
        _merge(sim, parts[ex.rank :] + parts[: ex.rank])
        results = sim.results()
        last_times[:] = [p["times"] for p in parts]
        last_times[ex.rank]["gather_s"] = w_merge - w_end
        last_times[ex.rank]["merge_s"] = time.perf_counter() - w_merge
        return results


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
    stopping after the same one; where this rank's time went (`last_times`)."""
    engine = sim.sim
    queued: Pipelined = ex if isinstance(ex, PipeExchange | MpiExchange) else _Queued(ex)
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
                if any(g[3] for g in got):  # a stop asked for on rank 0: every rank stops at the same window
                    _drain(queued, cut, engine, times, posted - collected)
                    raise KeyboardInterrupt
                next_t = min(g[0] for g in got)  # the earliest event anywhere after that window
                if sum(g[1] for g in got) == 0 or next_t >= _NEVER:
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
                (local_next, undone, b"", halt, busy, None)
                if m is None
                else (local_next, undone, _dumps(m[0]), halt, busy, PickleBuffer(m[1]))
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
) -> tuple[list[Any], float]:
    """The next window's messages of every rank, their packets scheduled here: what each rank sent, and
    the CPU time when they were all here (waiting for them is not this rank's work)."""
    w, c = time.perf_counter(), time.process_time()
    got = queued.collect()
    w_got, c_got = time.perf_counter(), time.process_time()
    times["exchange_s"] += w_got - w
    times["exchange_cpu_s"] += c_got - c
    times["critical_cpu_s"] += max(g[4] for g in got)
    for r, g in enumerate(got):
        events = g[2]
        if r != cut.rank and events:
            c_load = time.process_time()
            head = pickle.loads(events)
            times["loads_cpu_s"] += time.process_time() - c_load
            rows = g[5]
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


class _Queued:
    """An `Exchange` with `alltoall` alone, used as a `Pipelined` one: each window's all-to-all runs as it
    is posted and its result waits for `collect` (no window runs ahead of the others; same results)."""

    def __init__(self, ex: Exchange) -> None:
        self.ex = ex
        self.rank = ex.rank
        self.size = ex.size
        self.waiting: list[list[Any]] = []

    def alltoall(self, out: list[Any]) -> list[Any]:
        return self.ex.alltoall(out)

    def post(self, out: list[Any]) -> None:
        self.waiting.append(self.ex.alltoall(out))

    def collect(self) -> list[Any]:
        return self.waiting.pop(0)


def _connect_parts(sim: FabricSim, rank_of: list[int], ex: Exchange) -> None:
    """Before a run built in parts: every rank registers its hosts' flow buffers and tells the others
    their addresses and R_Keys, and the numbers of its QPs whose peers another rank made (each pair of
    ranks noted those QPs in the same order: that of the flows), which it then connects them to."""
    mrs = [(h.id, *h.register_flow_memory()) for h in sim.hosts if isinstance(h, MrcHost)]
    towards: list[list[Any]] = [[] for _ in range(ex.size)]  # by the peer's rank: its QPs here
    for _host, peer, qp in sim.cut_qps:
        towards[rank_of[peer]].append(qp)
    got = ex.alltoall([(mrs, [qp.qp_num for qp in qps]) for qps in towards])
    for r, (their_mrs, qpns) in enumerate(got):
        if r == ex.rank:
            continue
        for h, addr, rkey in their_mrs:
            host = sim.hosts[h]
            assert isinstance(host, RemoteHost)
            host.flow_mr = (addr, rkey)
        for qp, qpn in zip(towards[r], qpns, strict=True):
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


def _partial(sim: FabricSim, owned: list[bool], rank_of: list[int], rank: int) -> dict[str, Any]:
    """What this rank knows that the others do not: its flows' ends, its ports' figures (and those of the
    stand-ins of other ranks' ports: their drops), its hosts' retransmissions, its samples."""
    flows = {f.id: (f.finish, f.status, f.recv_finish) for f in sim.flows if owned[f.src] or owned[f.dst]}
    links = bytearray()  # a `_LINK_ROW` a link direction, by (node, port): one byte string crosses
    drop_at: dict[tuple[int, int], int] = {}
    stood_in: dict[tuple[int, int], int] = {}  # (node, port) of another rank -> drops on delivery here
    now = sim.sim.now
    shared = sim.shared
    elsewhere = sim.elsewhere
    for n, node in enumerate(sim.nodes):
        mine = owned[n]
        split = shared is not None and shared[n]
        for i, p in enumerate(node.ports):
            if split and (p is elsewhere or rank_of[p.peer.id] != rank):  # another rank's (or idle here)
                continue
            if not mine:  # an idle replica (a fabric built whole)
                if p.drops:
                    stood_in[n, i] = p.drops
                continue
            if p.down_drop_at is not None:
                drop_at[n, i] = p.down_drop_at
            if not isinstance(p.peer, Unwired):  # `FabricSim.link_stat`'s counters, then the packets sent
                links += _PACK_LINK(
                    n, i, p.peer.id, p.nominal_bps, p.sent_bytes, p.drops, p.losses, p.trims, p.marks,
                    p.pauses, p.paused_total_ns(now), p.sent_packets,
                )  # fmt: skip
    for key, p in sim.ghosts.items():
        if p.drops:
            stood_in[key] = p.drops
    s = sim.sampler
    return {
        "flows": flows,
        "links": PickleBuffer(links),  # (out of band: `PipeExchange` sends it from where it is)
        "drop_at": drop_at,
        "stood_in": stood_in,
        "rtx": sum(h.retransmits() for h in sim.hosts if owned[h.id]),
        "events": sim.sim.events - sim.sim.setup_events,  # every rank runs those: counted once, by this one
        "samples": [] if s is None else [dataclasses.astuple(x) for x in s.samples],
        "pair_bytes": [] if s is None else s.pair_bytes,
        "ev_log": [] if s is None else s.ev_log,
    }


def _merge(sim: FabricSim, parts: list[dict[str, Any]]) -> None:
    """This rank (``parts[0]``) takes every rank's share into the whole run's results (`FabricSim.totals`,
    its flows, events and samples)."""
    own = parts[0]
    for part in parts[1:]:
        for f in sim.flows:
            got = part["flows"].get(f.id)
            if got is None:
                continue
            if got[0] is not None:
                f.finish, f.status = got[0], got[1]
            if got[2] is not None:
                f.recv_finish = got[2]
        sim.sim.events += part["events"]
    sim.completed = sum(f.finish is not None for f in sim.flows)
    stood_in: dict[int, int] = {}  # node << 16 | port -> drops at stand-ins of that port
    drop_at: dict[tuple[int, int], int] = {}
    for part in parts:
        for (n, i), extra in part["stood_in"].items():
            key = n << 16 | i
            stood_in[key] = stood_in.get(key, 0) + extra
        drop_at |= part["drop_at"]
    now = sim.sim.now
    link = sim.link_stat
    links: list[LinkStat] = []
    drops, losses, trims, marks, hops = 0, 0, 0, 0, 0
    cols: list[list[int]] = [memoryview(part["links"]).cast("q").tolist() for part in parts]
    pos = [0] * len(cols)
    while True:  # the parts' rows merged by (node, port) (a shared switch's ports come from several parts)
        best, key, after = -1, _NEVER, _NEVER  # the part with the first row, and the next part's first
        for k, c in enumerate(cols):
            j = pos[k]
            if j < len(c):
                here = c[j] << 16 | c[j + 1]
                if here < key:
                    best, key, after = k, here, key
                elif here < after:
                    after = here
        if best < 0:
            break
        c = cols[best]
        j = pos[best]
        while j < len(c) and c[j] << 16 | c[j + 1] < after:
            node, i = c[j], c[j + 1]
            dropped = c[j + 5]
            if stood_in:
                dropped += stood_in.pop(node << 16 | i, 0)
            lost, trimmed, marked = c[j + 6], c[j + 7], c[j + 8]
            links.append(link(now, node, i, c[j + 2], c[j + 3], c[j + 4], dropped, lost, trimmed, marked,
                              c[j + 9], c[j + 10]))  # fmt: skip
            drops += dropped
            losses += lost
            trims += trimmed
            marks += marked
            hops += c[j + 11]
            j += _LINK_ROW
        pos[best] = j
    drops += sum(stood_in.values())  # (drops at a stand-in of a port that no row names: none is wired so)
    counts = {"drops": drops, "trims": trims, "ecn_marks": marks, "packet_hops": hops, "losses": losses}
    counts["retransmits"] = sum(p["rtx"] for p in parts)
    sim.totals = PortTotals(links, counts, drop_at)
    s = sim.sampler
    if s is None:
        return
    s.samples = _merge_samples([p["samples"] for p in parts])
    s.pair_bytes = [
        tuple(map(sum, zip(*per_rank, strict=True)))
        for per_rank in zip(*(p["pair_bytes"] for p in parts), strict=True)
    ]
    s.ev_log = _merge_ev_log([p["ev_log"] for p in parts], [x[0] for x in own["samples"]], s.ev_log_limit)


def _merge_samples(per_rank: list[list[tuple[Any, ...]]]) -> list[Sample]:
    out: list[Sample] = []
    last = (0, 0)
    bad = 0
    for tuples in zip(*per_rank, strict=True):
        row = [Sample(*t) for t in tuples]
        now = row[0].time_ns
        got = sum(s.delivered_bytes for s in row)
        rate = (got - last[1]) * 8e9 / (now - last[0]) if now > last[0] else 0.0
        last = (now, got)
        to_bad = sum(s.ev_to_bad for s in row)
        to_good = sum(s.ev_to_good for s in row)
        bad += to_bad - to_good
        out.append(Sample(now, got, rate, bad, to_bad, to_good, sum(s.watched_bytes for s in row)))
    return out


def _merge_ev_log(
    per_rank: list[list[tuple[int, int, int, int, str]]], ticks: list[int], limit: int
) -> list[tuple[int, int, int, int, str]]:
    """The EV log in the one-process order: by the sample that polled an entry, then by host."""
    merged = [e for log in per_rank for e in log]
    merged.sort(key=lambda e: (bisect.bisect_right(ticks, e[0]), e[1]))
    return merged[:limit]


# -- transports ----------------------------------------------------------------------------------------------
class PipeExchange:
    """The exchange among processes forked from one (no MPI): a pipe (a Unix socket pair) between every
    two ranks."""

    def __init__(self, rank: int, size: int, conns: dict[int, Connection]) -> None:
        self.rank = rank
        self.size = size
        self.conns = conns
        self._inbox: dict[tuple[int, int], bytearray] = {}
        """Where each rank's out-of-band buffers are received, by (rank, place in its message)."""
        self.inline_max = min((_widened(c) for c in conns.values()), default=0) // (4 * (LAG + 1))
        """The largest message (bytes) sent from this thread as it is posted: small enough that the
        messages a rank may post before its peer reads the first (``2 * (LAG + 1)``) fit half the
        smallest send buffer, so it never waits for the peer; larger ones go from a thread (`_sender`)."""
        self._mine: list[Any] = []
        """What this rank posted to itself, not yet collected."""
        self._outbox: queue.SimpleQueue[list[tuple[Connection, bytes, list[memoryview]]]] = (
            queue.SimpleQueue()
        )
        self._queued = 0
        """Messages handed to the sending thread (counted by this thread)."""
        self._sent = 0
        """Of them, sent (counted by the sending thread: neither count is written by both threads)."""
        self._flushed = 0
        """Of them, known here to be sent (`flush`)."""
        self._each_sent = threading.Semaphore(0)
        """Released by the sending thread after each message (or when it gave up)."""
        self._broken = False
        """The sending thread gave up (a peer has gone)."""
        self._sender: threading.Thread | None = None

    def alltoall(self, out: list[Any]) -> list[Any]:
        """`post` and `collect`, returning once this rank's messages are all sent (the process may end)."""
        self.post(out)
        got = self.collect()
        self.flush()
        return got

    def flush(self) -> None:
        """Wait until the sending thread has sent every message handed to it (OSError: it could not: a
        peer has gone)."""
        while self._flushed < self._queued and not self._broken:
            self._each_sent.acquire()
            self._flushed += 1
        if self._broken:
            raise OSError("a rank's message could not be sent: its peer has gone")

    def post(self, out: list[Any]) -> None:
        """Each object pickled, its `PickleBuffer`s apart (out of band), to be sent from where they are (the
        caller leaves them as they are until they are collected back); a small message at once, a large
        one (or any while the thread still has some to send: they keep their order) from a thread."""
        self._mine.append(out[self.rank])
        if not self.conns:  # one rank: nothing to send
            return
        msgs: list[tuple[Connection, bytes, list[memoryview]]] = []
        size = 0
        for r, c in self.conns.items():
            bufs: list[PickleBuffer] = []
            head = pickle.dumps(out[r], 5, buffer_callback=bufs.append)
            views = [b.raw() for b in bufs]
            first = pickle.dumps((head, [v.nbytes for v in views]), 5)
            msgs.append((c, first, views))
            size = max(size, len(first) + sum(v.nbytes for v in views) + _FRAMING * (1 + len(views)))
        if size <= self.inline_max and self._sent == self._queued:  # (a thread to wake costs ~0.3 ms)
            _send(msgs)
            return
        if self._sender is None:
            self._sender = threading.Thread(target=self._sending, daemon=True)
            self._sender.start()
        self._queued += 1
        self._outbox.put(msgs)

    def _sending(self) -> None:
        """The sending thread: each message handed to it, in order (it ends when a peer has gone: that
        rank's next `collect` from it fails)."""
        while True:
            msgs = self._outbox.get()
            try:
                _send(msgs)
            except OSError:
                self._broken = True  # (`flush` hears of it; the next `collect` fails anyway)
                self._each_sent.release()
                return
            self._sent += 1
            self._each_sent.release()

    def collect(self) -> list[Any]:
        """What every rank posted earliest and this rank has not collected yet: each message's out-of-band
        buffers received into a buffer kept per rank and per place, so a window's tens of MB of packed
        packets are copied once, by the pipe, into memory touched before. A received buffer stays valid
        until the next collect."""
        got: list[Any] = [None] * self.size
        got[self.rank] = self._mine.pop(0)
        for r, c in self.conns.items():
            head, sizes = pickle.loads(c.recv_bytes())
            views = []
            for i, n in enumerate(sizes):
                into = self._inbox.get((r, i))
                if into is None or len(into) < n:  # (a new one: the last one's views may still be held)
                    into = self._inbox[r, i] = bytearray(n + n // 4)
                got_n = c.recv_bytes_into(into)  # (alone: compiled, a call in a slice bound may run twice)
                views.append(memoryview(into)[:got_n])
            got[r] = pickle.loads(head, buffers=views)
        return got


def _send(msgs: list[tuple[Connection, bytes, list[memoryview]]]) -> None:
    for c, first, views in msgs:
        c.send_bytes(first)
        for v in views:
            c.send_bytes(v)


_FRAMING: Final = 12
"""Bytes a `Connection` adds to each message it sends (at most)."""
_SEND_BUFFER: Final = 4 << 20
"""The send buffer asked for on each pipe between ranks (the system may grant less)."""


def _widened(conn: Connection) -> int:
    """``conn``'s send buffer (bytes), widened to `_SEND_BUFFER` where the system allows; 0 when it is not
    a socket."""
    try:
        sock = socket.socket(fileno=conn.fileno())
    except OSError:
        return 0
    try:
        with contextlib.suppress(OSError):  # (else the default one stays)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
    finally:
        sock.detach()  # (the descriptor stays the connection's)


class MpiExchange:
    """The exchange over MPI (mpi4py; the ``mpi`` extra), one rank per MPI process."""

    def __init__(self) -> None:
        try:
            from mpi4py import MPI  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:  # pragma: no cover - depends on the extra
            raise PartitionError("MPI runs need mpi4py: pip install 'openmrc[mpi]'") from exc
        self.waitall: Callable[[list[Any]], object] = MPI.Request.Waitall
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._mine: list[Any] = []
        self._sends: list[Any] = []
        """The posted messages' requests not known to be done."""

    def alltoall(self, out: list[Any]) -> list[Any]:
        if self._sends:  # (every rank collected them all: done, or about to be)
            self.waitall(self._sends)
            self._sends = []
        got: list[Any] = self.comm.alltoall(out)
        return got

    def post(self, out: list[Any]) -> None:
        self._mine.append(out[self.rank])
        for r in range(self.size):
            if r != self.rank:
                self._sends.append(self.comm.isend(out[r], dest=r, tag=_POSTED))

    def collect(self) -> list[Any]:
        got: list[Any] = [None] * self.size
        got[self.rank] = self._mine.pop(0)
        for r in range(self.size):
            if r != self.rank:
                got[r] = self.comm.recv(source=r, tag=_POSTED)  # (in the order that rank posted them)
        self._sends = [q for q in self._sends if not q.Test()]
        return got


_POSTED: Final = 7
"""The MPI tag of posted messages (a rank's reach the others in the order it sent them)."""


def mpi_world() -> MpiExchange | None:
    """The MPI exchange when this process is one of several started by ``mpiexec`` (None otherwise)."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"):
        if int(os.environ.get(var, "1") or 1) > 1:
            return MpiExchange()
    return None


def run(
    sim: FabricSim | Build,
    ranks: int,
    until: int,
    progress: Callable[[FabricSim], None] | None = None,
    *,
    lag: int = LAG,
) -> SimResults:
    """Run ``sim`` on ``ranks`` ranks: over MPI when started by ``mpiexec`` (its size must be ``ranks``),
    else in processes forked from this one. ``sim``: a builder (`Build`; each rank builds its part) or a
    simulation built whole."""
    ex = mpi_world()
    if ex is None:
        return run_local(sim, ranks, until, progress, lag=lag)
    if ex.size != ranks:
        raise PartitionError(f"--ranks {ranks}, but mpiexec started {ex.size} processes")
    return run_split(_built(sim, ex), ex, until, progress, lag=lag)


def _built(sim: FabricSim | Build, ex: Exchange) -> FabricSim:
    """This rank's part of ``sim`` (built here, unless built whole already; the whole fabric on 1 rank); if
    any rank cannot build its part, every rank raises that rank's error (none is left waiting for it)."""
    if isinstance(sim, FabricSim):
        build_times.clear()
        return sim
    got = None
    problem = ""
    error: BaseException | None = None
    build_times.clear()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        with PausedGc():  # as the loop: a large fabric's build, made of millions of objects, and its set-up
            got = sim(None if ex.size == 1 else (ex.rank, ex.size))
        build_times["build_s"] = time.perf_counter() - t0
        build_times["build_cpu_s"] = time.process_time() - c0
        build_times["build_rss_mb"] = _memory_mb()["peak_rss_mb"]
    except BaseException as exc:  # a scenario's errors, a stop asked for: the others hear of it first
        error = exc
        problem = str(exc) or f"rank {ex.rank}: {type(exc).__name__}"
    problems = [p for p in ex.alltoall([problem] * ex.size) if p]
    if error is not None and not isinstance(error, ValueError):
        raise error
    if problems or got is None:
        raise PartitionError(problems[0] if problems else "no part built")
    return got


def run_local(
    sim: FabricSim | Build,
    ranks: int,
    until: int,
    progress: Callable[[FabricSim], None] | None = None,
    *,
    lag: int = LAG,
) -> SimResults:
    """Run ``sim`` split over ``ranks`` processes forked from this one (this one is rank 0). A builder
    (`Build`) is called in each rank's process after the fork, for that rank's part (for the whole
    fabric on 1 rank); a simulation built whole is forked as it is."""
    if isinstance(sim, FabricSim):
        _check(sim, ranks)
    if ranks == 1:
        one = PipeExchange(0, 1, {})
        return run_split(_built(sim, one), one, until, progress, lag=lag)
    if ranks < 1:
        raise PartitionError(f"--ranks {ranks}: need at least 1")
    fds = ranks * (ranks - 1)  # a pipe (two ends) between every two ranks, all made before the forks
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit != resource.RLIM_INFINITY and fds + _SPARE_FDS > limit:
        raise PartitionError(
            f"--ranks {ranks}: forked ranks need {fds} file descriptors for their pipes, over this "
            f"process's limit of {limit} (fewer ranks, or mpiexec)"
        )
    pipes = {(a, b): Pipe() for a in range(ranks) for b in range(a + 1, ranks)}

    def conns(rank: int) -> dict[int, Connection]:
        out = {}
        for (a, b), (ca, cb) in pipes.items():
            if a == rank:
                out[b] = ca
            elif b == rank:
                out[a] = cb
        return out

    children = []
    for rank in range(1, ranks):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child (its coverage is not collected)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches rank 0, which stops every rank
            code = 0
            try:
                ex = PipeExchange(rank, ranks, conns(rank))
                _run_rank(_built(sim, ex), ex, until, None, False, lag)
            except BaseException:
                code = 1
            os._exit(code)
        children.append(pid)
    try:
        ex = PipeExchange(0, ranks, conns(0))
        result = _run_rank(_built(sim, ex), ex, until, progress, False, lag)
        assert result is not None  # rank 0 merges
    finally:
        failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    if failed:
        raise PartitionError(f"{len(failed)} of {ranks - 1} forked ranks failed")
    return result
