"""Which rank runs which node of a split run (`openmrc.sim.parallel`), and the lookahead the split allows.

Hosts go in contiguous blocks of whole T0 groups, a switch with the rank of its lower neighbours when
they agree, the rest (the spines) shared out in turn (`assign_ranks`); a fabric's top tier runs on every
rank, port by port (`openmrc.sim.fabric_sim.shared_switches`). `assign` gives a rank's `Partition`: what
a fabric built in parts is built with, and what its run reads the assignment back from (not worked out
twice).
"""

from __future__ import annotations

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.topology import Topology
from openmrc.sim.fabric_sim import FabricSim, Partition, shared_switches
from openmrc.sim.parallel.exchange import _NEVER


class PartitionError(ValueError):
    """A simulation that cannot be split as asked (one line, for the CLI)."""


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


def assign(topo: Topology, part: tuple[int, int] | None) -> Partition | None:
    """The share of rank ``part[0]`` of ``part[1]`` (`FabricSim`'s ``part``: what to build and run, and
    every node's rank); None for no part."""
    if part is None:
        return None
    rank, size = part
    rank_of = assign_ranks(topo, size)
    return Partition(owned_of(topo, rank_of, rank), rank=rank, size=size, rank_of=rank_of)


def owned_nodes(topo: Topology, part: tuple[int, int] | None) -> list[bool] | None:
    """Which nodes rank ``part[0]`` of ``part[1]`` runs (`FabricSim`'s ``owned``; `assign` gives them with
    the ranks they came of); None for no part."""
    got = assign(topo, part)
    return None if got is None else got.owned


def owned_of(topo: Topology, rank_of: list[int], rank: int) -> list[bool]:
    """The nodes rank ``rank`` runs: its own and the shared switches (`shared_switches`: each of their
    ports runs with its peer)."""
    shared = shared_switches(topo)
    if shared is None:
        return [r == rank for r in rank_of]
    return [r == rank or s for r, s in zip(rank_of, shared, strict=True)]


def ranks_of(sim: FabricSim, size: int) -> list[int]:
    """`assign_ranks` of ``sim``'s fabric, not worked out again when it was built with a `Partition` that
    holds them."""
    part = sim.part
    if part is not None and part.built and part.rank_of is not None and part.size == size:
        return part.rank_of
    return assign_ranks(sim, size)


def lookahead_ns(fabric: FabricSim | Topology) -> int:
    """The lookahead: the shortest link latency anywhere (not only across ranks, so that the windows, the
    lookahead over ``LAG + 1`` each, and with them where a run ends, are the same for every split)."""
    return usable(shortest_link(fabric.topo if isinstance(fabric, FabricSim) else fabric, None))


def shortest_link(topo: Topology, owned: list[bool] | None) -> int:
    """The shortest latency of the links of the ``owned`` nodes (None: of every node; a `MultiPlaneClos`:
    of its two kinds of link, whatever a rank owns, from its shape)."""
    if isinstance(topo, MultiPlaneClos):
        return min(topo.host_link_latency_ns, topo.link_latency_ns if topo.uplinks else _NEVER)
    nodes = range(topo.num_nodes())
    return min(
        (r.latency_ns for n in nodes if owned is None or owned[n] for r in topo.ports(n)), default=_NEVER
    )


def usable(lat: int) -> int:
    """``lat`` as a lookahead (PartitionError: a link with no latency leaves none)."""
    if lat < 1:
        raise PartitionError("a split run needs every link to have a latency of at least 1 ns")
    return lat
