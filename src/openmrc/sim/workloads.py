"""Workloads: the traffic patterns the simulator runs, each a function that adds flows to a `FabricSim`.

* `permutation`: every host sends ``size`` bytes to one other host and receives from one other host, never
  itself (a derangement drawn from the seed: N hosts, N flows; `derangement`).
* `incast`: ``senders`` hosts (the farthest from the target, so their traffic crosses the fabric's upper
  tier) send ``size`` bytes each to one host; optionally a victim flow from another sender to another host
  under the target's T0 shares the congested uplinks but not the congested downlink.
* `all_to_all`: every host sends ``size`` bytes to every other host, each host's messages posted in a
  staggered order (host h starts with h+1) as collective libraries do.
* `ring_allreduce`: NCCL's ring algorithm over ``ranks``: the buffer is cut into one chunk per rank;
  2·(N−1) steps (reduce-scatter then all-gather), where rank r sends chunk to rank r+1 in step k once it
  has received step k−1 from rank r−1. Each step is a Write-with-Immediate, so the receiver's completion
  is what releases the next step.
* `hierarchical_allreduce`: one all-reduce step of a large data-parallel job as NCCL/MPI run it: servers of
  ``gpus_per_server`` GPUs (consecutive hosts); inside a server a reduce-scatter and an all-gather over
  NVLink (not this network: `AllReduceJob.nvlink_ns` computes them); across servers, on each rail (the GPUs
  of one local index), Rabenseifner's all-reduce of size/gpus_per_server bytes — a reduce-scatter by
  recursive halving (step j: partner = server XOR 2^(S−1−j), half the current data) then an all-gather by
  recursive doubling in the reverse order, 2·log2(servers) steps. A host's step j+1 starts once its step-j
  message is sent and its partner's step-j message has arrived; each step's flows are made when that
  barrier fires (`Trigger.make`), and connections live only while in use (`FabricSim.transient_connections`).
* `pair`: one host sends ``messages`` messages to another on their one QP, at most ``depth`` outstanding
  (message i starts when message i − depth completes at the sender), as ib_write_bw (depth 128) and
  ib_write_lat (depth 1) run: the bandwidth is all the bytes over first start to last completion.
* `connection_matrix`: an htsim ``.cm`` file (`openmrc.sim.htsim_cm`): start times, sizes, triggers
  (oneshot, multishot, barrier) fired by send-done or receive-done.
"""

from __future__ import annotations

import functools
import random
from typing import TYPE_CHECKING

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.fattree import FoldedClos
from openmrc.sim.engine import PausedGc
from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.flows import Flow, Trigger

if TYPE_CHECKING:
    from openmrc.sim.htsim_cm import ConnectionMatrix

__all__ = [
    "AllReduceJob",
    "all_to_all",
    "connection_matrix",
    "derangement",
    "hierarchical_allreduce",
    "incast",
    "nvlink_ns",
    "pair",
    "permutation",
    "ring_allreduce",
]


def derangement(n: int, rng: random.Random) -> list[int]:
    """A permutation of ``range(n)`` with no fixed point: ``rng`` shuffles, then the hosts that drew
    themselves trade among themselves (each sends to the next of them, the last to the first); a lone one
    trades with a host ``rng`` draws (it takes that host's destination and that host sends to it). Every
    host that did not draw itself keeps its draw."""
    if n < 2:
        raise ValueError(f"a permutation needs at least two hosts, not {n}")
    perm = list(range(n))
    rng.shuffle(perm)
    fixed = [h for h in range(n) if perm[h] == h]
    if len(fixed) == 1:
        (h,) = fixed
        other = rng.randrange(n - 1)
        if other >= h:  # any host but h
            other += 1
        perm[h], perm[other] = perm[other], h
    elif fixed:
        for i, h in enumerate(fixed):
            perm[h] = fixed[(i + 1) % len(fixed)]
    return perm


