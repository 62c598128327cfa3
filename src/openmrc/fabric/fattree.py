"""Single-plane fat trees (three or two tiers) and leaf/spine fabrics, wired exactly as htsim wires them.

Theory of operation
-------------------
htsim's ``FatTreeTopology`` (uet-htsim ``datacenter/fat_tree_topology.cpp``) builds a folded Clos from a few
numbers; this module reproduces its wiring, switch numbering and port order so that results can be compared
switch for switch. Notation: N hosts, P hosts per pod, ``rd[k]``/``ru[k]`` the down/up radix of tier k
(0 ToR, 1 Agg, 2 core), ``b[k]`` the bundle (parallel links) on tier k's downlinks, ``s[k]`` their speed,
``o[k]`` the oversubscription.

- Host h hangs off ToR ``h // rd[0]`` and lives in pod ``h // P`` (pod 0 for two tiers).
- ToRs per pod ``T = P / rd[0]``; ToR uplinks ``U = N·s[0] / (s[1]·o[0])``; Aggs per pod
  ``A = U / (pods·rd[1])``, which must equal ``ru[0] / b[1]``. Each ToR links (``b[1]`` times) to every Agg
  of its pod; with two tiers there is one pod, so every leaf links to every spine.
- Three tiers: Agg uplinks ``V = U·s[1] / (s[2]·o[1])``, cores ``C = V / rd[2]`` with
  ``C·b[2] / A = ru[1]``; the Agg at pod position q links (``b[2]`` times) to cores ``q + A·l`` for
  ``l < ru[1] / b[2]``, so core c serves position ``c mod A`` in every pod.
- ``FatTree.from_k(K)`` is htsim's default (no ``-topo``) K-ary tree: K³/4 hosts, K²/2 ToRs and Aggs, K²/4
  cores, K pods. ``FatTree.from_topo_file`` reads htsim's ``.topo`` format and applies the same consistency
  rules, reporting the offending line and keyword instead of exiting.

Numbering. Hosts are ``0 .. N-1`` (the data model puts hosts first), then ToRs (``Role.T0``), Aggs
(``Role.T1``) and cores (``Role.T2``), each in htsim's order, so htsim's switch i of a tier is node
``tor(i)``/``agg(i)``/``core(i)`` = a fixed offset + i. Links are created in htsim's order (host links per
ToR, then ToR–Agg per ToR per Agg per bundle member, then Agg–core per Agg per l per bundle member), which
makes our port numbers equal to htsim's ``addPort`` order: on every switch the downlinks come first, then the
uplinks. Concretely (A Aggs per pod, T ToRs per pod, pod p, position q):

- host: port 0 → its ToR;
- ToR: ports ``0 .. rd[0]-1`` → its hosts in id order; ``rd[0] + j·b[1] + m`` → Agg j of its pod, member m;
- Agg: port ``i·b[1] + m`` → ToR i of its pod; port ``T·b[1] + l·b[2] + m`` → core ``q + A·l``, member m;
- core: port ``p·b[2] + m`` → the Agg at position ``c mod A`` of pod p, member m.

Every ``Link`` is stored lower tier first (``a`` is the host/ToR/Agg, ``b`` the switch above). Link speed and
propagation delay are those of the upper tier's downlinks (htsim uses ``s[k]`` and ``Downlink_Latency_ns`` of
tier k for the links below tier k in both directions). ``Switch_Latency_ns`` is not a link; it is kept per
tier in ``switch_latency_ns``.

Equal-cost paths are computed arithmetically: one path under a shared ToR, one per Agg inside a pod, one per
(Agg, core) pair across pods. Paths are node lists; a bundle multiplies the link-level choices without adding
node paths (``route_count`` gives htsim's per-bundle-member route count).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from openmrc.fabric.topology import MaterializedTopology, Role

__all__ = ["FatTree", "FatTreeSpec", "FoldedClos", "LeafSpine", "TierSpec", "parse_topo"]

GBPS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One ``Tier k`` section of an htsim ``.topo`` file (k = 0 ToR, 1 Agg, 2 core)."""

    downlink_bps: int
    """Speed of this tier's downlinks (tier 0: the host links), bits/s (``Downlink_speed_Gbps`` × 1e9)."""
    radix_down: int
    """Downward ports per switch (``Radix_Down``)."""
    radix_up: int
    """Upward ports per switch (``Radix_Up``); 0 on the top tier."""
    downlink_latency_ns: int
    """One-way propagation delay of this tier's downlinks (``Downlink_Latency_ns``)."""
    switch_latency_ns: int = 0
    """Traversal latency of a switch of this tier (``Switch_Latency_ns``); not a link."""
    oversubscribed: int = 1
    """Oversubscription ratio (``Oversubscribed``); on tier 0 it must equal radix_down // radix_up."""
    bundle: int = 1
    """Parallel links per switch pair on this tier's downlinks (``Bundle``); 1 on tier 0."""
    queue_up_bytes: int | None = None
    """``Queue_Up`` if given (htsim_uec overrides queue sizes; kept for round trips only)."""
    queue_down_bytes: int | None = None
    """``Queue_Down`` if given (kept for round trips only)."""


