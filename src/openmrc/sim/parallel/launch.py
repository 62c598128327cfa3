"""Starting a split run (`openmrc.sim.parallel`): over MPI when this process is one of several that
``mpiexec`` started (`run`), else in processes forked from this one (`run_local`), each rank building its
part after the fork (a `Build`) or running its share of a fabric built whole beforehand.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe
from typing import Final

from openmrc.sim.engine import PausedGc
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.metrics import SimResults
from openmrc.sim.parallel.channels import LAG, Exchange, PipeExchange, mpi_world
from openmrc.sim.parallel.ranks import PartitionError
from openmrc.sim.parallel.windows import _check, _memory_mb, _run_rank

_SPARE_FDS: Final = 64
"""File descriptors left for everything but the forked ranks' pipes (`run_local`)."""

Build = Callable[[tuple[int, int] | None], FabricSim]
"""Builds a simulation, flows and failures included: only the part ``(rank, size)`` runs
(`openmrc.sim.partition.assign`), or the whole fabric (None)."""


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
    results = _build_and_run(sim, ex, until, progress, True, lag)
    assert results is not None  # every rank has them
    return results


def _build_and_run(
    sim: FabricSim | Build,
    ex: Exchange,
    until: int,
    progress: Callable[[FabricSim], None] | None,
    everyone: bool,
    lag: int,
) -> SimResults | None:
    """This rank's part of ``sim`` built (`_built`) and run (`openmrc.sim.parallel.windows._run_rank`)."""
    got, built = _built(sim, ex)
    return _run_rank(got, ex, until, progress, everyone, lag, built)


def _built(sim: FabricSim | Build, ex: Exchange) -> tuple[FabricSim, dict[str, float]]:
    """This rank's part of ``sim`` (built here, unless built whole already; the whole fabric on 1 rank) and
    what building it took (`SimResults.timings`); if any rank cannot build its part, every rank raises that
    rank's error (none is left waiting for it)."""
    if isinstance(sim, FabricSim):
        return sim, {}
    got = None
    problem = ""
    error: BaseException | None = None
    times: dict[str, float] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        with PausedGc():  # as the loop: a large fabric's build, made of millions of objects, and its set-up
            got = sim(None if ex.size == 1 else (ex.rank, ex.size))
        if got.part is not None:  # the builder's own phases
            times |= got.part.build_times
        times["build_s"] = time.perf_counter() - t0
        times["build_cpu_s"] = time.process_time() - c0
        times["build_rss_mb"] = _memory_mb()["peak_rss_mb"]
    except BaseException as exc:  # a scenario's errors, a stop asked for: the others hear of it first
        error = exc
        problem = str(exc) or f"rank {ex.rank}: {type(exc).__name__}"
    problems = [p for p in ex.alltoall([problem] * ex.size) if p]
    if error is not None and not isinstance(error, ValueError):
        raise error
    if problems or got is None:
        raise PartitionError(problems[0] if problems else "no part built")
    return got, times


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
        results = _build_and_run(sim, one, until, progress, True, lag)
        assert results is not None  # every rank has them
        return results
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
                _build_and_run(sim, ex, until, None, False, lag)
            except BaseException:
                code = 1
            os._exit(code)
        children.append(pid)
    try:
        ex = PipeExchange(0, ranks, conns(0))
        result = _build_and_run(sim, ex, until, progress, False, lag)
        assert result is not None  # rank 0 merges
    finally:
        failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    if failed:
        raise PartitionError(f"{len(failed)} of {ranks - 1} forked ranks failed")
    return result
