"""Multi-plane two-tier Clos: shapes, wiring consistency, paths, ECMP, and the single-plane comparison."""

from __future__ import annotations

import collections
import itertools
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openmrc.fabric.clos import MultiPlaneClos, single_plane_equivalent
from openmrc.fabric.ecmp import EcmpHash, flow_crc, fmix32, mul32
from openmrc.fabric.topology import Role


def small() -> MultiPlaneClos:
    return MultiPlaneClos(4, 64, 16, 16, 100_000_000_000, 500)


def test_production_shape() -> None:
    c = MultiPlaneClos(8, 131072, 512, 512, 100_000_000_000, 500)
    assert (c.hosts_per_t0, c.t0_per_plane, c.t1_per_plane) == (256, 512, 256)
    assert c.counts() == {"HOST": 131072, "T0": 4096, "T1": 2048, "T2": 0}
    assert c.num_switches() == 6144
    assert c.num_links() == 8 * 131072 + 8 * 512 * 256 == 2_097_152
    assert c.node_name(c.t1(7, 255)) == "p7-t1-255"
    assert c.switch_info(c.t0(3, 17)) == (Role.T0, 3, 17)
    assert c.paths_between(0, 131071) == 2048


def test_small_wiring_is_consistent() -> None:
    c = small()
    links = list(c.links())
    assert len(links) == c.num_links() == 4 * 64 + 4 * 8 * 8
    seen: set[tuple[int, int]] = set()
    for lk in links:
        for node, port, peer, peer_port in (
            (lk.a, lk.a_port, lk.b, lk.b_port),
            (lk.b, lk.b_port, lk.a, lk.a_port),
        ):
            assert (node, port) not in seen  # every port used by exactly one link
            seen.add((node, port))
            ref = c.ports(node)[port]
            assert (ref.peer, ref.peer_port) == (peer, peer_port)
    for n in range(c.num_nodes()):
        assert [r.port for r in c.ports(n)] == list(range(len(c.ports(n))))  # contiguous from 0
        assert all((n, r.port) in seen for r in c.ports(n))
    # planes are independent: a switch only ever links to hosts and switches of its own plane
    for lk in links:
        pa, pb = c.plane(lk.a), c.plane(lk.b)
        assert -1 in (pa, pb) or pa == pb


def test_networkx_export() -> None:
    import networkx as nx

    c = small()
    g = c.to_networkx()
    assert nx.is_connected(g)
    deg = collections.Counter((g.nodes[n]["role"], d) for n, d in g.degree())
    assert deg == {("HOST", 4): 64, ("T0", 16): 32, ("T1", 8): 32}
    with pytest.raises(ValueError, match="max_links"):
        c.to_networkx(max_links=10)


def test_partial_last_t0() -> None:
    c = MultiPlaneClos(2, 20, 16, 16)
    assert c.t0_per_plane == 3
    last = c.t0(0, 2)
    assert sum(1 for r in c.ports(last) if r.peer < c.num_hosts) == 4
    assert c.num_links() == sum(1 for _ in c.links())


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"planes": 0}, "planes"),
        ({"hosts": -1}, "hosts"),
        ({"t0_radix": 15}, "t0_radix"),
        ({"hosts": 10_000}, "hosts"),
        ({"link_latency_ns": -1}, "link_latency_ns"),
    ],
)
def test_invalid_shapes_name_the_field(kwargs: dict[str, int], field: str) -> None:
    args = {"planes": 4, "hosts": 64, "t0_radix": 16, "t1_radix": 16, **kwargs}
    with pytest.raises(ValueError, match=f"MultiPlaneClos.{field}"):
        MultiPlaneClos(**args)


def test_paths_walk_existing_links() -> None:
    c = small()
    for src, dst in ((0, 1), (0, 63), (17, 42)):
        for plane in range(c.planes):
            for uplink in range(c.uplinks):
                path = c.path(src, dst, plane, uplink)
                assert path[0] == src and path[-1] == dst
                assert len(path) - 2 == c.hops(src, dst)
                for a, b in itertools.pairwise(path):
                    assert b in {r.peer for r in c.ports(a)}
                    if a >= c.num_hosts:
                        assert c.plane(a) == plane