@dataclass(frozen=True, slots=True)
class FatTreeSpec:
    """The header and tier sections of an htsim ``.topo`` file."""

    nodes: int
    """Number of hosts (``Nodes``)."""
    podsize: int
    """Hosts per pod (``Podsize``); equals ``nodes`` for two tiers."""
    tiers: tuple[TierSpec, ...]
    """One entry per tier, ToR first; two or three entries (``Tiers``)."""

    def to_topo_text(self) -> str:
        """The spec as ``.topo`` text that `parse_topo` reads back to an equal spec."""
        out = [f"Nodes {self.nodes}", f"Tiers {len(self.tiers)}", f"Podsize {self.podsize}"]
        for k, t in enumerate(self.tiers):
            if t.downlink_bps % GBPS:
                raise ValueError(f"Tier {k}: downlink_bps {t.downlink_bps} is not a whole number of Gbps")
            out += [
                "",
                f"Tier {k}",
                f"Downlink_speed_Gbps {t.downlink_bps // GBPS}",
                f"Radix_Down {t.radix_down}",
            ]
            if k < len(self.tiers) - 1:
                out.append(f"Radix_Up {t.radix_up}")
            out += [
                f"Oversubscribed {t.oversubscribed}",
                f"Bundle {t.bundle}",
                f"Downlink_Latency_ns {t.downlink_latency_ns}",
                f"Switch_Latency_ns {t.switch_latency_ns}",
            ]
            if t.queue_up_bytes is not None:
                out.append(f"Queue_Up {t.queue_up_bytes}")
            if t.queue_down_bytes is not None:
                out.append(f"Queue_Down {t.queue_down_bytes}")
        return "\n".join(out) + "\n"


class _SpecError(ValueError):
    """An inconsistent spec, blaming one field of one tier (tier None: a header field)."""

    def __init__(self, tier: int | None, field: str, message: str) -> None:
        where = field if tier is None else f"Tier {tier} {field}"
        super().__init__(f"{where}: {message}")
        self.tier = tier
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class _Shape:
    """Derived counts of a spec (htsim's NTOR/NAGG/NCORE and friends)."""

    pods: int
    tors_per_pod: int
    aggs_per_pod: int
    cores_per_agg: int


