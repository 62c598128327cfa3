"""Fat trees and leaf/spine fabrics: htsim's counts and wiring rules, .topo parsing, ports and paths."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import networkx as nx
import pytest

from openmrc.fabric.fattree import FatTree, FatTreeSpec, FoldedClos, LeafSpine, parse_topo
from openmrc.fabric.topology import Link, Role

HTSIM = Path("/work/shared/workloads/htsim")
needs_htsim = pytest.mark.skipif(not HTSIM.is_dir(), reason="htsim workload files not present")
G100 = 100_000_000_000

# A 3-tier tree with bundles on both upper tiers (checked by hand against htsim's set_custom_params).
BUNDLED = """\
Nodes 16
Tiers 3
Podsize 4
Tier 0
Downlink_speed_Gbps 100
Radix_Down 2
Radix_Up 2
Downlink_Latency_ns 500
Tier 1
Downlink_speed_Gbps 100
Radix_Down 4
Radix_Up 4
Bundle 2
Downlink_Latency_ns 700
Switch_Latency_ns 30
Tier 2
Downlink_speed_Gbps 100
Radix_Down 8
Bundle 2
Downlink_Latency_ns 900
Switch_Latency_ns 40
"""

# BUNDLED with faster upper tiers. htsim counts ToR/Agg uplinks in units of the next tier's speed, so the
# radix_down values that pass its checks (2, 2) are smaller than the physical port counts (4, 8).
MIXED = BUNDLED.replace(
    "Downlink_speed_Gbps 100\nRadix_Down 4", "Downlink_speed_Gbps 200\nRadix_Down 2"
).replace("Downlink_speed_Gbps 100\nRadix_Down 8", "Downlink_speed_Gbps 400\nRadix_Down 2")

# Oversubscribed 2:1 at the ToR: 8 hosts, 4 uplinks per ToR.
OVERSUB = """\
Nodes 128
Tiers 3
Podsize 32
Tier 0
Oversubscribed 2
Downlink_speed_Gbps 100
Radix_Down 8
Radix_Up 4
Downlink_Latency_ns 1000
Tier 1
Downlink_speed_Gbps 100
Radix_Down 4
Radix_Up 4
Downlink_Latency_ns 1000
Tier 2
Downlink_speed_Gbps 100
Radix_Down 4
Downlink_Latency_ns 1000
"""


def link_tuples(t: FoldedClos) -> list[tuple[int, int, int, int, int, int]]:
    return sorted((lk.a, lk.a_port, lk.b, lk.b_port, lk.bps, lk.latency_ns) for lk in t.links())


def by_pair(t: FoldedClos) -> dict[tuple[int, int], list[Link]]:
    out: dict[tuple[int, int], list[Link]] = defaultdict(list)
    for lk in t.links():
        out[(lk.a, lk.b)].append(lk)
    return out


def switches(t: FoldedClos, role: Role) -> list[int]:
    return [n for n in range(t.num_nodes()) if t.role(n) == role]


# --- counts (htsim's default K-ary formulas) ---


@pytest.mark.parametrize("k", [4, 8, 16])
def test_from_k_counts(k: int) -> None:
    t = FatTree.from_k(k)
    n = k**3 // 4
    assert t.counts() == {"HOST": n, "T0": k * k // 2, "T1": k * k // 2, "T2": k * k // 4}
    assert (t.num_hosts, t.num_tors, t.num_aggs, t.num_cores, t.num_pods) == (
        n,
        k * k // 2,
        k * k // 2,
        k * k // 4,
        k,
    )
    assert (t.hosts_per_tor, t.tors_per_pod, t.aggs_per_pod, t.cores_per_agg) == (k // 2,) * 4
    assert t.hosts_per_pod == k * k // 4
    # host links + ToR uplinks + Agg uplinks, each K³/4
    assert t.num_links() == 3 * n == len(list(t.links()))
    assert t.tiers == 3 and t.planes == 1


def test_from_k_1024_matches_htsim_numbers() -> None:
    t = FatTree.from_k(16)
    assert (t.num_hosts, t.num_tors, t.num_aggs, t.num_cores, t.num_pods, t.hosts_per_pod) == (
        1024,
        128,
        128,
        64,
        16,
        64,
    )


def test_from_k_two_tiers() -> None:
    t = FatTree.from_k(8, tiers=2)
    assert t.counts() == {"HOST": 32, "T0": 8, "T1": 4, "T2": 0}
    assert t.num_links() == 32 + 8 * 4
    assert all(t.pod_of(h) == 0 for h in range(32))


@pytest.mark.parametrize("k", [0, 3, 7, -2])
def test_from_k_rejects_odd_or_small(k: int) -> None:
    with pytest.raises(ValueError, match="K must be even"):
        FatTree.from_k(k)


# --- wiring rules ---


@pytest.mark.parametrize("k", [4, 8, 16])
def test_host_links(k: int) -> None:
    t = FatTree.from_k(k)
    for h in range(t.num_hosts):
        ports = t.ports(h)
        assert len(ports) == 1
        assert ports[0].peer == t.tor(h // (k // 2)) == t.host_tor(h)
        assert t.role(ports[0].peer) == Role.T0
        assert t.pod_of(h) == h // (k * k // 4)


@pytest.mark.parametrize("k", [4, 8, 16])
def test_tor_links_every_agg_of_its_pod_only(k: int) -> None:
    t = FatTree.from_k(k)
    pairs = by_pair(t)
    for i in range(t.num_tors):
        pod = i // t.tors_per_pod
        ups = {p.peer for p in t.ports(t.tor(i)) if t.role(p.peer) == Role.T1}
        assert ups == {t.agg(j) for j in range(pod * t.aggs_per_pod, (pod + 1) * t.aggs_per_pod)}
        assert all(len(pairs[(t.tor(i), a)]) == 1 for a in ups)


@pytest.mark.parametrize("k", [4, 8, 16])
def test_agg_links_cores_by_pod_position(k: int) -> None:
    t = FatTree.from_k(k)
    a_pp = k // 2
    for j in range(t.num_aggs):
        q = j % a_pp
        ups = sorted(p.peer for p in t.ports(t.agg(j)) if t.role(p.peer) == Role.T2)
        assert ups == [t.core(q + a_pp * up) for up in range(k // 2)]


@pytest.mark.parametrize("k", [4, 8, 16])
def test_link_speed_and_latency_per_tier(k: int) -> None:
    t = FatTree.from_k(k, link_bps=G100, latency_ns=1000)
    for lk in t.links():
        assert (lk.bps, lk.latency_ns) == (G100, 1000)
        assert lk.a < lk.b and t.role(lk.b) == t.role(lk.a) + 1


def test_per_tier_attributes_from_topo() -> None:
    t = FatTree.from_topo_text(MIXED)
    assert MIXED != BUNDLED and t.counts() == FatTree.from_topo_text(BUNDLED).counts()
    want = {Role.HOST: (100 * 10**9, 500), Role.T0: (200 * 10**9, 700), Role.T1: (400 * 10**9, 900)}
    for lk in t.links():
        assert (lk.bps, lk.latency_ns) == want[t.role(lk.a)]
    assert t.switch_latency_ns == (0, 30, 40)
    assert t.link_bps == (100 * 10**9, 200 * 10**9, 400 * 10**9)
    assert t.link_latency_ns == (500, 700, 900)


def test_bundled_tree_counts_and_parallel_links() -> None:
    t = FatTree.from_topo_text(BUNDLED)
    assert t.counts() == {"HOST": 16, "T0": 8, "T1": 4, "T2": 2}
    assert (t.aggs_per_pod, t.cores_per_agg, t.bundles) == (1, 2, (1, 2, 2))
    pairs = by_pair(t)
    assert all(len(v) == 2 for (a, _b), v in pairs.items() if t.role(a) != Role.HOST)
    assert t.num_links() == 16 + 8 * 2 + 4 * 2 * 2


def test_oversubscribed_tree() -> None:
    t = FatTree.from_topo_text(OVERSUB)
    assert t.counts() == {"HOST": 128, "T0": 16, "T1": 16, "T2": 16}
    g = t.to_networkx()
    assert {g.degree(n) for n in switches(t, Role.T0)} == {8 + 4}
    assert {g.degree(n) for n in switches(t, Role.T1)} == {4 + 4}
    assert {g.degree(n) for n in switches(t, Role.T2)} == {4}


# --- ports ---


TREES = {
    "k4": lambda: FatTree.from_k(4),
    "k8": lambda: FatTree.from_k(8),
    "bundled": lambda: FatTree.from_topo_text(BUNDLED),
    "mixed": lambda: FatTree.from_topo_text(MIXED),
    "oversub": lambda: FatTree.from_topo_text(OVERSUB),
    "2tier": lambda: FatTree.from_k(6, tiers=2),
    "leafspine": lambda: LeafSpine(24, 6, 5, link_bps=G100, latency_ns=800, uplinks_per_spine=2),
}


@pytest.mark.parametrize("which", sorted(TREES))
def test_ports_contiguous_downlinks_first(which: str) -> None:
    t = TREES[which]()
    for n in range(t.num_nodes()):
        ports = t.ports(n)
        assert [p.port for p in ports] == list(range(len(ports)))
        roles = [t.role(p.peer) for p in ports]
        down = [r < t.role(n) for r in roles]
        assert down == sorted(down, reverse=True), f"{t.node_name(n)}: uplink before downlink"
        # downlinks and uplinks each in ascending peer order (htsim's addPort order)
        for want in (True, False):
            peers = [p.peer for p, d in zip(ports, down, strict=True) if d == want]
            assert peers == sorted(peers)


@pytest.mark.parametrize("which", sorted(TREES))
def test_port_to_matches_links(which: str) -> None:
    t = TREES[which]()
    for (a, b), group in by_pair(t).items():
        for member, lk in enumerate(group):
            assert t.port_to(a, b, member) == lk.a_port
            assert t.port_to(b, a, member) == lk.b_port


def test_port_to_hand_checked_k4() -> None:
    t = FatTree.from_k(4)  # hosts 0-15, ToRs 16-23, Aggs 24-31, cores 32-35
    assert (t.tor(0), t.agg(0), t.core(0)) == (16, 24, 32)
    assert t.port_to(16, 25) == 3  # ToR 0: hosts on 0,1; Agg 0 on 2, Agg 1 on 3
    assert t.port_to(26, 19) == 1  # Agg 2 (pod 1): ToR 2 on 0, ToR 3 on 1
    assert t.port_to(24, 34) == 3  # Agg 0: ToRs on 0,1; cores 0, 2 on 2, 3
    assert [p.peer for p in t.ports(32)] == [24, 26, 28, 30]
    with pytest.raises(ValueError, match="not adjacent"):
        t.port_to(16, 26)
    with pytest.raises(ValueError, match="bundle member"):
        t.port_to(16, 24, 1)


def test_numbering_offsets() -> None:
    t = FatTree.from_k(8)
    assert [t.tor(i) for i in (0, 31)] == [128, 159]
    assert [t.agg(i) for i in (0, 31)] == [160, 191]
    assert [t.core(i) for i in (0, 15)] == [192, 207]
    assert t.num_nodes() == 208
    for n in range(t.num_nodes()):
        i = t.htsim_id(n)
        back = {Role.HOST: lambda x: x, Role.T0: t.tor, Role.T1: t.agg, Role.T2: t.core}[t.role(n)](i)
        assert back == n
    assert t.node_name(t.agg(5)) == "agg5"
    for f, n in ((t.tor, 32), (t.agg, 32), (t.core, 16), (t.tor, -1)):
        with pytest.raises(IndexError):
            f(n)
    with pytest.raises(ValueError, match="not a host"):
        t.host_tor(128)


# --- networkx view ---


@pytest.mark.parametrize("k", [4, 8, 16])
def test_networkx_connected_and_degrees(k: int) -> None:
    t = FatTree.from_k(k)
    g = t.to_networkx()
    assert nx.is_connected(g)
    assert g.number_of_edges() == t.num_links()
    want = {Role.HOST: 1, Role.T0: k, Role.T1: k, Role.T2: k}
    for n in range(t.num_nodes()):
        assert g.degree(n) == want[t.role(n)], t.node_name(n)


# --- .topo files ---


@needs_htsim
@pytest.mark.parametrize(
    ("fname", "k"),
    [("fat_tree_1024.topo", 16), ("fat_tree_128_1os.topo", 8), ("fat_tree_16_generated.topo", 4)],
)
def test_topo_file_equals_from_k(fname: str, k: int) -> None:
    f = FatTree.from_topo_file(HTSIM / fname)
    d = FatTree.from_k(k)
    assert link_tuples(f) == link_tuples(d)
    assert f.spec == d.spec
    assert f.switch_latency_ns == (0, 0, 0)
    assert f.name == Path(fname).stem


@needs_htsim
def test_leaf_spine_topo_file_is_two_tier_fattree() -> None:
    f = FatTree.from_topo_file(HTSIM / "leaf_spine_1024.topo")
    assert isinstance(f, FatTree) and f.tiers == 2
    assert f.counts() == {"HOST": 1024, "T0": 32, "T1": 32, "T2": 0}
    assert f.num_links() == 1024 + 32 * 32
    ls = LeafSpine(1024, 32, 32, link_bps=G100, latency_ns=1000)
    assert link_tuples(f) == link_tuples(ls)


def test_topo_round_trip() -> None:
    for spec in (FatTree.from_k(8).spec, parse_topo(BUNDLED), parse_topo(MIXED), parse_topo(OVERSUB)):
        assert parse_topo(spec.to_topo_text()) == spec


def test_topo_keywords_case_insensitive_and_comments() -> None:
    text = (
        "# header\nNODES 16   # sixteen\n\ntiers 3\npodSIZE 4\n" + BUNDLED.split("Podsize 4\n", 1)[1].upper()
    )
    assert parse_topo(text) == parse_topo(BUNDLED)


def _replace(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


BAD_TOPOS = [
    # (description, text, fragments the message must contain)
    ("no nodes", _replace(BUNDLED, "Nodes 16\n", ""), [":3:", "Nodes", "missing"]),
    ("no tiers", _replace(BUNDLED, "Tiers 3\n", ""), [":3:", "Tiers", "missing"]),
    ("no podsize", _replace(BUNDLED, "Podsize 4\n", ""), [":3:", "Podsize", "missing"]),
    ("empty file", "", [":1:", "Nodes", "missing"]),
    ("four tiers", _replace(BUNDLED, "Tiers 3", "Tiers 4"), [":2:", "Tiers", "2 or 3"]),
    ("unknown keyword", _replace(BUNDLED, "Bundle 2\n", "Bundel 2\n"), [":13:", "unknown keyword", "Bundel"]),
    (
        "not an integer",
        _replace(BUNDLED, "Radix_Down 4", "Radix_Down 4.5"),
        [":11:", "Radix_Down", "integer"],
    ),
    ("missing value", _replace(BUNDLED, "Radix_Down 4", "Radix_Down"), [":11:", "Radix_Down"]),
    ("negative", _replace(BUNDLED, "Radix_Down 4", "Radix_Down -4"), [":11:", "Radix_Down"]),
    (
        "duplicate",
        _replace(BUNDLED, "Radix_Up 4\n", "Radix_Up 4\nRADIX_UP 4\n"),
        [":13:", "duplicate", "line 12"],
    ),
    (
        "radix_up on top",
        _replace(BUNDLED, "Radix_Down 8\n", "Radix_Down 8\nRadix_Up 4\n"),
        [":19:", "top tier"],
    ),
    ("tier out of range", _replace(BUNDLED, "Tier 2", "Tier 3"), [":16:", "out of range"]),
    ("section missing", BUNDLED.split("Tier 2\n")[0], ["Tier 2", "section missing"]),
    ("field missing", _replace(BUNDLED, "Radix_Down 8\n", ""), [":16:", "Tier 2 Radix_Down", "missing"]),
    (
        "field before tier",
        _replace(BUNDLED, "Podsize 4\n", "Podsize 4\nBundle 1\n"),
        [":4:", "before any Tier"],
    ),
    ("header in tier", BUNDLED + "Nodes 16\n", [":22:", "Nodes", "header keyword"]),
    ("repeated tier", _replace(BUNDLED, "Tier 1\n", "Tier 0\n"), [":9:", "Tier 0", "repeated"]),
    (
        "oversub",
        _replace(BUNDLED, "Radix_Up 2\n", "Radix_Up 2\nOversubscribed 2\n"),
        [":8:", "Oversubscribed"],
    ),
    ("podsize vs nodes", _replace(BUNDLED, "Nodes 16", "Nodes 18"), [":3:", "Podsize", "not a multiple"]),
    (
        "podsize vs radix",
        _replace(BUNDLED, "Radix_Down 2\n", "Radix_Down 3\n"),
        [":3:", "Podsize", "Radix_Down"],
    ),
    ("tor bundle", _replace(BUNDLED, "Radix_Up 2\n", "Radix_Up 2\nBundle 2\n"), [":8:", "Tier 0 Bundle"]),
    (
        "missing bundle",
        _replace(BUNDLED, "Bundle 2\n", ""),
        [":7:", "Tier 0 Radix_Up", "Tier 1 Bundle 2 would fit"],
    ),
    ("agg radix_up", _replace(BUNDLED, "Radix_Up 4\n", "Radix_Up 8\n"), [":12:", "Tier 1 Radix_Up"]),
    (
        "core count",
        _replace(BUNDLED, "Radix_Down 8\n", "Radix_Down 16\n"),
        [":12:", "Tier 2 Bundle 4 would fit"],
    ),
    ("core radix", _replace(BUNDLED, "Radix_Down 8\n", "Radix_Down 32\n"), [":18:", "Tier 2 Radix_Down"]),
    (
        "bundle vs radix",
        _replace(BUNDLED, "Radix_Down 8\n", "Radix_Down 7\n"),
        [":18:", "multiple of Bundle 2"],
    ),
    (
        "zero latency",
        _replace(BUNDLED, "Downlink_Latency_ns 500", "Downlink_Latency_ns 0"),
        [":8:", "Latency"],
    ),
]


@pytest.mark.parametrize(("what", "text", "fragments"), BAD_TOPOS, ids=[b[0] for b in BAD_TOPOS])
def test_malformed_topo_files(tmp_path: Path, what: str, text: str, fragments: list[str]) -> None:
    path = tmp_path / "bad.topo"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        FatTree.from_topo_file(path)
    msg = str(err.value)
    assert msg.startswith(str(path)), msg
    for frag in fragments:
        assert frag in msg, f"{what}: {frag!r} not in {msg!r}"


def test_two_tier_podsize_must_equal_nodes() -> None:
    text = "Nodes 64\nTiers 2\nPodsize 32\nTier 0\nDownlink_speed_Gbps 100\nRadix_Down 8\nRadix_Up 8\n"
    text += (
        "Downlink_Latency_ns 1000\nTier 1\nDownlink_speed_Gbps 100\nRadix_Down 8\nDownlink_Latency_ns 1000\n"
    )
    with pytest.raises(ValueError, match=r":3: Podsize: must equal Nodes"):
        parse_topo(text)
    assert FatTree.from_topo_text(text.replace("Podsize 32", "Podsize 64")).counts()["T1"] == 8


def test_programmatic_spec_errors_name_the_field() -> None:
    spec = FatTree.from_k(4).spec
    bad = FatTreeSpec(spec.nodes, spec.podsize, spec.tiers[:1])
    with pytest.raises(ValueError, match="Tiers: must be 2 or 3"):
        FatTree(bad)
    with pytest.raises(ValueError, match="Podsize"):
        FatTree(FatTreeSpec(spec.nodes, 5, spec.tiers))


# --- paths ---


def _check_paths_against_graph(t: FoldedClos, pairs: list[tuple[int, int]]) -> None:
    g = nx.Graph(t.to_networkx())
    for s, d in pairs:
        paths = t.shortest_paths(s, d)
        assert len({tuple(p) for p in paths}) == len(paths)
        for p in paths:
            assert p[0] == s and p[-1] == d
            assert all(g.has_edge(u, v) for u, v in itertools.pairwise(p))
            assert len(p) - 2 == t.hops(s, d)
        assert sorted(paths) == sorted(nx.all_shortest_paths(g, s, d))


def test_paths_k4_all_pairs_equal_graph_search() -> None:
    t = FatTree.from_k(4)
    _check_paths_against_graph(t, [(s, d) for s in range(16) for d in range(16) if s != d])


@pytest.mark.parametrize("which", ["bundled", "mixed", "oversub", "2tier", "leafspine"])
def test_paths_equal_graph_search(which: str) -> None:
    t = TREES[which]()
    hosts = range(t.num_hosts)
    _check_paths_against_graph(t, [(s, d) for s in hosts for d in hosts if s != d and (s * 7 + d) % 5 == 0])


@pytest.mark.parametrize("k", [4, 8, 16])
def test_path_counts(k: int) -> None:
    t = FatTree.from_k(k)
    half = k // 2
    same_tor, same_pod, other_pod = (0, 1), (0, half), (0, t.num_hosts - 1)
    assert t.shortest_paths(*same_tor) == [[0, t.tor(0), 1]]
    assert len(t.shortest_paths(*same_pod)) == t.aggs_per_pod == half
    assert len(t.shortest_paths(*other_pod)) == t.aggs_per_pod * t.cores_per_agg == half * half
    assert [t.hops(*p) for p in (same_tor, same_pod, other_pod)] == [1, 3, 5]
    assert t.shortest_paths(3, 3) == [[3]] and t.hops(3, 3) == 0
    # htsim's route order: Agg position outer, core index inner
    cross = t.shortest_paths(*other_pod)
    assert [p[3] for p in cross[:half]] == [t.core(half * up) for up in range(half)]


@pytest.mark.parametrize("k", [8, 16])
def test_paths_valid_walks_sampled(k: int) -> None:
    t = FatTree.from_k(k)
    n = t.num_hosts
    _check_paths_against_graph(t, [(s, (s * 37 + 11) % n) for s in range(0, n, 7) if (s * 37 + 11) % n != s])


def test_route_count_includes_bundles() -> None:
    t = FatTree.from_topo_text(BUNDLED)
    assert t.route_count(0, 1) == 1
    assert len(t.shortest_paths(0, 2)) == 1 and t.route_count(0, 2) == 4
    assert len(t.shortest_paths(0, 15)) == 2 and t.route_count(0, 15) == 2 * 4 * 4
    assert FatTree.from_k(8).route_count(0, 127) == 16


def test_bad_path_endpoints() -> None:
    t = FatTree.from_k(4)
    with pytest.raises(ValueError, match="not a host"):
        t.shortest_paths(0, t.tor(0))
    with pytest.raises(ValueError, match="not a host"):
        t.hops(-1, 0)


# --- leaf/spine ---


def test_leafspine_counts_and_degrees() -> None:
    ls = LeafSpine(24, 6, 5, link_bps=G100, latency_ns=800, uplinks_per_spine=2, switch_latency_ns=50)
    assert ls.counts() == {"HOST": 24, "T0": 4, "T1": 5, "T2": 0}
    assert (ls.num_leaves, ls.num_spines, ls.uplinks_per_spine) == (4, 5, 2)
    assert ls.num_links() == 24 + 4 * 5 * 2
    assert (ls.leaf(1), ls.spine(0)) == (25, 28) and ls.node_name(28) == "spine0"
    assert ls.switch_latency_ns == (50, 50)
    g = ls.to_networkx()
    assert nx.is_connected(g)
    assert {g.degree(n) for n in switches(ls, Role.T0)} == {6 + 5 * 2}
    assert {g.degree(n) for n in switches(ls, Role.T1)} == {4 * 2}
    assert all(lk.bps == G100 and lk.latency_ns == 800 for lk in ls.links())


def test_leafspine_paths() -> None:
    ls = LeafSpine(24, 6, 5, link_bps=G100, latency_ns=800, uplinks_per_spine=2)
    assert ls.shortest_paths(0, 5) == [[0, ls.leaf(0), 5]]
    paths = ls.shortest_paths(0, 23)
    assert paths == [[0, ls.leaf(0), ls.spine(j), ls.leaf(3), 23] for j in range(5)]
    assert ls.hops(0, 23) == 3 and ls.route_count(0, 23) == 5 * 4


def test_leafspine_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="multiple of hosts_per_leaf"):
        LeafSpine(10, 4, 2, link_bps=G100, latency_ns=1)
    with pytest.raises(ValueError, match="positive"):
        LeafSpine(8, 4, 0, link_bps=G100, latency_ns=1)
