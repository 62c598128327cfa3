"""SRv6 uSID plan: addresses, hop-by-hop forwarding with the static tables, exports and EV profiles."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from openmrc.cli.main import app
from openmrc.ev import packet_fields
from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.srv6 import KIND_HOST, KIND_T0, KIND_T1, SRV6_EV_MODE, UsidPlan, ev_min_active


def medium() -> MultiPlaneClos:
    return MultiPlaneClos(8, 512, 32, 32, 100_000_000_000, 500)


def walk(plan: UsidPlan, src: int, dst: int, plane: int, uplink: int) -> list[int]:
    """Follow the static tables from the source T0 until a host is reached; the nodes visited."""
    t = plan.topo
    addr = int(plan.path_address(src, dst, plane, uplink))
    node, path = t.host_t0(src, plane), [src]
    for _ in range(8):
        path.append(node)
        port, addr = plan.forward(node, addr)
        node = t.ports(node)[port].peer
        if node < t.num_hosts:
            path.append(node)
            return path
    raise AssertionError("routing loop")


def test_address_layout() -> None:
    c = MultiPlaneClos(8, 131072, 512, 512)
    plan = UsidPlan(c)
    assert (plan.plane_bits, plan.index_bits) == (3, 11)
    # plane 7 | kind | index, hand-computed: T0 511 -> 0xe800|511 = 0xe9ff; T1 255 -> 0xf000|255 = 0xf0ff;
    # source T0 0 -> 0xe800; host 131071 is port 255 of its T0 -> 0xf800|255 = 0xf8ff
    assert plan.path_address(0, 131071, 7, 255) == ipaddress.IPv6Address("fc00:0:e800:f0ff:e9ff:f8ff::")
    assert plan.path_address(0, 1, 3, 9) == ipaddress.IPv6Address("fc00:0:6800:7801::")  # same T0: 2 uSIDs
    assert plan.decode(0xF0FF) == (7, KIND_T1, 255)
    assert plan.decode(0xE9FF) == (7, KIND_T0, 511)
    assert plan.decode(0xF8FF) == (7, KIND_HOST, 255)


def test_usids_are_unique_and_never_zero() -> None:
    c = medium()
    plan = UsidPlan(c)
    switch_usids = [plan.switch_usid(s) for s in range(c.num_hosts, c.num_nodes())]
    assert len(set(switch_usids)) == len(switch_usids) and 0 not in switch_usids
    for t0 in range(c.t0_per_plane):
        first = t0 * c.hosts_per_t0
        ports = {plan.host_usid(h, 0) for h in range(first, first + c.hosts_per_t0)}
        assert len(ports) == c.hosts_per_t0 and not ports & set(switch_usids)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 511), st.integers(0, 511), st.integers(0, 7), st.integers(0, 15))
def test_static_tables_deliver_along_the_chosen_path(src: int, dst: int, plane: int, uplink: int) -> None:
    c = medium()
    plan = UsidPlan(c)
    assert walk(plan, src, dst, plane, uplink) == c.path(src, dst, plane, uplink)


def test_forward_agrees_with_the_exported_tables() -> None:
    c = medium()
    plan = UsidPlan(c)
    for s in (c.t0(0, 0), c.t0(5, 15), c.t1(7, 3)):
        table = plan.table(s)
        assert table[0].action == "end" and table[0].usid == plan.switch_usid(s)
        for r in table[1:]:
            addr = plan.address_int([r.usid])
            port, _ = plan.forward(s, addr)
            assert port == r.port and c.ports(s)[port].peer == r.next_hop


def test_misrouted_addresses_raise() -> None:
    c = medium()
    plan = UsidPlan(c)
    other_plane = int(plan.path_address(0, 300, 2, 0))
    with pytest.raises(ValueError, match="plane"):
        plan.forward(c.t0(1, 0), other_plane)
    with pytest.raises(ValueError, match="locator"):
        plan.forward(c.t0(1, 0), int(ipaddress.IPv6Address("2001:db8::1")))
    with pytest.raises(ValueError, match="no route"):
        plan.forward(c.t1(2, 0), plan.address_int([plan._usid(2, KIND_T1, 1)]))
    with pytest.raises(ValueError):
        plan.path_address(0, 1, 8, 0)


def test_table_sizes_and_exports(tmp_path: Path) -> None:
    c = medium()
    plan = UsidPlan(c)
    assert len(plan.table(c.t0(0, 0))) == 1 + c.hosts_per_t0 + c.uplinks
    assert len(plan.table(c.t1(0, 0))) == 1 + c.t0_per_plane
    js = plan.table_json(c.t1(0, 1))
    assert js["switch"] == "p0-t1-1" and js["prefix"] == str(plan.prefix(plan.switch_usid(c.t1(0, 1))))
    assert all(r["prefix"] == str(plan.prefix(int(r["prefix"].split(":")[2], 16))) for r in js["routes"])
    n = plan.write_tables(str(tmp_path / "t.jsonl"))
    rows = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(rows) == c.num_switches() and n == sum(len(r["routes"]) + 1 for r in rows)


def test_ev_profile_expands_to_path_addresses() -> None:
    c = medium()
    plan = UsidPlan(c)
    prof, ports = plan.ev_profile(3, 400, 32)
    assert prof.ev_count == 32 and sorted(set(ports)) == list(range(1, 9))
    assert [ports.count(p) for p in range(1, 9)] == [4] * 8  # planes balanced
    for compact, port in zip(prof.evs or (), ports, strict=True):
        fields = packet_fields(prof, prof.expand(compact))
        plane = port - 1
        addrs = {plan.path_address(3, 400, plane, u) for u in range(c.uplinks)}
        assert fields.dst in addrs and fields.srh_segment is None
    same_t0, sp = plan.ev_profile(0, 1)
    assert same_t0.ev_count == 8 and sp == list(range(1, 9))


@settings(max_examples=60, deadline=None)
@given(
    planes=st.sampled_from([1, 2, 4, 8]),
    t0_radix=st.sampled_from([4, 8, 16]),
    data=st.data(),
)
def test_every_ev_of_a_profile_is_one_of_the_pairs_paths(
    planes: int, t0_radix: int, data: st.DataObject
) -> None:
    """Whatever the shape, each explicit EV expands to `path_address` of its own plane and some uplink, the
    EVs of a pair are distinct, and each plane gets its share."""
    hosts = data.draw(st.integers(2, (t0_radix // 2) * 8), label="hosts")
    c = MultiPlaneClos(planes, hosts, t0_radix, 8, 100_000_000_000, 500)
    plan = UsidPlan(c)
    src = data.draw(st.integers(0, hosts - 1), label="src")
    dst = data.draw(st.integers(0, hosts - 1).filter(lambda d: d != src), label="dst")
    count = data.draw(st.integers(1, c.paths_between(src, dst)), label="count")
    prof, ports = plan.ev_profile(src, dst, count)
    addrs = []
    for compact, port in zip(prof.evs or (), ports, strict=True):
        dst_addr = packet_fields(prof, prof.expand(compact)).dst
        assert dst_addr in {plan.path_address(src, dst, port - 1, u) for u in range(c.uplinks)}
        addrs.append(dst_addr)
    assert len(set(addrs)) == count
    shares = [ports.count(p) for p in range(1, planes + 1)]
    assert max(shares) - min(shares) <= 1
    # what simulated hosts install instead of the profile: the very same expanded EVs, ports and floor
    expanded = plan.ev_expanded(src, dst, count)
    assert expanded == [(prof.expand(ev), port) for ev, port in zip(prof.evs or (), ports, strict=True)]
    assert prof.fmt is not None and prof.fmt.mode is SRV6_EV_MODE
    assert prof.ev_min_active == ev_min_active(count)


def test_pairs_with_few_evs_spread_over_every_uplink() -> None:
    """A pair with fewer EVs than uplinks uses evenly spaced uplinks from its own offset, so that many
    pairs together load every T1 (one fixed set would leave most of the fabric idle)."""
    c = medium()
    plan = UsidPlan(c)
    per_plane = 2
    used: dict[int, int] = {}
    sets = set()
    for src in range(0, 64):
        dst = c.num_hosts - 1 - src
        prof, ports = plan.ev_profile(src, dst, c.planes * per_plane)
        assert [ports.count(p) for p in range(1, c.planes + 1)] == [per_plane] * c.planes
        ups = []
        for compact, port in zip(prof.evs or (), ports, strict=True):
            addr = packet_fields(prof, prof.expand(compact)).dst
            (u,) = [u for u in range(c.uplinks) if plan.path_address(src, dst, port - 1, u) == addr]
            ups.append(u)
            used[u] = used.get(u, 0) + 1
        first = sorted(ups[: c.planes * per_plane : c.planes])
        assert first[1] - first[0] == c.uplinks // per_plane  # evenly spaced within a plane
        sets.add(tuple(first))
    assert len(sets) > 1 and sorted(used) == list(range(c.uplinks))  # every uplink carries some pair


def test_plan_too_big_for_the_usid_index() -> None:
    with pytest.raises(ValueError, match="uSID index"):
        UsidPlan(MultiPlaneClos(32, 4096, 8192, 8192))


def test_topo_plan_cli(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        [
            "topo",
            "plan",
            "--planes",
            "4",
            "--hosts",
            "64",
            "--t0-radix",
            "16",
            "--t1-radix",
            "16",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "switches" in res.output and "optics" in res.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert (plan["switches"], plan["t0_total"], plan["t1_total"], plan["switch_links"]) == (64, 32, 32, 256)
    assert len((tmp_path / "tables.jsonl").read_text().splitlines()) == 64
    scripts = sorted(p.name for p in (tmp_path / "linux").iterdir())
    assert len(scripts) == 64 + 64 and "p3-t1-7.sh" in scripts and "host63.sh" in scripts
    bad = CliRunner().invoke(app, ["topo", "plan", "--planes", "2", "--hosts", "100000", "--t0-radix", "16"])
    assert bad.exit_code != 0 and "MultiPlaneClos.hosts" in bad.output
