"""The Linux export of a fabric, checked by running its scripts through a model of the kernel's IPv6
forwarding (longest-prefix match, seg6local End with NEXT-CSID, local addresses). The namespace testbed
(tests/test_testbed.py) runs the same scripts on the real kernel."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openmrc.fabric import MultiPlaneClos, UsidPlan
from openmrc.fabric.linux import LinuxFabric, load_export
from openmrc.wire import usid_final_address

_ROUTE = re.compile(r"^ip -6 route add (\S+) (.*)$")


class Node:
    """What a node's script installs: addresses, routes and the End routes."""

    def __init__(self, script: str) -> None:
        self.addrs: set[ipaddress.IPv6Address] = set()
        self.routes: list[tuple[ipaddress.IPv6Network, str, list[tuple[str, str]]]] = []
        self.ll: dict[str, str] = {}
        self.mtu: dict[str, int] = {}
        for line in script.splitlines():
            if line.startswith("ip -6 addr add "):
                addr, _, dev = line.split()[4:7]
                ip = ipaddress.ip_interface(addr)
                if ip.ip.is_link_local:
                    self.ll[dev] = str(ip.ip)
                else:
                    assert ip.network.prefixlen == 128, line
                    self.addrs.add(ip.ip)  # type: ignore[arg-type]
            elif line.startswith("ip link set eth"):
                parts = line.split()
                self.mtu[parts[3]] = int(parts[5])
            elif m := _ROUTE.match(line):
                net = ipaddress.IPv6Network(m.group(1))
                rest = m.group(2)
                if "seg6local" in rest:
                    assert "action End flavors next-csid lblen 32 nflen 16" in rest
                    assert not rest.endswith("dev lo"), "End on lo is a reject route"
                    self.routes.append((net, "end", []))
                else:
                    hops = re.findall(r"via (\S+) dev (\S+)", rest)
                    assert hops, f"a route without a next hop: {line}"
                    self.routes.append((net, "fwd", hops))

    def lookup(self, dst: ipaddress.IPv6Address) -> tuple[str, list[tuple[str, str]]]:
        best = max((r for r in self.routes if dst in r[0]), key=lambda r: r[0].prefixlen, default=None)
        if best is None:
            raise AssertionError(f"no route to {dst}")
        return best[1], best[2]


def _fabric(tmp: Path, fab: LinuxFabric) -> tuple[dict[str, Node], dict[tuple[str, str], tuple[str, str]]]:
    fab.write(tmp)
    nodes = {p.stem: Node(p.read_text()) for p in (tmp / "linux").iterdir()}
    wires = {}
    for ln in json.loads((tmp / "links.json").read_text()):
        wires[(ln["a"], ln["a_dev"])] = (ln["b"], ln["b_dev"])
        wires[(ln["b"], ln["b_dev"])] = (ln["a"], ln["a_dev"])
    return nodes, wires


def _deliver(
    nodes: dict[str, Node],
    wires: dict[tuple[str, str], tuple[str, str]],
    src: str,
    dst: ipaddress.IPv6Address,
    flow: int = 0,
) -> tuple[str, list[str], ipaddress.IPv6Address]:
    """Where a packet from host ``src`` to ``dst`` ends: (node, switches passed, final address)."""
    at, path = src, []
    for _ in range(16):
        node = nodes[at]
        if dst in node.addrs:
            return at, path, dst
        kind, hops = node.lookup(dst)
        if kind == "end":
            a = int(dst)
            carrier = a & ((1 << 96) - 1)
            dst = ipaddress.IPv6Address((a >> 96 << 96) | ((carrier << 16) & ((1 << 96) - 1)))
            continue
        via, dev = hops[flow % len(hops)]
        peer, peer_dev = wires[(at, dev)]
        assert nodes[peer].ll[peer_dev] == via, f"{at} {dev}: next hop {via} is not {peer}'s address"
        at = peer
        path.append(at)
    raise AssertionError(f"a loop towards {dst}")


