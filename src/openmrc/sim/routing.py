"""How simulated switches pick an output port: SRv6 uSID source routes or per-switch ECMP.

* `SrRouting`: the packet's destination address (from the sender's EV) is shifted and looked up in the
  switch's static table (`openmrc.fabric.srv6.UsidPlan.forward`). The sender chose the whole path.
* `EcmpRouting`: shortest-path next hops toward the packet's destination host, and among several the one a
  salted hash of (src, dst, UDP source port, flow label) selects (`openmrc.fabric.ecmp.EcmpHash`) — what
  RoCEv2 and EV-as-source-port spraying see in a classic fabric. Next hops come arithmetically for a
  `MultiPlaneClos` and from one breadth-first search per destination host otherwise.

ECMP routing reconverges: `EcmpRouting.withdraw` takes the set of dead links (as (switch, port) pairs,
either direction) and from then on switches hash only over next hops that still reach the destination, as
the fabric's routing protocol would after its convergence delay (the simulator calls it that long after a
failure). Static SRv6 tables never change; MRC senders route around dead paths themselves.
`crossing_pairs` names the host pairs whose shortest paths cross given links (the flows a failure can touch);
`EcmpRouting.path` the links one hashed packet takes (the RoCEv2 QPs a failure does touch).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final, cast

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.ecmp import EcmpHash, flow_crc, fmix32
from openmrc.fabric.srv6 import UsidPlan
from openmrc.fabric.topology import Role, Topology

if TYPE_CHECKING:
    from openmrc.transport import Transmit

__all__ = ["EcmpRouting", "Routing", "SrRouting", "crossing_pairs"]


class Routing:
    """Base: ``port(switch, packet)`` returns the egress port or raises ValueError (mis-routed)."""

    def port(self, switch: int, p: Transmit) -> int:  # pragma: no cover - interface
        raise NotImplementedError


_CARRIER_TAIL: Final = (1 << 80) - 1
"""The bits of a uSID carrier after its active uSID (all zero: the active uSID is the last)."""


_AT_BITS: Final = 5
_AT_MASK: Final = (1 << _AT_BITS) - 1
_THREE_USIDS: Final = (1 << 48) - 1
_COMPACT: Final = 1 << 60
"""A packet routed by its EV keeps ``-(_COMPACT | usids << 5 | at)`` as its route once a switch has read
it: the EV's uSIDs from the active one on (three at most: past its first switch, a two-tier Clos path
names a T1, a T0 and a host) and the active one's byte offset in the EV (what `Transmit.addr` reads), so
that the switches after the first route it without reaching for its EV (a cache miss a hop at scale)."""


def _compact(ev: bytes, at: int) -> int:
    """The compact route of an EV whose active uSID is at byte ``at``, or ``at`` when its uSIDs from
    there on are more than three (each switch then reads them from the EV)."""
    for b in range(at + 6, 16):
        if ev[b]:
            return at
    usids = 0
    for i in range(3):
        b = at + 2 * i
        if b < 16:
            usids |= (ev[b] << 8 | ev[b + 1]) << 16 * i
    return _COMPACT | usids << _AT_BITS | at


class SrRouting(Routing):
    """SRv6 source routes; packets without a uSID address (endpoint requests such as port status updates,
    which a NIC sends to a peer, not along an EV) are routed by ECMP toward their destination host."""

    def __init__(self, plan: UsidPlan) -> None:
        self.plan = plan
        self._forward = plan.forward
        self._locator = plan.locator
        self._ecmp = EcmpRouting(plan.topo)

    def port(self, switch: int, p: Transmit) -> int:
        r = p._route
        if r < 0:  # the EV's address (`Transmit.route_by_ev`), its active uSID at byte -r & 31
            k = -r
            plan = self.plan
            own = plan.own_usid(switch)
            if k < _COMPACT:  # read from the EV (at the first switch), then kept in the packet if it fits
                ev = p.ev
                if ev[0] << 24 | ev[1] << 16 | ev[2] << 8 | ev[3] != self._locator:
                    return self._ecmp.port(switch, p)
                at = k
                active = ev[at] << 8 | ev[at + 1] if at < 16 else 0
                if active == own:  # NEXT-CSID shift
                    at += 2
                    active = ev[at] << 8 | ev[at + 1] if at < 16 else 0
                p._route = -_compact(ev, at)
                return plan.route(switch, own, active)
            usids = k >> _AT_BITS & _THREE_USIDS
            active = usids & 0xFFFF
            if active == own:  # NEXT-CSID shift
                usids >>= 16
                active = usids & 0xFFFF
                p._route = -(_COMPACT | usids << _AT_BITS | ((k & _AT_MASK) + 2))
            return plan.route(switch, own, active)
        addr = p.addr
        if addr >> 96 != self._locator:
            return self._ecmp.port(switch, p)
        if p.seg and not addr & _CARRIER_TAIL and (addr >> 80) & 0xFFFF == self.plan.switch_usid(switch):
            # the carrier's last uSID is this switch's: End takes the SRH's segment as the destination
            addr, p.seg = p.seg, 0
        port, p.addr = self._forward(switch, addr)
        return port


class EcmpRouting(Routing):
    def __init__(self, topo: Topology, seed: int = 0, only: list[bool] | None = None) -> None:
        """``only``: the switches that route here (a part of a split run; None: all of them)."""
        self.topo = topo
        self._only = only
        self.hash = EcmpHash(seed)
        self._clos = topo if isinstance(topo, MultiPlaneClos) else None
        self._next: list[list[tuple[int, ...]]] = []
        """Fat trees and other non-Clos fabrics: ``_next[switch][dst]``, the next hops toward host ``dst``."""
        self.dead: frozenset[tuple[int, int]] = frozenset()
        self._salts = [-1] * topo.num_nodes()
        """Each switch's ECMP salt, filled in when first needed."""
        self._clos_cache: dict[tuple[int, int], tuple[int, ...]] = {}
        self._up: tuple[int, ...] = ()
        """A Clos T0's uplinks (its ports from ``hosts_per_t0`` on)."""
        if self._clos is not None:
            self._up = tuple(range(self._clos.hosts_per_t0, self._clos.hosts_per_t0 + self._clos.uplinks))
        else:
            self._build_tables(topo)

    def withdraw(self, dead: set[tuple[int, int]] | frozenset[tuple[int, int]]) -> None:
        """Route around ``dead`` (node, port) pairs from now on (the routing protocol has converged)."""
        self.dead = frozenset(dead)
        self._clos_cache.clear()
        if self._clos is None:
            self._build_tables(self.topo)

    def _build_tables(self, topo: Topology) -> None:
        """One breadth-first search per group of hosts with the same neighbours (all of a fat tree's hosts
        under one edge switch; each host alone once a link is dead): members' shortest paths differ only
        in the last hop, so a member's table is the group's but at the switches next to it."""
        n = topo.num_nodes()
        dead = self.dead
        ports = [topo.ports(v) for v in range(n)]
        nh = topo.num_hosts
        only = self._only
        switches = [v for v in range(nh, n) if only is None or only[v]]
        self._next = [[] if v < nh or (only is not None and not only[v]) else [()] * nh for v in range(n)]
        same: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per distinct next-hop set
        groups: dict[tuple[int, ...], list[int]] = {}
        for h in range(nh):
            key = tuple(sorted({r.peer for r in ports[h]})) if not dead else (~h,)
            groups.setdefault(key, []).append(h)
        for members in groups.values():
            dst = members[0]
            dist = [-1] * n
            dist[dst] = 0
            q = deque([dst])
            while q:
                v = q.popleft()
                if v != dst and v < nh:
                    continue  # hosts do not forward
                for r in ports[v]:
                    if dist[r.peer] < 0 and (r.peer, r.peer_port) not in dead:
                        dist[r.peer] = dist[v] + 1
                        q.append(r.peer)
            for v in switches:
                d = dist[v]
                if d > 0:
                    table = self._next[v]
                    if d == 1:  # next to the group: each member's own links (no link is dead)
                        for h in members[1:]:
                            hops = tuple(r.port for r in ports[v] if r.peer == h)
                            if hops:
                                table[h] = same.setdefault(hops, hops)
                    hops = tuple(
                        r.port for r in ports[v] if dist[r.peer] == d - 1 and (v, r.port) not in dead
                    )
                    if hops:
                        table[dst] = hops = same.setdefault(hops, hops)
                        if d > 1:
                            for h in members[1:]:
                                table[h] = hops

    def candidates(self, switch: int, dst: int) -> tuple[int, ...]:
        c = self._clos
        if c is None:
            hops = self._next[switch]
            return hops[dst] if 0 <= dst < len(hops) else ()
        role, plane, index = c.switch_info(switch)
        if role is Role.T0:
            if dst // c.hosts_per_t0 == index:
                return (dst % c.hosts_per_t0,)
            if self.dead:
                return self._clos_up(switch, plane, dst // c.hosts_per_t0)
            return self._up
        return (dst // c.hosts_per_t0,)

    def _clos_up(self, switch: int, plane: int, dst_t0: int) -> tuple[int, ...]:
        """A T0's uplinks that are alive and whose T1 still has a live link down to ``dst_t0``."""
        key = (switch, dst_t0)
        hops = self._clos_cache.get(key)
        if hops is None:
            c = self._clos
            assert c is not None
            dead, hpt = self.dead, c.hosts_per_t0
            hops = self._clos_cache[key] = tuple(
                hpt + u
                for u in range(c.uplinks)
                if (switch, hpt + u) not in dead and (c.t1(plane, u), dst_t0) not in dead
            )
        return hops

    def path(self, src: int, port: int, dst: int, entropy: int) -> list[tuple[int, int]]:
        """The links, as (node, egress port), that a packet from host ``src``'s NIC port ``port`` (0-based)
        to host ``dst`` with ``entropy`` (UDP source port, flow label above it) takes now: the choices
        `port` makes for it at each switch."""
        topo = self.topo
        crc = flow_crc(src, dst, entropy & 0xFFFF, 4791, entropy >> 16)
        hops = [(src, port)]
        node = _peer(topo, src, port)
        while node >= topo.num_hosts:
            cands = self.candidates(node, dst)
            if not cands:
                raise ValueError(f"no route from node {node} to host {dst}")
            out = cands[0] if len(cands) == 1 else self._pick(node, cands, crc)
            hops.append((node, out))
            node = _peer(topo, node, out)
        return hops

    def crosses(self, ways: list[tuple[int, int, int, int]], links: set[tuple[int, int]]) -> bool:
        """Whether packets sent any of these ways, (from host, NIC port, to host, entropy) as `path` takes
        them, go through one of ``links`` (as (node, egress port)) now."""
        for src, port, dst, entropy in ways:
            for hop in self.path(src, port, dst, entropy):
                if hop in links:
                    return True
        return False

    def port(self, switch: int, p: Transmit) -> int:
        dst = cast(int, p.peer)  # a simulated packet's destination host
        hops = self.candidates(switch, dst)
        if not hops:
            raise ValueError(f"no route from node {switch} to host {dst}")
        if len(hops) == 1:
            return hops[0]
        # EcmpHash.hash32(switch, src, dst, sport, 4791, flow label), with the flow's CRC computed once per
        # packet (the entropy is the UDP source port in its low 16 bits and the flow label above them)
        crc = p.flow_crc
        if crc < 0:
            e = p.entropy
            crc = p.flow_crc = flow_crc(p.src, dst, e & 0xFFFF, 4791, e >> 16)
        return self._pick(switch, hops, crc)

    def _pick(self, switch: int, hops: tuple[int, ...], crc: int) -> int:
        """The next hop of ``hops`` that ``switch`` hashes a packet of flow CRC ``crc`` to."""
        salt = self._salts[switch]
        if salt < 0:
            salt = self._salts[switch] = self.hash.salt(switch)
        return hops[fmix32(crc ^ salt) % len(hops)]


def _peer(topo: Topology, node: int, port: int) -> int:
    for ref in topo.ports(node):  # (port numbers may skip)
        if ref.port == port:
            return ref.peer
    raise ValueError(f"node {node} has no port {port}")


def crossing_pairs(
    topo: Topology, links: set[tuple[int, int]], pairs: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The (src, dst) host pairs of ``pairs`` that have a shortest path (on any plane) through one of
    ``links``, given as (node, egress port): the connections a failure of those links can touch, whether
    they spray over every path (MRC) or hash onto one (ECMP)."""
    ecmp = EcmpRouting(topo)
    hosts = topo.num_hosts
    peer_of: dict[int, dict[int, int]] = {}  # node -> port number -> the node it leads to (numbers may skip)
    out = []
    for src, dst in pairs:
        seen: set[int] = set()
        todo: list[tuple[int, int]] = [(src, i) for i in range(len(topo.ports(src)))]
        while todo:
            node, port = todo.pop()
            if (node, port) in links:
                out.append((src, dst))
                break
            peers = peer_of.get(node)
            if peers is None:  # a computed topology makes its port list afresh at each call
                peers = peer_of[node] = {r.port: r.peer for r in topo.ports(node)}
            nxt = peers[port]
            if nxt < hosts or nxt in seen:
                continue
            seen.add(nxt)
            todo.extend((nxt, p) for p in ecmp.candidates(nxt, dst))
    return out
