"""The fabric data model: nodes (hosts and switches), their ports, and links with speed and latency.

Nodes are integers: hosts first (``0 .. num_hosts-1``), then switches. A host has one port per plane; a
switch belongs to one plane (single-plane fabrics have plane 0). Ports are numbered per node from 0.
`MaterializedTopology` stores every node and link explicitly (fine up to a few hundred thousand links);
very large fabrics (`openmrc.fabric.clos.MultiPlaneClos`) compute them arithmetically behind the same
interface, so a 131,072-host, 8-plane model costs almost no memory until links are enumerated.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

__all__ = ["Link", "MaterializedTopology", "PortRef", "Role", "Topology"]


class Role(IntEnum):
    """What a node is. T0 = leaf / ToR, T1 = spine / aggregation, T2 = core."""

    HOST = 0
    T0 = 1
    T1 = 2
    T2 = 3


@dataclass(frozen=True, slots=True)
class Link:
    """A full-duplex link between port ``a_port`` of node ``a`` and port ``b_port`` of node ``b``."""

    a: int
    a_port: int
    b: int
    b_port: int
    bps: int
    latency_ns: int


@dataclass(frozen=True, slots=True)
class PortRef:
    """One port as seen from its node: where it leads and how fast."""

    port: int
    peer: int
    peer_port: int
    bps: int
    latency_ns: int


class Topology(abc.ABC):
    """Interface every fabric offers (no simulator inside)."""

    name: str
    planes: int
    num_hosts: int

    @abc.abstractmethod
    def num_nodes(self) -> int: ...

    @abc.abstractmethod
    def role(self, node: int) -> Role: ...

    @abc.abstractmethod
    def plane(self, node: int) -> int:
        """The plane a switch belongs to (hosts span every plane: -1)."""

    @abc.abstractmethod
    def node_name(self, node: int) -> str: ...

    @abc.abstractmethod
    def links(self) -> Iterator[Link]: ...

    @abc.abstractmethod
    def num_links(self) -> int: ...

    @abc.abstractmethod
    def ports(self, node: int) -> list[PortRef]: ...

    def counts(self) -> dict[str, int]:
        """Node count per role (by name), computed without enumerating links."""
        out: dict[str, int] = {r.name: 0 for r in Role}
        for n in range(self.num_nodes()):
            out[self.role(n).name] += 1
        return out

    def to_networkx(self, max_links: int = 2_000_000) -> Any:
        """A ``networkx.MultiGraph`` with node attributes role/plane/name and link attributes
        a_port/b_port/bps/latency_ns. Refuses fabrics with more than ``max_links`` links."""
        import networkx as nx

        if self.num_links() > max_links:
            raise ValueError(f"{self.name}: {self.num_links()} links exceed max_links={max_links}")
        g = nx.MultiGraph(name=self.name)
        for n in range(self.num_nodes()):
            g.add_node(n, role=self.role(n).name, plane=self.plane(n), name=self.node_name(n))
        for lk in self.links():
            g.add_edge(lk.a, lk.b, a_port=lk.a_port, b_port=lk.b_port, bps=lk.bps, latency_ns=lk.latency_ns)
        return g


class MaterializedTopology(Topology):
    """A topology stored node by node and link by link."""

    def __init__(self, name: str, planes: int, num_hosts: int) -> None:
        self.name = name
        self.planes = planes
        self.num_hosts = num_hosts
        self._roles: list[Role] = [Role.HOST] * num_hosts
        self._planes: list[int] = [-1] * num_hosts
        self._names: list[str] = [f"host{h}" for h in range(num_hosts)]
        self._links: list[Link] = []
        self._ports: list[list[PortRef]] = [[] for _ in range(num_hosts)]

    def add_switch(self, role: Role, plane: int, name: str) -> int:
        self._roles.append(role)
        self._planes.append(plane)
        self._names.append(name)
        self._ports.append([])
        return len(self._roles) - 1

    def connect(self, a: int, b: int, bps: int, latency_ns: int) -> Link:
        """Join the next free port of ``a`` to the next free port of ``b``."""
        pa, pb = len(self._ports[a]), len(self._ports[b])
        link = Link(a, pa, b, pb, bps, latency_ns)
        self._links.append(link)
        self._ports[a].append(PortRef(pa, b, pb, bps, latency_ns))
        self._ports[b].append(PortRef(pb, a, pa, bps, latency_ns))
        return link

    def num_nodes(self) -> int:
        return len(self._roles)

    def role(self, node: int) -> Role:
        return self._roles[node]

    def plane(self, node: int) -> int:
        return self._planes[node]

    def node_name(self, node: int) -> str:
        return self._names[node]

    def links(self) -> Iterator[Link]:
        return iter(self._links)

    def num_links(self) -> int:
        return len(self._links)

    def ports(self, node: int) -> list[PortRef]:
        return self._ports[node]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {r.name: 0 for r in Role}
        for r in self._roles:
            out[r.name] += 1
        return out