def _derive(spec: FatTreeSpec) -> _Shape:
    """Apply htsim's consistency rules (``set_custom_params``) and derive the switch counts."""
    tiers = spec.tiers
    nt = len(tiers)
    if nt not in (2, 3):
        raise _SpecError(None, "Tiers", f"must be 2 or 3, not {nt}")
    if spec.nodes < 1:
        raise _SpecError(None, "Nodes", f"must be positive, not {spec.nodes}")
    if spec.podsize < 1:
        raise _SpecError(None, "Podsize", f"must be positive, not {spec.podsize}")
    for k, t in enumerate(tiers):
        for field, value in (
            ("Downlink_speed_Gbps", t.downlink_bps),
            ("Radix_Down", t.radix_down),
            ("Downlink_Latency_ns", t.downlink_latency_ns),
            ("Oversubscribed", t.oversubscribed),
            ("Bundle", t.bundle),
        ):
            if value < 1:
                raise _SpecError(k, field, f"must be positive, not {value}")
        if t.switch_latency_ns < 0:
            raise _SpecError(k, "Switch_Latency_ns", f"must not be negative, not {t.switch_latency_ns}")
        if k < nt - 1 and t.radix_up < 1:
            raise _SpecError(k, "Radix_Up", f"must be positive, not {t.radix_up}")
        if k == nt - 1 and t.radix_up != 0:
            raise _SpecError(k, "Radix_Up", "not allowed on the top tier (it has no uplinks)")
        if t.radix_down % t.bundle:
            raise _SpecError(k, "Radix_Down", f"{t.radix_down} is not a multiple of Bundle {t.bundle}")
        if k < nt - 1 and t.radix_up % tiers[k + 1].bundle:
            raise _SpecError(
                k, "Radix_Up", f"{t.radix_up} is not a multiple of Tier {k + 1} Bundle {tiers[k + 1].bundle}"
            )
    t0, t1 = tiers[0], tiers[1]
    n, p = spec.nodes, spec.podsize
    if n % p:
        raise _SpecError(None, "Podsize", f"Nodes {n} is not a multiple of Podsize {p}")
    if nt == 2 and p != n:
        raise _SpecError(None, "Podsize", f"must equal Nodes ({n}) in a 2-tier topology, not {p}")
    pods = n // p
    if t0.bundle != 1:
        raise _SpecError(0, "Bundle", f"must be 1 on tier 0 (host links), not {t0.bundle}")
    if p % t0.radix_down:
        raise _SpecError(None, "Podsize", f"{p} is not a multiple of Tier 0 Radix_Down {t0.radix_down}")
    tors_per_pod = p // t0.radix_down
    # htsim compares with integer division here; so do we, to accept exactly what it accepts.
    if t0.radix_down // t0.radix_up != t0.oversubscribed:
        raise _SpecError(
            0,
            "Oversubscribed",
            f"{t0.oversubscribed} does not match Radix_Down // Radix_Up = {t0.radix_down} // {t0.radix_up}",
        )
    if (n * t0.downlink_bps) % (t1.downlink_bps * t0.oversubscribed):
        raise _SpecError(
            0, "Oversubscribed", "Nodes × tier 0 speed is not divisible by tier 1 speed × oversub"
        )
    tor_uplinks = n * t0.downlink_bps // (t1.downlink_bps * t0.oversubscribed)
    if tor_uplinks % (pods * t1.radix_down):
        raise _SpecError(
            1,
            "Radix_Down",
            f"{tor_uplinks} ToR uplinks do not split evenly over {pods} pods × {t1.radix_down}",
        )
    aggs_per_pod = tor_uplinks // (pods * t1.radix_down)
    if aggs_per_pod * t1.bundle != t0.radix_up:
        hint = ""
        if aggs_per_pod and t0.radix_up % aggs_per_pod == 0:
            hint = f" (Tier 1 Bundle {t0.radix_up // aggs_per_pod} would fit)"
        raise _SpecError(
            0,
            "Radix_Up",
            f"{t0.radix_up} does not equal {aggs_per_pod} Aggs per pod × Tier 1 Bundle {t1.bundle}{hint}",
        )
    cores_per_agg = 0
    if nt == 3:
        t2 = tiers[2]
        if (tor_uplinks * t1.downlink_bps) % (t2.downlink_bps * t1.oversubscribed):
            raise _SpecError(
                1, "Oversubscribed", "ToR uplinks × tier 1 speed not divisible by tier 2 speed × oversub"
            )
        agg_uplinks = tor_uplinks * t1.downlink_bps // (t2.downlink_bps * t1.oversubscribed)
        if agg_uplinks % t2.radix_down:
            raise _SpecError(
                2, "Radix_Down", f"{agg_uplinks} Agg uplinks are not a multiple of {t2.radix_down}"
            )
        cores = agg_uplinks // t2.radix_down
        if cores % aggs_per_pod:
            raise _SpecError(
                2,
                "Radix_Down",
                f"{cores} core switches are not a multiple of {aggs_per_pod} Agg switches per pod",
            )
        cores_per_agg = cores // aggs_per_pod
        if cores_per_agg * t2.bundle != t1.radix_up:
            hint = ""
            if cores_per_agg and t1.radix_up % cores_per_agg == 0:
                hint = f" (Tier 2 Bundle {t1.radix_up // cores_per_agg} would fit)"
            raise _SpecError(
                1,
                "Radix_Up",
                f"{t1.radix_up} does not equal {cores} cores / {aggs_per_pod} Aggs per pod × Tier 2 Bundle "
                f"{t2.bundle}{hint}",
            )
    return _Shape(pods, tors_per_pod, aggs_per_pod, cores_per_agg)