def permutation(sim: FabricSim, size: int, *, seed: int = 1, start: int = 0, tag: str = "perm") -> list[Flow]:
    """Host s sends to perm[s], a derangement drawn from ``seed`` (`derangement`): one flow per host, each
    host the destination of one."""
    perm = derangement(sim.topo.num_hosts, random.Random(seed))
    with PausedGc():  # flows set up in bulk: see PausedGc
        return [sim.add_flow(s, d, size, start, tag=tag) for s, d in enumerate(perm)]


def _hosts_per_t0(sim: FabricSim) -> int:
    topo = sim.topo
    if isinstance(topo, MultiPlaneClos):
        return topo.hosts_per_t0
    if isinstance(topo, FoldedClos):
        return topo.hosts_per_tor
    return 1


def incast(
    sim: FabricSim,
    size: int,
    *,
    senders: int,
    target: int = 0,
    start: int = 0,
    victim: bool = False,
    victim_size: int | None = None,
) -> list[Flow]:
    """``senders`` → ``target``, tag "incast"; with ``victim``, one more flow (tag "victim") from a host
    that does not take part to a neighbour of the target under the same T0."""
    hosts = sim.topo.num_hosts
    if not 0 <= target < hosts:
        raise ValueError(f"incast target {target} outside 0..{hosts - 1}")
    if not 1 <= senders < hosts - (2 if victim else 0):
        raise ValueError(f"incast: {senders} senders do not fit {hosts} hosts")
    hpt = _hosts_per_t0(sim)
    base = target - target % hpt
    others = [h for h in range(hosts) if h != target]
    # the farthest hosts first (other T0s, most distant numbers): their traffic crosses the upper tier
    by_distance = sorted(others, key=lambda h: (base <= h < base + hpt, -abs(h - target)))
    chosen = by_distance[:senders]
    flows = [sim.add_flow(s, target, size, start, tag="incast") for s in chosen]
    if victim:
        neighbours = [h for h in range(base, min(base + hpt, hosts)) if h != target and h not in chosen]
        free = [h for h in by_distance if h not in chosen and h not in neighbours]
        if not neighbours or not free:
            raise ValueError("incast victim: no free host under the target's T0 or no free sender")
        flows.append(sim.add_flow(free[0], neighbours[0], victim_size or size, start, tag="victim"))
    return flows


def all_to_all(sim: FabricSim, size: int, *, hosts: list[int] | None = None, start: int = 0) -> list[Flow]:
    """Every host of ``hosts`` (default all) sends ``size`` bytes to every other, tag "alltoall"."""
    group = list(range(sim.topo.num_hosts)) if hosts is None else hosts
    n = len(group)
    if n < 2:
        raise ValueError("all-to-all needs at least two hosts")
    with PausedGc():
        return [
            sim.add_flow(s, group[(i + k) % n], size, start, tag="alltoall")
            for i, s in enumerate(group)
            for k in range(1, n)
        ]


