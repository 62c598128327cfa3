"""Multi-plane two-tier Clos fabrics (MRC-SPEC-NOTES §6), computed arithmetically.

Every host has one NIC port per plane; every plane is an independent two-tier T0/T1 Clos. A T0 switch of
radix R with oversubscription o has ``R·o/(o+1)`` host ports and ``R/(o+1)`` uplinks; uplink j of every T0
of a plane goes to T1 j of that plane, so a plane has as many T1s as a T0 has uplinks, and a T1 has one
port per T0 of its plane. The production shape (8 planes of 512×100G switches) is

    256 hosts per T0 · 512 T0 per plane = 131,072 hosts;  256 T1 per plane;  8 · 768 = 6,144 switches.

Nothing is stored per node or per link: ids, ports and links are computed on demand, so the 131,072-host
model is built in microseconds and enumerating its 2.1 M links is a generator.

Numbering: hosts ``0..H-1``; then plane by plane, that plane's T0s, then its T1s. Ports: a host's port p
is plane p; a T0's ports ``0..hosts_per_t0-1`` face hosts, ``hosts_per_t0 + j`` faces T1 j; a T1's port i
faces T0 i.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from openmrc.fabric.topology import Link, PortRef, Role, Topology

__all__ = ["MultiPlaneClos", "SinglePlaneEquivalent", "single_plane_equivalent"]


class MultiPlaneClos(Topology):
    """``planes`` independent two-tier Clos planes joined only at the hosts' multi-port NICs."""

    def __init__(
        self,
        planes: int,
        hosts: int,
        t0_radix: int,
        t1_radix: int,
        link_bps: int = 100_000_000_000,
        link_latency_ns: int = 500,
        oversubscription: int = 1,
        *,
        host_link_latency_ns: int | None = None,
    ) -> None:
        for field, value in (
            ("planes", planes),
            ("hosts", hosts),
            ("t0_radix", t0_radix),
            ("t1_radix", t1_radix),
            ("link_bps", link_bps),
            ("oversubscription", oversubscription),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"MultiPlaneClos.{field}: must be a positive integer, got {value!r}")
        if link_latency_ns < 0:
            raise ValueError(f"MultiPlaneClos.link_latency_ns: must be >= 0, got {link_latency_ns}")
        if t0_radix % (oversubscription + 1):
            raise ValueError(
                f"MultiPlaneClos.t0_radix: {t0_radix} ports do not split {oversubscription}:1 down/up"
            )
        self.name = f"mpclos-{planes}p-{hosts}h"
        self.planes = planes
        self.num_hosts = hosts
        self.t0_radix = t0_radix
        self.t1_radix = t1_radix
        self.link_bps = link_bps
        self.link_latency_ns = link_latency_ns
        self.host_link_latency_ns = link_latency_ns if host_link_latency_ns is None else host_link_latency_ns
        self.oversubscription = oversubscription
        self.uplinks = t0_radix // (oversubscription + 1)
        self.hosts_per_t0 = t0_radix - self.uplinks
        self.t0_per_plane = -(-hosts // self.hosts_per_t0)
        self.t1_per_plane = self.uplinks
        if self.t0_per_plane > t1_radix:
            raise ValueError(
                f"MultiPlaneClos.hosts: {hosts} hosts need {self.t0_per_plane} T0s per plane, more than a "
                f"T1 of radix {t1_radix} reaches in two tiers (at most {t1_radix * self.hosts_per_t0} hosts)"
            )
        self._per_plane = self.t0_per_plane + self.t1_per_plane

    # -- ids -------------------------------------------------------------------------------------------------
    def t0(self, plane: int, index: int) -> int:
        return self.num_hosts + plane * self._per_plane + index

    def t1(self, plane: int, index: int) -> int:
        return self.num_hosts + plane * self._per_plane + self.t0_per_plane + index

    def host_t0_index(self, host: int) -> int:
        return host // self.hosts_per_t0

    def host_t0(self, host: int, plane: int) -> int:
        return self.t0(plane, host // self.hosts_per_t0)

    def switch_info(self, node: int) -> tuple[Role, int, int]:
        """(role, plane, index within its tier and plane) of a switch."""
        if node < self.num_hosts or node >= self.num_nodes():
            raise ValueError(f"node {node} is not a switch of {self.name}")
        plane, rest = divmod(node - self.num_hosts, self._per_plane)
        if rest < self.t0_per_plane:
            return Role.T0, plane, rest
        return Role.T1, plane, rest - self.t0_per_plane

    # -- Topology --------------------------------------------------------------------------------------------
    def num_nodes(self) -> int:
        return self.num_hosts + self.planes * self._per_plane

    def num_switches(self) -> int:
        return self.planes * self._per_plane

    def role(self, node: int) -> Role:
        return Role.HOST if node < self.num_hosts else self.switch_info(node)[0]

    def plane(self, node: int) -> int:
        return -1 if node < self.num_hosts else self.switch_info(node)[1]

    def node_name(self, node: int) -> str:
        if node < self.num_hosts:
            return f"host{node}"
        role, plane, index = self.switch_info(node)
        return f"p{plane}-{role.name.lower()}-{index}"

    def num_links(self) -> int:
        return self.planes * (self.num_hosts + self.t0_per_plane * self.uplinks)

    def links(self) -> Iterator[Link]:
        bps, lat, hlat = self.link_bps, self.link_latency_ns, self.host_link_latency_ns
        hpt = self.hosts_per_t0
        for p in range(self.planes):
            for h in range(self.num_hosts):
                yield Link(h, p, self.t0(p, h // hpt), h % hpt, bps, hlat)
            for i in range(self.t0_per_plane):
                t0 = self.t0(p, i)
                for j in range(self.uplinks):
                    yield Link(t0, hpt + j, self.t1(p, j), i, bps, lat)

    def ports(self, node: int) -> list[PortRef]:
        bps, lat, hlat = self.link_bps, self.link_latency_ns, self.host_link_latency_ns
        hpt = self.hosts_per_t0
        if node < self.num_hosts:
            return [PortRef(p, self.host_t0(node, p), node % hpt, bps, hlat) for p in range(self.planes)]
        role, plane, index = self.switch_info(node)
        if role is Role.T0:
            first = index * hpt
            down = [PortRef(k, first + k, plane, bps, hlat) for k in range(min(hpt, self.num_hosts - first))]
            up = [PortRef(hpt + j, self.t1(plane, j), index, bps, lat) for j in range(self.uplinks)]
            return down + up
        return [PortRef(i, self.t0(plane, i), hpt + index, bps, lat) for i in range(self.t0_per_plane)]

    def counts(self) -> dict[str, int]:
        return {
            Role.HOST.name: self.num_hosts,
            Role.T0.name: self.planes * self.t0_per_plane,
            Role.T1.name: self.planes * self.t1_per_plane,
            Role.T2.name: 0,
        }

    # -- paths -----------------------------------------------------------------------------------------------
    def path(self, src: int, dst: int, plane: int, uplink: int) -> list[int]:
        """Nodes from ``src`` to ``dst`` through ``plane`` and T1 ``uplink`` (ignored under one T0)."""
        a, b = self.host_t0(src, plane), self.host_t0(dst, plane)
        if a == b:
            return [src, a, dst]
        return [src, a, self.t1(plane, uplink), b, dst]

    def hops(self, src: int, dst: int) -> int:
        """Switches a packet crosses (1 under the same T0, else 3)."""
        return 1 if src // self.hosts_per_t0 == dst // self.hosts_per_t0 else 3

    def paths_between(self, src: int, dst: int) -> int:
        """Distinct paths (planes × uplinks) between two hosts under different T0s."""
        return self.planes * (1 if self.hops(src, dst) == 1 else self.uplinks)


@dataclass(frozen=True, slots=True)
class SinglePlaneEquivalent:
    """A single-plane folded-Clos (fat-tree) design for the same hosts, built from the same switch ASIC."""

    hosts: int
    radix: int
    port_bps: int
    tiers: int
    switches: int
    switch_links: int

    @property
    def transceivers(self) -> int:
        """Optical modules on switch-to-switch links (two per link)."""
        return 2 * self.switch_links


def single_plane_equivalent(hosts: int, switch_bps: int, host_bps: int) -> SinglePlaneEquivalent:
    """Each host gets one ``host_bps`` port; the ASIC of ``switch_bps`` is split into ``host_bps`` ports.

    A t-tier fat tree of radix k holds ``2·(k/2)^t`` hosts with ``(2t−1)·N/k`` switches and ``(t−1)·N``
    switch-to-switch links for N hosts (non-blocking).
    """
    k = switch_bps // host_bps
    if k < 2:
        raise ValueError(
            f"a {switch_bps / 1e9:g} Gb/s switch has fewer than two {host_bps / 1e9:g} Gb/s host ports"
        )
    half = k // 2
    if half < 2 and hosts > 2 * half:  # every tier adds one switch per host pair and no more hosts
        raise ValueError(
            f"a switch of {k} {host_bps / 1e9:g} Gb/s ports builds no fat tree of {hosts} hosts "
            "(a tree of radix k holds 2·(k/2)^tiers hosts: it needs k ≥ 4)"
        )
    tiers = 1
    while 2 * half**tiers < hosts:
        tiers += 1
    switches = (tiers - 1) * -(-hosts // half) + -(-hosts // k)
    return SinglePlaneEquivalent(hosts, k, host_bps, tiers, switches, (tiers - 1) * hosts)
