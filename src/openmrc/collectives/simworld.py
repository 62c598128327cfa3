"""`SimWorld`: the real `Communicator` on every host of a simulated fabric, run by the simulator.

Each host of a `FabricSim` is a rank with its own `Communicator` over the host's simulated NIC
(`FabricSim.verbs_device`): the same algorithms, engine, slots and credits as on sockets, moving real data
that is really reduced. Nothing may block here -- every rank lives in one thread -- so the calls are
captured (`Communicator.captured`) rather than run, and `SimWorld` runs every rank's program at once: it
arms each rank's CQ, and whenever the simulator hands one a completion it steps that rank's engine, which
posts what became ready; between those, the simulator runs to its next event. The result is the
collective's data on every rank and its simulated duration.

    world = SimWorld(FabricSim.clos(cfg))
    xs = [np.full(1 << 16, r, np.float32) for r in range(world.size)]
    ns = world.run(lambda comm, r: comm.all_reduce(xs[r]))    # simulated nanoseconds
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from openmrc.collectives.bootstrap import HashStore
from openmrc.collectives.communicator import Communicator
from openmrc.collectives.engine import STEP_WCS, CollectiveError, Engine
from openmrc.collectives.ops import ufunc_of
from openmrc.collectives.program import Schedule

__all__ = ["SimWorld"]


class SimWorld:
    """Ranks 0..n-1 on hosts ``hosts`` (default: every host, in order) of ``fabric``; ``chunk_bytes`` and
    ``slots`` as `Communicator`'s."""

    def __init__(
        self,
        fabric: Any,
        hosts: Sequence[int] | None = None,
        *,
        chunk_bytes: int = 256 * 1024,
        slots: int = 8,
    ) -> None:
        self.fabric = fabric
        self.hosts = list(range(fabric.topo.num_hosts)) if hosts is None else list(hosts)
        n = len(self.hosts)
        if n < 1 or len(set(self.hosts)) != n:
            raise ValueError("hosts: distinct host numbers, at least one")
        store = HashStore(timeout=1.0)
        self.devices = [fabric.verbs_device(h) for h in self.hosts]
        for d in self.devices:
            d.driven = True  # polling a CQ must not run the simulator: `run` does
        self.comms = [
            Communicator(r, n, store, device=d, chunk_bytes=chunk_bytes, slots=slots, prefix="sim")
            for r, d in enumerate(self.devices)
        ]
        sim = fabric.sim
        for c in self.comms:
            c.engine.clock = lambda: sim.now / 1e9  # pings and timeouts in simulated time
            c.captured = []

    @property
    def size(self) -> int:
        return len(self.comms)

    def run(self, call: Callable[[Communicator, int], Any]) -> int:
        """``call(comm, rank)`` on every rank (a collective call of `Communicator`'s API, the same on every
        rank), all run together on the simulated fabric; returns the simulated nanoseconds from the start
        to the last rank's completion. Raises `CollectiveError` if a rank fails or nothing more can happen."""
        for r, c in enumerate(self.comms):
            call(c, r)
        programs = []
        for c in self.comms:
            if len(c.captured or ()) != 1:
                raise ValueError("run: the call must make exactly one collective call on each rank")
            programs.append((c.captured or []).pop())
        peers = [set(prog.peers) for prog, _b, _o in programs]
        for r, ps in enumerate(list(peers)):  # a QP has two ends: a rank that only receives opens its own
            for p in ps:
                if 0 <= p < len(peers):
                    peers[p].add(r)
        opened = [c._open(ps) for c, ps in zip(self.comms, peers, strict=True)]
        for c, made in zip(self.comms, opened, strict=True):
            c._join(made)
        sim = self.fabric.sim
        ready: list[Any] = []
        engines: dict[int, tuple[Engine, Any]] = {}
        t0: int = int(sim.now)
        left = 0
        for c, dev, (prog, bufs, op) in zip(self.comms, self.devices, programs, strict=True):
            eng = c.engine
            sched = Schedule(prog, bufs, ufunc_of(op) if op else None, c.size if op == "avg" else 1)
            core = eng.cq.core
            core.notify = ready.append
            core.arm()
            engines[id(core)] = (eng, dev)
            eng.begin(sched, bufs)
            dev.pump()
            left += not sched.done
        t_end = t0
        try:
            while left:
                while ready:
                    core = ready.pop()
                    eng, dev = engines[id(core)]
                    was_done = eng.schedule is None or eng.schedule.done
                    while eng.step() >= STEP_WCS:  # (a full poll: more may wait)
                        pass
                    dev.pump()
                    core.arm()
                    if not was_done and eng.schedule is not None and eng.schedule.done:
                        left -= 1
                        t_end = int(sim.now)
                if not left:
                    break
                nxt = sim.peek()
                if nxt is None:
                    raise CollectiveError(f"the simulated collective stalled with {left} rank(s) unfinished")
                sim.run(until=nxt)
        finally:
            for eng, _dev in engines.values():
                eng.cq.core.notify = None
                if eng.schedule is not None:
                    eng.end()
        return t_end - t0