SHAPES = [(2, 8, 8, 4), (2, 4, 4, 2), (3, 10, 4, 5), (1, 6, 6, 2)]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_srv6_path_the_plan_names_reaches_its_host_port(tmp_path: Path, shape: tuple[int, ...]) -> None:
    planes, hosts, t0r, t1r = shape
    topo = MultiPlaneClos(planes, hosts, t0r, t1r)
    plan = UsidPlan(topo)
    fab = LinuxFabric(plan)
    nodes, wires = _fabric(tmp_path, fab)
    assert len(nodes) == topo.num_nodes()  # every switch and every host, not a sample
    for s in range(hosts):
        for d in range(hosts):
            if s == d:
                continue
            for p in range(planes):
                for u in range(topo.uplinks if topo.hops(s, d) == 3 else 1):
                    addr = plan.path_address(s, d, p, u)
                    end, path, final = _deliver(nodes, wires, f"host{s}", addr)
                    assert end == f"host{d}"
                    want = [topo.node_name(n) for n in topo.path(s, d, p, u)[1:]]
                    assert path == want
                    assert str(final) == fab.usid_address(d, p) == usid_final_address(addr)


@pytest.mark.parametrize("shape", SHAPES)
def test_host_addresses_route_both_ways_over_every_spine(tmp_path: Path, shape: tuple[int, ...]) -> None:
    planes, hosts, t0r, t1r = shape
    topo = MultiPlaneClos(planes, hosts, t0r, t1r)
    fab = LinuxFabric(UsidPlan(topo), srv6=False)
    nodes, wires = _fabric(tmp_path, fab)
    assert not any(r[1] == "end" for n in nodes.values() for r in n.routes)
    for s in range(hosts):
        for d in range(hosts):
            for p in range(planes):
                if s == d:
                    continue
                spines = set()
                for flow in range(topo.uplinks):  # the flow label picks the uplink (ECMP)
                    end, path, _ = _deliver(
                        nodes, wires, f"host{s}", ipaddress.IPv6Address(fab.host_address(d, p)), flow
                    )
                    assert end == f"host{d}"
                    assert all(n.startswith(f"p{p}-") for n in path[:-1])
                    spines |= {n for n in path if "-t1-" in n}
                if topo.hops(s, d) == 3:
                    assert len(spines) == topo.uplinks


def test_addresses_are_unique_where_they_must_be(tmp_path: Path) -> None:
    topo = MultiPlaneClos(2, 8, 4, 8)
    fab = LinuxFabric(UsidPlan(topo))
    hosts = fab.hosts()
    plain = [p["address"] for h in hosts for p in h["ports"]]
    assert len(set(plain)) == len(plain)
    for p in range(2):  # uSID addresses: unique under one T0, repeated under the next
        by_t0: dict[str, list[str]] = {}
        for h in hosts:
            port = h["ports"][p]
            by_t0.setdefault(port["t0"], []).append(port["usid_address"])
        assert all(len(set(v)) == len(v) for v in by_t0.values())
    assert len(fab.links()) == topo.num_links()
    fab.write(tmp_path)
    back = load_export(tmp_path)
    assert back.params() == fab.params()
    assert back.host_address(5, 1) == fab.host_address(5, 1)
    (tmp_path / "fabric.json").write_text("{}")
    with pytest.raises(ValueError, match="missing field 'planes'"):
        load_export(tmp_path)
    with pytest.raises(ValueError, match=r"fabric\.json"):
        load_export(tmp_path / "nowhere")


def test_export_rejects_bad_settings() -> None:
    plan = UsidPlan(MultiPlaneClos(2, 8, 4, 8))
    with pytest.raises(ValueError, match="mtu"):
        LinuxFabric(plan, mtu=1000)
    with pytest.raises(ValueError, match="locator"):
        LinuxFabric(plan, host_prefix=plan.locator)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 8),
    st.integers(1, 400),
    st.sampled_from([4, 8, 16, 32]),
    st.data(),
)
def test_final_address_is_what_the_last_shift_leaves(
    planes: int, hosts: int, t0r: int, data: st.DataObject
) -> None:
    t1r = -(-hosts // (t0r // 2))
    topo = MultiPlaneClos(planes, hosts, t0r, max(t1r, 1))
    plan = UsidPlan(topo)
    s = data.draw(st.integers(0, hosts - 1))
    d = data.draw(st.integers(0, hosts - 1))
    p = data.draw(st.integers(0, planes - 1))
    u = data.draw(st.integers(0, topo.uplinks - 1))
    addr = int(plan.path_address(s, d, p, u))
    for sw in topo.path(s, d, p, u)[1:-1]:
        _port, addr = plan.forward(sw, addr)
    final = LinuxFabric(plan).usid_address(d, p)
    assert str(ipaddress.IPv6Address(addr)) == final
    assert usid_final_address(plan.path_address(s, d, p, u)) == final
    assert usid_final_address(ipaddress.IPv6Address(final).packed) == final  # idempotent