def ring_allreduce(
    sim: FabricSim,
    size: int,
    *,
    ranks: list[int] | None = None,
    order_seed: int | None = None,
    start: int = 0,
) -> list[Flow]:
    """All-reduce of ``size`` bytes per rank over a ring of ``ranks`` (default every host in order; with
    ``order_seed``, a seeded shuffle of them, so more neighbours sit under different T0s). Tag
    "allreduce"; the job time is first start to the last sender completion."""
    group = list(range(sim.topo.num_hosts)) if ranks is None else list(ranks)
    if order_seed is not None:
        random.Random(order_seed).shuffle(group)
    n = len(group)
    if n < 2 or len(set(group)) != n:
        raise ValueError("ring all-reduce needs at least two distinct ranks")
    chunk = max(1, -(-size // n))
    steps = 2 * (n - 1)
    flows: list[Flow] = []
    # released[r] = the trigger that rank r's next step waits for: rank r-1's message arriving at rank r
    released: list[Trigger | None] = [None] * n
    with PausedGc():
        for k in range(steps):
            arrivals = [Trigger(name=f"step {k} at rank {r}") if k + 1 < steps else None for r in range(n)]
            for r in range(n):
                nxt = (r + 1) % n
                trig = released[r]
                f = sim.add_flow(
                    group[r],
                    group[nxt],
                    chunk,
                    start if trig is None else None,
                    tag="allreduce",
                    imm=True,
                    trigger=trig,
                    recv_done=arrivals[nxt],
                )
                flows.append(f)
            released = arrivals
    return flows


class AllReduceJob:
    """One hierarchical all-reduce step over a fabric (`hierarchical_allreduce`): its shape, and what the run
    made of it. Flow ``f`` of the job is network step ``step_of(f)``; the step time is the first start to
    the last completion, at sender or receiver."""

    def __init__(self, sim: FabricSim, size: int, gpus_per_server: int, start: int) -> None:
        hosts = sim.topo.num_hosts
        g = gpus_per_server
        if g < 1 or hosts % g:
            raise ValueError(f"allreduce: {hosts} hosts are not a whole number of {g}-GPU servers")
        servers = hosts // g
        if servers < 2 or servers & (servers - 1):
            raise ValueError(f"allreduce: {servers} servers; recursive halving needs a power of two ≥ 2")
        unit = g * servers
        if size < unit or size % unit:
            raise ValueError(
                f"allreduce: {size} bytes per GPU is not a multiple of {unit} (GPUs per server × servers: "
                f"the last reduce-scatter step sends size/{unit} bytes)"
            )
        self.sim = sim
        self.size = size
        self.gpus_per_server = g
        self.servers = servers
        self.start = start
        rail = size // g
        depth = servers.bit_length() - 1
        self.steps = 2 * depth
        """Network steps: log2(servers) of reduce-scatter, as many of all-gather."""
        self.step_bytes = [rail >> (j + 1) for j in range(depth)] + [
            rail >> (depth - k) for k in range(depth)
        ]
        """Bytes each host sends in each step."""
        self.step_bit = [g << (depth - 1 - j) for j in range(depth)] + [g << k for k in range(depth)]
        """Host-id distance (XOR) to the partner in each step."""
        self.tags = [f"allreduce-step{t}" for t in range(self.steps)]
        self._pending: dict[int, Trigger] = {}  # host * steps + step -> the barrier that starts it

    def partner(self, host: int, step: int) -> int:
        return host ^ self.step_bit[step]

    def step_of(self, f: Flow) -> int:
        return int(f.tag[len("allreduce-step") :])

    def network_bytes(self) -> int:
        """Bytes each host sends over the network: 2·(size/g)·(1 − 1/servers)."""
        return sum(self.step_bytes)

    def nvlink_ns(self, nvlink_bps: int) -> int:
        """The two intra-server phases at ``nvlink_bps`` per GPU (`nvlink_ns`): computed, not simulated."""
        return nvlink_ns(self.size, self.gpus_per_server, nvlink_bps)

    def step_ns(self) -> int | None:
        """Network phase: first start to last completion (None while a step is unfinished)."""
        flows = self.sim.flows
        if not flows or any(f.finish is None or f.recv_finish is None for f in flows):
            return None
        if len(flows) != self.steps * self.sim.topo.num_hosts:
            return None
        return max(max(f.finish or 0, f.recv_finish or 0) for f in flows) - self.start

    def add(self, host: int, step: int, trigger: Trigger | None) -> None:
        """Host ``host``'s message of network step ``step`` (started by ``trigger``, or at the job start)."""
        peer = host ^ self.step_bit[step]
        last = step + 1 == self.steps
        self.sim.add_flow(
            host,
            peer,
            self.step_bytes[step],
            self.start if trigger is None else None,
            tag=self.tags[step],
            imm=True,
            trigger=trigger,
            send_done=None if last else self._barrier(host, step + 1),
            recv_done=None if last else self._barrier(peer, step + 1),
        )

    def _barrier(self, host: int, step: int) -> Trigger:
        key = host * self.steps + step
        trig = self._pending.get(key)
        if trig is None:
            trig = self._pending[key] = Trigger(2, make=functools.partial(self._fired, host, step))
        return trig

    def _fired(self, host: int, step: int, trigger: Trigger) -> None:
        del self._pending[host * self.steps + step]
        self.add(host, step, trigger)


def nvlink_ns(size: int, gpus_per_server: int, nvlink_bps: int) -> int:
    """The two intra-server phases of a hierarchical all-reduce of ``size`` bytes per GPU (reduce-scatter,
    all-gather of the whole buffer among the server's g GPUs, each sending (g−1)/g of it) at ``nvlink_bps``
    per GPU: computed, not simulated."""
    g = gpus_per_server
    return 2 * size * (g - 1) * 8_000_000_000 // (g * nvlink_bps)


def hierarchical_allreduce(
    sim: FabricSim, size: int, *, gpus_per_server: int = 8, start: int = 0, transient: bool = True
) -> AllReduceJob:
    """One all-reduce of ``size`` bytes per GPU, hierarchical (see the module notes): the first network
    step's flows now, each later one when its barrier fires. ``size`` must be a multiple of the host count
    (the last reduce-scatter step sends size/hosts bytes). Not ``transient``: every connection is kept for
    the whole step (a QP pair per direction, made at first use; see docs/allreduce.md for what it costs)."""
    job = AllReduceJob(sim, size, gpus_per_server, start)
    if transient:
        sim.transient_connections()
    with PausedGc():
        for h in range(sim.topo.num_hosts):
            job.add(h, 0, None)
    return job


def pair(
    sim: FabricSim,
    size: int,
    *,
    src: int,
    dst: int,
    messages: int,
    depth: int = 1,
    imm: bool = False,
    start: int = 0,
) -> list[Flow]:
    """``messages`` messages of ``size`` bytes from ``src`` to ``dst``, tag "pair", at most ``depth`` posted
    and not yet complete at the sender; ``imm`` makes them Writes with Immediate (the receiver completes
    each, so its delivery time is known)."""
    if messages < 1 or depth < 1:
        raise ValueError(f"pair: messages ({messages}) and depth ({depth}) must be at least 1")
    flows: list[Flow] = []
    with PausedGc():
        for i in range(messages):
            trig = None if i < depth else flows[i - depth].send_done
            f = sim.add_flow(
                src,
                dst,
                size,
                start if trig is None else None,
                tag="pair",
                imm=imm,
                trigger=trig,
                send_done=Trigger(name=f"message {i} sent") if i + depth < messages else None,
            )
            flows.append(f)
    return flows


def connection_matrix(sim: FabricSim, cm: ConnectionMatrix, *, start: int = 0) -> list[Flow]:
    """Replay an htsim connection matrix: connections start at their time (µs, plus ``start`` ns) or when
    their trigger fires; send-done / receive-done fire triggers; a barrier fires after ``count``
    arrivals. The matrix's host count must equal the fabric's."""
    if cm.nodes != sim.topo.num_hosts:
        raise ValueError(f"connection matrix has {cm.nodes} nodes, the fabric {sim.topo.num_hosts} hosts")
    triggers = {
        t.id: Trigger(
            t.count if t.kind == "barrier" else 1, name=f"trigger {t.id}", multishot=t.kind == "multishot"
        )
        for t in cm.triggers
    }
    flows = []
    with PausedGc():
        for c in cm.connections:
            flows.append(
                sim.add_flow(
                    c.src,
                    c.dst,
                    c.size,
                    None if c.trigger is not None else start + (c.start_us or 0) * 1000,
                    tag="cm",
                    trigger=None if c.trigger is None else triggers[c.trigger],
                    send_done=None if c.send_done_trigger is None else triggers[c.send_done_trigger],
                    recv_done=None if c.recv_done_trigger is None else triggers[c.recv_done_trigger],
                )
            )
    return flows