# .topo keyword (lower case) -> (display name, TierSpec field, scale)
_TIER_KEYS: dict[str, tuple[str, str, int]] = {
    "downlink_speed_gbps": ("Downlink_speed_Gbps", "downlink_bps", GBPS),
    "radix_down": ("Radix_Down", "radix_down", 1),
    "radix_up": ("Radix_Up", "radix_up", 1),
    "oversubscribed": ("Oversubscribed", "oversubscribed", 1),
    "bundle": ("Bundle", "bundle", 1),
    "downlink_latency_ns": ("Downlink_Latency_ns", "downlink_latency_ns", 1),
    "switch_latency_ns": ("Switch_Latency_ns", "switch_latency_ns", 1),
    "queue_up": ("Queue_Up", "queue_up_bytes", 1),
    "queue_down": ("Queue_Down", "queue_down_bytes", 1),
}
_HEADER_KEYS = {"nodes": "Nodes", "tiers": "Tiers", "podsize": "Podsize"}
_UINT = re.compile(r"[0-9]+")


def parse_topo(text: str, *, source: str = "<topo>") -> FatTreeSpec:
    """Parse htsim ``.topo`` text; a bad file raises ``ValueError("source:line: field: reason")``."""
    header: dict[str, int] = {}
    header_line: dict[str, int] = {}
    sections: dict[int, dict[str, int]] = {}
    field_line: dict[tuple[int | None, str], int] = {}
    current: int | None = None
    lineno = 0

    def fail(line: int, message: str) -> ValueError:
        return ValueError(f"{source}:{line}: {message}")

    def header_done(line: int) -> int:
        for key in ("Nodes", "Tiers", "Podsize"):
            if key not in header:
                raise fail(line, f"{key}: missing from the header (before the first Tier section)")
        return header["Tiers"]

    for lineno, raw in enumerate(text.splitlines(), start=1):
        tokens = raw.split("#", 1)[0].split()
        if not tokens:
            continue
        key = tokens[0].lower()
        if key in _HEADER_KEYS:
            name = _HEADER_KEYS[key]
        elif key in _TIER_KEYS:
            name = _TIER_KEYS[key][0]
        elif key == "tier":
            name = "Tier"
        else:
            allowed = ", ".join(["Nodes", "Tiers", "Podsize", "Tier"] + [v[0] for v in _TIER_KEYS.values()])
            raise fail(lineno, f"unknown keyword {tokens[0]!r} (allowed: {allowed})")
        if len(tokens) != 2 or not _UINT.fullmatch(tokens[1]):
            raise fail(lineno, f"{name}: expected '{name} <non-negative integer>', got {raw.strip()!r}")
        value = int(tokens[1])
        if key in _HEADER_KEYS:
            if current is not None:
                raise fail(lineno, f"{name}: header keyword inside a Tier section")
            if name in header:
                raise fail(lineno, f"{name}: duplicate (first set on line {header_line[name]})")
            if name == "Tiers" and value not in (2, 3):
                raise fail(lineno, f"Tiers: must be 2 or 3, not {value}")
            header[name], header_line[name] = value, lineno
            field_line[(None, name)] = lineno
        elif key == "tier":
            tiers = header_done(lineno)
            if value >= tiers:
                raise fail(lineno, f"Tier: {value} out of range for a {tiers}-tier topology (0..{tiers - 1})")
            if value in sections:
                raise fail(
                    lineno, f"Tier {value}: section repeated (first on line {field_line[(value, 'Tier')]})"
                )
            current = value
            sections[value] = {}
            field_line[(value, "Tier")] = lineno
        else:
            if current is None:
                raise fail(lineno, f"{name}: appears before any Tier section")
            display, field, scale = _TIER_KEYS[key]
            if field in sections[current]:
                raise fail(
                    lineno,
                    f"Tier {current} {display}: duplicate (first on line {field_line[(current, display)]})",
                )
            if current == header["Tiers"] - 1 and field in ("radix_up", "queue_up_bytes"):
                raise fail(
                    lineno, f"Tier {current} {display}: not allowed on the top tier (it has no uplinks)"
                )
            sections[current][field] = value * scale
            field_line[(current, display)] = lineno
    end = max(lineno, 1)
    tiers = header_done(end)
    specs: list[TierSpec] = []
    for k in range(tiers):
        if k not in sections:
            raise fail(end, f"Tier {k}: section missing")
        fields = sections[k]
        required = ["downlink_bps", "radix_down", "downlink_latency_ns"] + (
            ["radix_up"] if k < tiers - 1 else []
        )
        for field in required:
            if field not in fields:
                display = next(v[0] for v in _TIER_KEYS.values() if v[1] == field)
                raise fail(field_line[(k, "Tier")], f"Tier {k} {display}: missing from the section")
        fields.setdefault("radix_up", 0)
        specs.append(TierSpec(**fields))
    spec = FatTreeSpec(nodes=header["Nodes"], podsize=header["Podsize"], tiers=tuple(specs))
    try:
        _derive(spec)
    except _SpecError as e:
        line = field_line.get((e.tier, e.field))
        if line is None:  # a defaulted field (Bundle, Oversubscribed): blame its section
            line = field_line.get((e.tier, "Tier"), end)
        raise fail(line, str(e)) from None
    return spec


