"""The results of a split run (`openmrc.sim.parallel`), merged from every rank's share.

Each rank reports what only it knows (`share`): its flows' ends, its ports' figures (a stand-in's drops
count for the port it stands for), its hosts' retransmissions and samples; every rank (or, among forked
ranks, rank 0 alone: the others' would go unread) merges them (`merge`) into the whole run's results
(`Partition.totals`, the flows, the events and the samples), as one process would have them.
"""

from __future__ import annotations

import bisect
import dataclasses
import struct
from pickle import PickleBuffer
from typing import Any, Final, NamedTuple

from openmrc.sim.fabric_sim import FabricSim, Partition, PortTotals
from openmrc.sim.metrics import LinkStat, Sample
from openmrc.sim.network import Unwired
from openmrc.sim.parallel.exchange import _NEVER
from openmrc.transport import WcStatus

_LINK_ROW: Final = 12
"""Ints a link direction takes in a rank's share (`share`): node, port, peer, nominal rate, bytes sent,
drops, losses, trims, marks, pauses, time paused (ns), packets sent."""
_PACK_LINK: Final = struct.Struct(f"={_LINK_ROW}q").pack


class FlowEnd(NamedTuple):
    """How a flow ended on the rank that ran an end of it (`Share.flows`)."""

    finish: int | None
    status: WcStatus | None
    recv_finish: int | None


class Share(NamedTuple):
    """What one rank knows of a run that the others do not (`share`), sent to the merging ranks."""

    flows: dict[int, FlowEnd]
    """By flow id, the flows with an end on this rank."""
    links: PickleBuffer
    """Its ports' figures, a `_LINK_ROW` of int64 per link direction, by (node, port): one byte string
    crosses (out of band: `PipeExchange` sends it from where it is)."""
    drop_at: dict[tuple[int, int], int]
    """(node, port) -> when it last dropped a data packet because it was down."""
    stood_in: dict[tuple[int, int], int]
    """(node, port) of another rank -> drops at its stand-in here."""
    rtx: int
    """Its hosts' retransmissions."""
    events: int
    """Events it ran, less those every rank runs (counted once, by the merging rank)."""
    samples: list[tuple[Any, ...]]
    """Its samples (`Sample` as tuples)."""
    pair_bytes: list[tuple[int, ...]]
    ev_log: list[tuple[int, int, int, int, str]]
    times: dict[str, float]
    """Where its time went (`SimResults.timings`)."""


def share(sim: FabricSim, part: Partition, times: dict[str, float]) -> Share:
    """What this rank knows that the others do not: its flows' ends, its ports' figures (and those of the
    stand-ins of other ranks' ports: their drops), its hosts' retransmissions, its samples; and ``times``
    (the dict itself: what is added to it before it is sent goes too)."""
    owned, rank_of, rank = part.owned, part.rank_of, part.rank
    assert rank_of is not None  # (set by the run)
    flows = {
        f.id: FlowEnd(f.finish, f.status, f.recv_finish) for f in sim.flows if owned[f.src] or owned[f.dst]
    }
    links = bytearray()  # a `_LINK_ROW` a link direction, by (node, port): one byte string crosses
    drop_at: dict[tuple[int, int], int] = {}
    stood_in: dict[tuple[int, int], int] = {}  # (node, port) of another rank -> drops on delivery here
    now = sim.sim.now
    shared = part.shared
    elsewhere = part.elsewhere
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
    for key, p in part.ghosts.items():
        if p.drops:
            stood_in[key] = p.drops
    s = sim.sampler
    return Share(
        flows=flows,
        links=PickleBuffer(links),
        drop_at=drop_at,
        stood_in=stood_in,
        rtx=sum(h.retransmits() for h in sim.hosts if owned[h.id]),
        events=sim.sim.events - sim.sim.setup_events,  # every rank runs those: counted once, by this one
        samples=[] if s is None else [dataclasses.astuple(x) for x in s.samples],
        pair_bytes=[] if s is None else s.pair_bytes,
        ev_log=[] if s is None else s.ev_log,
        times=times,
    )


def merge(sim: FabricSim, part: Partition, parts: list[Share]) -> None:
    """This rank (``parts[0]``) takes every rank's share into the whole run's results (`Partition.totals`,
    ``sim``'s flows, events and samples)."""
    own = parts[0]
    for other in parts[1:]:
        for f in sim.flows:
            got = other.flows.get(f.id)
            if got is None:
                continue
            if got.finish is not None:
                f.finish, f.status = got.finish, got.status
            if got.recv_finish is not None:
                f.recv_finish = got.recv_finish
        sim.sim.events += other.events
    sim.completed = sum(f.finish is not None for f in sim.flows)
    stood_in: dict[int, int] = {}  # node << 16 | port -> drops at stand-ins of that port
    drop_at: dict[tuple[int, int], int] = {}
    for other in parts:
        for (n, i), extra in other.stood_in.items():
            key = n << 16 | i
            stood_in[key] = stood_in.get(key, 0) + extra
        drop_at |= other.drop_at
    now = sim.sim.now
    link = sim.link_stat
    links: list[LinkStat] = []
    drops, losses, trims, marks, hops = 0, 0, 0, 0, 0
    cols: list[list[int]] = [memoryview(other.links).cast("q").tolist() for other in parts]
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
    counts["retransmits"] = sum(p.rtx for p in parts)
    part.totals = PortTotals(links, counts, drop_at)
    s = sim.sampler
    if s is None:
        return
    s.samples = _merge_samples([p.samples for p in parts])
    s.pair_bytes = [
        tuple(map(sum, zip(*per_rank, strict=True)))
        for per_rank in zip(*(p.pair_bytes for p in parts), strict=True)
    ]
    s.ev_log = _merge_ev_log([p.ev_log for p in parts], [x[0] for x in own.samples], s.ev_log_limit)


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
