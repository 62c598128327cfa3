"""`SimWorld`: the real `Communicator` on every host of a simulated fabric, run by the simulator.

Each host of a `FabricSim` is a rank with its own `Communicator` over the host's simulated NIC
(`FabricSim.verbs_device`): the same algorithms, engine, slots and credits as on sockets, moving real data
that is really reduced. Nothing may block here -- every rank lives in one thread -- so the calls are
captured (`Communicator.captured`) rather than run, and `SimWorld` starts every rank's program at once:
it arms each rank's CQ, and whenever the simulator hands one a completion, an event of the simulator's
own loop steps that rank's engine, which posts what became ready. So a collective runs inside any run of
the simulator (`start`, then the scenario's own loop), or `run` runs the simulator until it is done. The
result is the collective's data on every rank and its simulated duration.

    world = SimWorld(FabricSim.clos(cfg))
    xs = [np.full(1 << 16, r, np.float32) for r in range(world.size)]
    ns = world.run(lambda comm, r: comm.all_reduce(xs[r]))    # simulated nanoseconds
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from openmrc.collectives.bootstrap import HashStore
from openmrc.collectives.communicator import Communicator
from openmrc.collectives.engine import STEP_WCS, CollectiveError
from openmrc.collectives.ops import ufunc_of
from openmrc.collectives.program import Schedule
from openmrc.sim.scenario_workloads import WORKLOAD_PLUGINS, CollectiveKeys

__all__ = ["SimWorld"]


class SimWorld:
    """Ranks 0..n-1 on hosts ``hosts`` (default: every host, in order) of ``fabric``; ``chunk_bytes``,
    ``slots`` and ``direct_bytes`` as `Communicator`'s."""

    def __init__(
        self,
        fabric: Any,
        hosts: Sequence[int] | None = None,
        *,
        chunk_bytes: int = 256 * 1024,
        slots: int = 8,
        direct_bytes: int | str | None = "auto",
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
            Communicator(
                r,
                n,
                store,
                device=d,
                chunk_bytes=chunk_bytes,
                slots=slots,
                direct_bytes=direct_bytes,
                prefix="sim",
                blocking=False,
            )
            for r, d in enumerate(self.devices)
        ]
        sim = fabric.sim
        for c in self.comms:
            c.engine.clock = lambda: sim.now / 1e9  # pings and timeouts in simulated time
            c.captured = []
        self._index: dict[int, int] = {}
        self.left = 0
        self.t_start = self.t_end = 0
        self.error: CollectiveError | None = None

    @property
    def size(self) -> int:
        return len(self.comms)

    def start(self, call: Callable[[Communicator, int], Any]) -> None:
        """``call(comm, rank)`` on every rank (a collective call of `Communicator`'s API, the same on every
        rank): connect what it needs and start it; the simulator's own event loop runs it from here (each
        rank's CQ, when it gets a completion, schedules an event now that steps the rank's engine)."""
        if self.left:
            raise ValueError("start: a collective is still running on this world")
        for r, c in enumerate(self.comms):
            call(c, r)
        programs = []
        for c in self.comms:
            if len(c.captured or ()) != 1:
                for other in self.comms:
                    (other.captured or []).clear()
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
        self.t_start = self.t_end = int(sim.now)
        self.error = None
        for i, (c, dev, (prog, bufs, op)) in enumerate(zip(self.comms, self.devices, programs, strict=True)):
            eng = c.engine
            sched = Schedule(prog, bufs, ufunc_of(op) if op else None, c.size if op == "avg" else 1)
            core = eng.cq.core
            self._index[id(core)] = i
            core.notify = self._notify
            core.arm()
            eng.begin(sched, bufs)
            dev.pump()
            self.left += not sched.done
            sim.push(sim.now, self._step, i)  # what came since the last collective raised no event

    def _notify(self, core: Any) -> None:
        sim = self.fabric.sim
        sim.push(sim.now, self._step, self._index[id(core)])

    def _step(self, i: int) -> None:
        """Rank ``i``'s CQ has completions: take them (credits keep coming after its collective is done)."""
        eng, dev = self.comms[i].engine, self.devices[i]
        sched = eng.schedule
        was_done = sched is None or sched.done
        try:
            while eng.step() >= STEP_WCS:  # (a full poll: more may wait)
                pass
            eng.idle()  # (nothing more until its next completion: the slots it owes go back now)
        except CollectiveError as exc:
            self.error = exc
            self.fabric.sim.halted = True
            return
        dev.pump()
        eng.cq.core.arm()
        if not was_done and sched is not None and sched.done:
            self.left -= 1
            self.t_end = int(self.fabric.sim.now)
            eng.end()

    def close(self) -> None:
        """Release every rank's QPs, slots and CQ."""
        for c in self.comms:
            c.close_timeout = 0.0  # (no goodbye: nothing runs the simulator here)
            c.close()

    def __enter__(self) -> SimWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        """Whether a started collective has ranks left to finish."""
        return self.left > 0

    def run(self, call: Callable[[Communicator, int], Any]) -> int:
        """`start` ``call``, and run the simulator until every rank has finished; returns the simulated
        nanoseconds from the start to the last rank's completion. Raises `CollectiveError` if a rank fails
        or nothing more can happen."""
        self.start(call)
        sim = self.fabric.sim
        try:
            while self.left and self.error is None:
                if sim.peek() is None:
                    raise CollectiveError(
                        f"the simulated collective stalled with {self.left} rank(s) unfinished"
                    )
                sim.run(stop=lambda: self.left == 0)
            if self.error is not None:
                raise self.error
        finally:
            if self.left:
                for c in self.comms:
                    c.engine.cq.core.notify = None
                    if c.engine.schedule is not None:
                        c.engine.end()
                self.left = 0
        return self.t_end - self.t_start