class FoldedClos(MaterializedTopology):
    """Common base of `FatTree` and `LeafSpine`: htsim-order wiring, numbering and path arithmetic.

    Built from the derived shape (see the module docstring). Attributes: ``tiers`` (2 or 3); the counts
    ``num_tors``, ``num_aggs``, ``num_cores``, ``num_pods``, ``hosts_per_tor``, ``hosts_per_pod``,
    ``tors_per_pod``, ``aggs_per_pod``, ``cores_per_agg`` (distinct cores per Agg, htsim's
    ``Radix_Up1 / Bundle2``; 0 with two tiers); and per-tier tuples indexed by tier (0 = ToR/leaf,
    1 = Agg/spine, 2 = core) describing that tier's downlinks: ``bundles``, ``link_bps``,
    ``link_latency_ns``, plus ``switch_latency_ns`` (switch traversal time, not a link).
    """

    _tier_names: ClassVar[tuple[str, ...]] = ("tor", "agg", "core")

    def __init__(
        self,
        *,
        name: str,
        hosts_per_tor: int,
        tors_per_pod: int,
        pods: int,
        aggs_per_pod: int,
        cores_per_agg: int,
        bundles: Sequence[int],
        link_bps: Sequence[int],
        link_latency_ns: Sequence[int],
        switch_latency_ns: Sequence[int],
    ) -> None:
        tiers = len(link_bps)
        if tiers not in (2, 3):
            raise ValueError(f"a folded Clos has 2 or 3 tiers, not {tiers}")
        for what, seq in (("bundles", bundles), ("link_latency_ns", link_latency_ns)):
            if len(seq) != tiers:
                raise ValueError(f"{what} has {len(seq)} entries for {tiers} tiers")
        if len(switch_latency_ns) != tiers:
            raise ValueError(f"switch_latency_ns has {len(switch_latency_ns)} entries for {tiers} tiers")
        if min(hosts_per_tor, tors_per_pod, pods, aggs_per_pod, *bundles, *link_bps) < 1:
            raise ValueError("counts, bundles and speeds must be positive")
        if min(*link_latency_ns, *switch_latency_ns) < 0:
            raise ValueError("latencies must not be negative")
        if bundles[0] != 1:
            raise ValueError("host links cannot be bundled (bundles[0] must be 1)")
        if tiers == 2 and (pods != 1 or cores_per_agg != 0):
            raise ValueError("a 2-tier fabric has one pod and no cores")
        if tiers == 3 and cores_per_agg < 1:
            raise ValueError("a 3-tier fabric needs cores_per_agg >= 1")
        num_hosts = hosts_per_tor * tors_per_pod * pods
        super().__init__(name, 1, num_hosts)
        self.tiers = tiers
        self.hosts_per_tor = hosts_per_tor
        self.tors_per_pod = tors_per_pod
        self.aggs_per_pod = aggs_per_pod
        self.cores_per_agg = cores_per_agg
        self.num_pods = pods
        self.hosts_per_pod = hosts_per_tor * tors_per_pod
        self.num_tors = tors_per_pod * pods
        self.num_aggs = aggs_per_pod * pods
        self.num_cores = aggs_per_pod * cores_per_agg
        self.bundles: tuple[int, ...] = tuple(bundles)
        self.link_bps: tuple[int, ...] = tuple(link_bps)
        self.link_latency_ns: tuple[int, ...] = tuple(link_latency_ns)
        self.switch_latency_ns: tuple[int, ...] = tuple(switch_latency_ns)
        self._base = (0, num_hosts, num_hosts + self.num_tors, num_hosts + self.num_tors + self.num_aggs)
        counts = (self.num_tors, self.num_aggs, self.num_cores)
        for k, role in enumerate((Role.T0, Role.T1, Role.T2)[:tiers]):
            for i in range(counts[k]):
                self.add_switch(role, 0, f"{self._tier_names[k]}{i}")
        self._wire()

    def _wire(self) -> None:
        """Create every link in htsim's construction order (this fixes the port numbers)."""
        hpt, a_pp, b1 = self.hosts_per_tor, self.aggs_per_pod, self.bundles[1]
        for t in range(self.num_tors):
            for h in range(t * hpt, (t + 1) * hpt):
                self.connect(h, self.tor(t), self.link_bps[0], self.link_latency_ns[0])
        for t in range(self.num_tors):
            pod = t // self.tors_per_pod
            for j in range(pod * a_pp, (pod + 1) * a_pp):
                for _ in range(b1):
                    self.connect(self.tor(t), self.agg(j), self.link_bps[1], self.link_latency_ns[1])
        if self.tiers == 3:
            b2 = self.bundles[2]
            for j in range(self.num_aggs):
                q = j % a_pp
                for up in range(self.cores_per_agg):
                    for _ in range(b2):
                        self.connect(
                            self.agg(j), self.core(q + a_pp * up), self.link_bps[2], self.link_latency_ns[2]
                        )

    # --- numbering ---

    def tor(self, i: int) -> int:
        """Node id of htsim's ToR (leaf) switch i."""
        if not 0 <= i < self.num_tors:
            raise IndexError(f"ToR {i} out of range 0..{self.num_tors - 1}")
        return self._base[1] + i

    def agg(self, i: int) -> int:
        """Node id of htsim's Agg (spine) switch i."""
        if not 0 <= i < self.num_aggs:
            raise IndexError(f"Agg {i} out of range 0..{self.num_aggs - 1}")
        return self._base[2] + i

    def core(self, i: int) -> int:
        """Node id of htsim's core switch i."""
        if not 0 <= i < self.num_cores:
            raise IndexError(f"core {i} out of range 0..{self.num_cores - 1}")
        return self._base[3] + i

    def htsim_id(self, node: int) -> int:
        """Inverse of `tor`/`agg`/`core`: the index of ``node`` within its tier (a host's own id)."""
        return node - self._base[self.role(node)]

    def host_tor(self, h: int) -> int:
        """Node id of the ToR host ``h`` hangs off."""
        self._check_host(h)
        return self._base[1] + h // self.hosts_per_tor

    def pod_of(self, h: int) -> int:
        """The pod of host ``h`` (always 0 with two tiers, as in htsim)."""
        self._check_host(h)
        return h // self.hosts_per_pod

    def _check_host(self, h: int) -> None:
        if not 0 <= h < self.num_hosts:
            raise ValueError(f"{h} is not a host (0..{self.num_hosts - 1})")

    def port_to(self, node: int, peer: int, member: int = 0) -> int:
        """The port of ``node`` leading to the adjacent ``peer`` (bundle member ``member``), by arithmetic."""
        role, prole = self.role(node), self.role(peer)
        i, j = self.htsim_id(node), self.htsim_id(peer)
        hpt, tpp, a_pp = self.hosts_per_tor, self.tors_per_pod, self.aggs_per_pod
        b1 = self.bundles[1]
        b2 = self.bundles[2] if self.tiers == 3 else 1
        bundle = {
            (Role.T0, Role.T1): b1,
            (Role.T1, Role.T0): b1,
            (Role.T1, Role.T2): b2,
            (Role.T2, Role.T1): b2,
        }
        if not 0 <= member < bundle.get((role, prole), 1):
            raise ValueError(f"no bundle member {member} between {node} and {peer}")
        port: int | None = None
        if role == Role.HOST and prole == Role.T0 and j == i // hpt:
            port = 0
        elif role == Role.T0 and prole == Role.HOST and j // hpt == i:
            port = j - i * hpt
        elif role == Role.T0 and prole == Role.T1 and j // a_pp == i // tpp:
            port = hpt + (j % a_pp) * b1 + member
        elif role == Role.T1 and prole == Role.T0 and j // tpp == i // a_pp:
            port = (j % tpp) * b1 + member
        elif role == Role.T1 and prole == Role.T2 and j % a_pp == i % a_pp:
            port = tpp * b1 + (j // a_pp) * b2 + member
        elif role == Role.T2 and prole == Role.T1 and j % a_pp == i % a_pp:
            port = (j // a_pp) * b2 + member
        if port is None:
            raise ValueError(f"{self.node_name(node)} and {self.node_name(peer)} are not adjacent")
        return port

    # --- paths ---

    def shortest_paths(self, src: int, dst: int) -> list[list[int]]:
        """All equal-cost node paths from host ``src`` to host ``dst``, in htsim's route order."""
        self._check_host(src)
        self._check_host(dst)
        if src == dst:
            return [[src]]
        tor_s, tor_d = self.host_tor(src), self.host_tor(dst)
        if tor_s == tor_d:
            return [[src, tor_s, dst]]
        a_pp = self.aggs_per_pod
        ps, pd = self.pod_of(src), self.pod_of(dst)
        agg0 = self._base[2]
        if ps == pd:
            return [[src, tor_s, agg0 + ps * a_pp + q, tor_d, dst] for q in range(a_pp)]
        core0 = self._base[3]
        return [
            [src, tor_s, agg0 + ps * a_pp + q, core0 + q + a_pp * up, agg0 + pd * a_pp + q, tor_d, dst]
            for q in range(a_pp)
            for up in range(self.cores_per_agg)
        ]

    def hops(self, src: int, dst: int) -> int:
        """Switches traversed on a shortest path between hosts: 0 (same host), 1, 3 or 5."""
        self._check_host(src)
        self._check_host(dst)
        if src == dst:
            return 0
        if src // self.hosts_per_tor == dst // self.hosts_per_tor:
            return 1
        return 3 if src // self.hosts_per_pod == dst // self.hosts_per_pod else 5

    def route_count(self, src: int, dst: int) -> int:
        """Link-level routes htsim enumerates (``get_bidir_paths``): node paths × bundle member choices."""
        n = len(self.shortest_paths(src, dst))
        h = self.hops(src, dst)
        if h >= 3:
            n *= self.bundles[1] ** 2
        if h == 5:
            n *= self.bundles[2] ** 2
        return n


class FatTree(FoldedClos):
    """A single-plane fat tree wired as htsim's ``FatTreeTopology`` (3 tiers, or 2 from a 2-tier ``.topo``).

    ``spec`` keeps the htsim parameters it was built from.
    """

    def __init__(self, spec: FatTreeSpec, *, name: str | None = None) -> None:
        shape = _derive(spec)
        t = spec.tiers
        self.spec = spec
        super().__init__(
            name=name or f"fattree-{len(t)}t-{spec.nodes}",
            hosts_per_tor=t[0].radix_down,
            tors_per_pod=shape.tors_per_pod,
            pods=shape.pods,
            aggs_per_pod=shape.aggs_per_pod,
            cores_per_agg=shape.cores_per_agg,
            bundles=[x.bundle for x in t],
            link_bps=[x.downlink_bps for x in t],
            link_latency_ns=[x.downlink_latency_ns for x in t],
            switch_latency_ns=[x.switch_latency_ns for x in t],
        )

    @classmethod
    def from_k(
        cls,
        k: int,
        *,
        tiers: int = 3,
        link_bps: int = 100 * GBPS,
        latency_ns: int = 1000,
        switch_latency_ns: int = 0,
    ) -> FatTree:
        """htsim's default K-ary tree (no ``-topo``): 3 tiers → K³/4 hosts; 2 tiers (``-tiers 2``) → K²/2."""
        if k < 2 or k % 2:
            raise ValueError(f"K must be even and >= 2, not {k}")
        if tiers not in (2, 3):
            raise ValueError(f"tiers must be 2 or 3, not {tiers}")
        half = k // 2

        def tier(down: int, up: int) -> TierSpec:
            return TierSpec(link_bps, down, up, latency_ns, switch_latency_ns)

        if tiers == 3:
            nodes = k**3 // 4
            spec = FatTreeSpec(nodes, nodes // k, (tier(half, half), tier(half, half), tier(k, 0)))
        else:
            # htsim stores Radix_Down1 = K/2 here but wires each spine to all K leaves; we state the wiring.
            nodes = k * k // 2
            spec = FatTreeSpec(nodes, nodes, (tier(half, half), tier(k, 0)))
        return cls(spec, name=f"fattree-k{k}" if tiers == 3 else f"fattree-2t-k{k}")

    @classmethod
    def from_topo_text(cls, text: str, *, source: str = "<topo>", name: str | None = None) -> FatTree:
        """Build from htsim ``.topo`` text (see `parse_topo`)."""
        return cls(parse_topo(text, source=source), name=name)

    @classmethod
    def from_topo_file(cls, path: str | os.PathLike[str]) -> FatTree:
        """Build from an htsim ``.topo`` file; errors name the file, line and keyword."""
        p = Path(path)
        return cls.from_topo_text(p.read_text(encoding="utf-8"), source=str(p), name=p.stem)


class LeafSpine(FoldedClos):
    """A two-tier single-plane leaf/spine: every leaf links ``uplinks_per_spine`` times to every spine.

    Same numbering, port order and paths as a 2-tier `FatTree` (leaves are ``Role.T0``, spines ``Role.T1``),
    without htsim's radix/oversubscription rules, so any leaf fan-out is allowed.
    """

    _tier_names: ClassVar[tuple[str, ...]] = ("leaf", "spine")

    def __init__(
        self,
        hosts: int,
        hosts_per_leaf: int,
        spines: int,
        *,
        link_bps: int,
        latency_ns: int,
        uplinks_per_spine: int = 1,
        switch_latency_ns: int = 0,
        name: str | None = None,
    ) -> None:
        if hosts < 1 or hosts_per_leaf < 1 or hosts % hosts_per_leaf:
            raise ValueError(
                f"hosts ({hosts}) must be a positive multiple of hosts_per_leaf ({hosts_per_leaf})"
            )
        self.uplinks_per_spine = uplinks_per_spine
        super().__init__(
            name=name or f"leafspine-{hosts}",
            hosts_per_tor=hosts_per_leaf,
            tors_per_pod=hosts // hosts_per_leaf,
            pods=1,
            aggs_per_pod=spines,
            cores_per_agg=0,
            bundles=[1, uplinks_per_spine],
            link_bps=[link_bps, link_bps],
            link_latency_ns=[latency_ns, latency_ns],
            switch_latency_ns=[switch_latency_ns, switch_latency_ns],
        )

    @property
    def num_leaves(self) -> int:
        return self.num_tors

    @property
    def num_spines(self) -> int:
        return self.num_aggs

    def leaf(self, i: int) -> int:
        """Node id of leaf i (= `tor`)."""
        return self.tor(i)

    def spine(self, i: int) -> int:
        """Node id of spine i (= `agg`)."""
        return self.agg(i)