def test_single_plane_equivalent() -> None:
    sp = single_plane_equivalent(131072, 51_200_000_000_000, 800_000_000_000)
    assert (sp.radix, sp.tiers, sp.switches, sp.switch_links) == (64, 4, 7 * 131072 // 64, 3 * 131072)
    three = single_plane_equivalent(65536, 51_200_000_000_000, 800_000_000_000)
    assert (three.tiers, three.switches) == (3, 5 * 65536 // 64)  # a full k=64 three-tier fat tree
    assert three.transceivers == 2 * 2 * 65536


def test_ecmp_is_deterministic_salted_and_spreads() -> None:
    e = EcmpHash(seed=7)
    assert e.pick(5, 8, 1, 2, 1000) == EcmpHash(seed=7).pick(5, 8, 1, 2, 1000)
    assert e.salt(1) != e.salt(2)
    counts = collections.Counter(e.pick(3, 8, src, src + 1, 49152 + src) for src in range(8000))
    assert set(counts) == set(range(8))
    assert max(counts.values()) < 1.2 * 1000 and min(counts.values()) > 0.8 * 1000
    # different switches make different (uncorrelated) choices for the same flows
    same = sum(e.pick(1, 8, s, s + 1, s) == e.pick(2, 8, s, s + 1, s) for s in range(4000))
    assert same < 4000 * 0.2
    with pytest.raises(ValueError):
        e.pick(1, 0, 1, 2, 3)


@given(st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF))
def test_mul32_is_the_product_modulo_2_to_the_32(h: int, c: int) -> None:
    assert mul32(h, c) == (h * c) % (1 << 32)


@given(st.integers(0, 0xFFFFFFFF))
def test_fmix32_is_murmur3s_finaliser(h: int) -> None:
    """The split multiplications give MurmurHash3's 32-bit finaliser exactly."""
    x = h ^ (h >> 16)
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    assert fmix32(h) == x ^ (x >> 16)


@given(st.integers(0, 1 << 20), st.integers(0, 1 << 20), st.integers(0, 0xFFFF), st.integers(0, 0xFFFF))
def test_ecmp_hash_is_the_flow_crc_mixed_with_the_switch_salt(
    src: int, dst: int, sport: int, fl: int
) -> None:
    e = EcmpHash(seed=3)
    crc = flow_crc(src, dst, sport, 4791, fl)
    key = struct.pack("!IIIHHI", 0, src, dst, sport, 4791, fl)
    assert crc == zlib.crc32(key)
    for switch in (0, 17, 1 << 20):
        assert (
            e.hash32(switch, src, dst, sport, 4791, fl)
            == e.mix(crc, e.salt(switch))
            == fmix32(crc ^ e.salt(switch))
        )


@given(
    st.integers(0, 1 << 40),
    st.integers(0, 1 << 40),
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFFFFFF),
)
def test_flow_crc_is_zlibs_crc32_of_the_packed_key(
    src: int, dst: int, sport: int, dport: int, fl: int
) -> None:
    """The byte-at-a-time CRC gives zlib's over the whole range of every field (addresses modulo 2**32)."""
    key = struct.pack("!IIIHHI", 0, src & 0xFFFFFFFF, dst & 0xFFFFFFFF, sport, dport, fl)
    assert flow_crc(src, dst, sport, dport, fl) == zlib.crc32(key)


@pytest.mark.parametrize(
    "sport, dport, fl",
    [(-1, 4791, 0), (1 << 16, 4791, 0), (0, -1, 0), (0, 1 << 16, 0), (0, 4791, -1), (0, 4791, 1 << 32)],
)
def test_flow_crc_refuses_a_field_beyond_its_width(sport: int, dport: int, fl: int) -> None:
    with pytest.raises(ValueError, match="flow key out of range"):
        flow_crc(1, 2, sport, dport, fl)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_single_plane_equivalent_refuses_a_radix_that_builds_no_tree(k: int) -> None:
    """A radix below 4 adds a tier per step without adding hosts: refused with the rule, not looped on."""
    with pytest.raises(ValueError, match=r"fewer than two|needs k ≥ 4"):
        single_plane_equivalent(64, k * 400_000_000_000, 400_000_000_000)


@pytest.mark.parametrize("k", [4, 5, 6, 64])
def test_single_plane_equivalent_smallest_tree_holds_the_hosts(k: int) -> None:
    sp = single_plane_equivalent(100, k * 100_000_000_000, 100_000_000_000)
    assert 2 * (k // 2) ** sp.tiers >= 100 > 2 * (k // 2) ** (sp.tiers - 1)


def test_topo_plan_with_no_single_plane_equivalent_still_plans(tmp_path: Path) -> None:
    """4 planes of a radix-8 T0: the ASIC split at NIC speed (2 ports) builds no fat tree; the plan is still
    printed and written, with no single-plane column (this used to loop forever)."""
    cmd = [sys.executable, "-m", "openmrc.cli.main", "topo", "plan", "--planes", "4", "--hosts", "32"]
    cmd += ["--t0-radix", "8", "--t1-radix", "8", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "single plane: none to compare with" in res.stdout and "Traceback" not in res.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["single_plane"] is None and plan["hosts"] == 32