JOB_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


class CollectiveJob:
    """A collective as a simulator workload (scenario ``kind = "collective"``): every host a rank of a
    `SimWorld`, each with its own inputs (small integers: exact in every type), started at ``start_ns`` by
    the simulator's event loop, its result checked when the last rank is done. The fabric waits for it
    (`FabricSim.jobs`); `report` gives its figures."""

    def __init__(
        self,
        fabric: Any,
        op: str,
        size: int,
        *,
        algo: str | None = None,
        dtype: str = "float32",
        chunk_bytes: int = 256 * 1024,
        start_ns: int = 0,
    ) -> None:
        import numpy as np

        from openmrc.collectives.bench import _inputs
        from openmrc.collectives.ops import dtype_of

        if op not in JOB_OPS:
            raise ValueError(f"op {op!r}: one of {', '.join(JOB_OPS)}")
        self.op, self.algo = op, algo
        self.dt = dtype_of(dtype)
        self.world = SimWorld(fabric, chunk_bytes=chunk_bytes, slots=8)
        n = self.world.size
        count = max(1, size // self.dt.itemsize)
        if op in ("reduce_scatter", "all_gather"):
            count = max(1, count // n)  # per rank, as nccl-tests counts them
        self.count = count
        total = count * n if op == "reduce_scatter" else count
        self.inputs = [_inputs(r, total, self.dt, 0) for r in range(n)]
        out = count * n if op == "all_gather" else count
        self.outputs = [np.zeros(out, self.dt) for _ in range(n)]
        self.started = False
        self.ns: int | None = None
        fabric.jobs.append(self)
        fabric.sim.push(start_ns, self._start, None)

    def _call(self, comm: Communicator, r: int) -> None:
        x, y = self.inputs[r], self.outputs[r]
        if self.op == "all_reduce":
            comm.all_reduce(x, y, algo=self.algo)
        elif self.op == "reduce_scatter":
            comm.reduce_scatter(x, y)
        elif self.op == "all_gather":
            comm.all_gather(x, y)
        else:
            if r == 0:
                y[:] = x
            comm.broadcast(y, root=0, algo=self.algo)

    def _start(self, _arg: Any) -> None:
        self.started = True
        self.world.start(self._call)

    @property
    def running(self) -> bool:
        return not self.started or (self.world.running and self.world.error is None)

    def correct(self) -> bool:
        import numpy as np

        if self.world.running or not self.started:
            return False
        n, c = self.world.size, self.count
        if self.op in ("all_reduce", "reduce_scatter"):
            full = np.sum(np.stack(self.inputs), axis=0, dtype=self.dt)
            want = [full if self.op == "all_reduce" else full[r * c : (r + 1) * c] for r in range(n)]
        elif self.op == "all_gather":
            want = [np.concatenate(self.inputs)] * n
        else:
            want = [self.inputs[0]] * n
        return all(bool((o == w).all()) for o, w in zip(self.outputs, want, strict=True))

    def report(self) -> dict[str, Any]:
        """The collective's figures: its simulated time (µs) and whether every rank's result is right."""
        w = self.world
        done = self.started and not w.running
        return {
            "collective": self.op,
            "collective_ranks": w.size,
            "collective_us": (w.t_end - w.t_start) / 1000 if done else None,
            "collective_right": self.correct(),
            **({"collective_error": str(w.error)} if w.error is not None else {}),
        }


def _workload(sim: Any, wl: CollectiveKeys, size: int, start_ns: int) -> None:
    """Scenario ``[workload] kind = "collective"``: a `CollectiveJob` on every host of the fabric."""
    CollectiveJob(
        sim, wl.op, size, algo=wl.algo, dtype=wl.dtype, chunk_bytes=wl.chunk_kib << 10, start_ns=start_ns
    )


def _register() -> None:
    WORKLOAD_PLUGINS["collective"] = _workload


_register()
