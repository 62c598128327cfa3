"""SRv6 micro-segment (uSID) address plan and static switch tables for multi-plane Clos fabrics.

Theory of operation (MRC-SPEC-NOTES §6; RFC 9800 NEXT-CSID flavour)
-------------------------------------------------------------------
A destination address is a 32-bit *locator* followed by a list of 16-bit uSIDs, one per hop still to
come. The sender writes the whole path:

    src T0 uSID · T1 uSID (the uplink choice) · dst T0 uSID · dst host-port uSID        (3 switch hops)
    src T0 uSID · dst host-port uSID                                                    (same T0)

Each switch owns one uSID. When the active uSID (the one right after the locator) is its own, it shifts
the uSID list left by 16 bits (End with NEXT-CSID) and forwards on the static route of the new active uSID:
a T0 has a route per T1 of its plane and per host port below it, a T1 one per T0 of its plane. Tables are
installed once and never change: BGP, ECMP and adaptive routing stay off; the sender alone picks the
path, per packet, through the EV. A failed link is not routed around by the fabric: MRC stops using the
EVs that cross it.

uSID layout ``[plane | kind | index]``: the plane in the top bits (so every uSID of a path carries its
plane, as the EV→address mapping requires), a 2-bit kind (1 = T0, 2 = T1, 3 = host port), and the index
in the rest (T0 and T1: within the plane; host port: within its T0). uSID 0 never occurs (it ends a
uSID list).
"""

from __future__ import annotations

import ipaddress
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from openmrc.ev import EVENT_MASK_ALLOWED, EVField, EVFormatMode, EVFormatProfile, EVProfile, EVProfileMode
from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.ecmp import fmix32, mul32
from openmrc.fabric.topology import Role

__all__ = ["SRV6_EV_MODE", "Route", "UsidPlan", "ev_min_active"]

KIND_T0, KIND_T1, KIND_HOST = 1, 2, 3
_KIND_T0: Final = 1
_KIND_T1: Final = 2
_KIND_HOST: Final = 3
_USIDS: Final = (1 << 96) - 1
"""The uSID list of an address (below its locator)."""
_ABOVE_USIDS: Final = ~_USIDS
_FMT: Final = EVFormatProfile(EVFormatMode.SRV6, (32, 16, 16, 16, 16))
SRV6_EV_MODE: Final = _FMT.mode
_EXPANDED: Final = struct.Struct(">I4H20x")
_COMPACT: Final = struct.Struct(">4H")
"""An expanded SRv6 EV from its locator and four uSIDs: the destination address, then no SRH segment."""
"""The EV format mode of `UsidPlan.ev_profile`'s profiles."""


def ev_min_active(count: int) -> int:
    """The floor of usable EVs of a `UsidPlan.ev_profile` of ``count`` EVs."""
    return max(1, count // 8)


@dataclass(frozen=True, slots=True)
class Route:
    """One static route of a switch: a /48 prefix (locator + uSID) and what to do with it."""

    usid: int
    action: str  # "end" (own uSID: shift, look up again) or "forward"
    port: int  # egress port for "forward", -1 for "end"
    next_hop: int  # node id behind the port, -1 for "end"


class UsidPlan:
    """The uSID of every switch and host port of a `MultiPlaneClos`, addresses, tables and EV profiles."""

    def __init__(self, topo: MultiPlaneClos, locator: int = 0xFC000000) -> None:
        if not 0 < locator < 1 << 32:
            raise ValueError(f"UsidPlan.locator: 0x{locator:x} is not a non-zero 32-bit value")
        self.topo = topo
        self.locator = locator
        self.plane_bits = max(topo.planes - 1, 0).bit_length()
        self.index_bits = 16 - 2 - self.plane_bits
        self._owns: list[int] = []
        """Each switch's own uSID by its id less the hosts' count (`forward`)."""
        biggest = max(topo.t0_per_plane, topo.t1_per_plane, topo.hosts_per_t0)
        if biggest > 1 << self.index_bits:
            raise ValueError(
                f"UsidPlan: {biggest} switches or host ports per plane do not fit the {self.index_bits}-bit "
                f"uSID index left by {topo.planes} planes"
            )

    # -- uSIDs -----------------------------------------------------------------------------------------------
    def _usid(self, plane: int, kind: int, index: int) -> int:
        return (
            (plane << (16 - self.plane_bits)) | (kind << self.index_bits) | index
            if self.plane_bits
            else ((kind << self.index_bits) | index)
        )

    def switch_usid(self, node: int) -> int:
        role, plane, index = self.topo.switch_info(node)
        return self._usid(plane, KIND_T0 if role is Role.T0 else KIND_T1, index)

    def host_usid(self, host: int, plane: int) -> int:
        """The uSID of ``host``'s port on ``plane`` (unique within its T0, like a local function)."""
        return self._usid(plane, KIND_HOST, host % self.topo.hosts_per_t0)

    def decode(self, usid: int) -> tuple[int, int, int]:
        """(plane, kind, index) of a uSID."""
        plane = usid >> (16 - self.plane_bits) if self.plane_bits else 0
        return plane, (usid >> self.index_bits) & 3, usid & ((1 << self.index_bits) - 1)

    # -- addresses -------------------------------------------------------------------------------------------
    def path_usids(self, src: int, dst: int, plane: int, uplink: int) -> list[int]:
        t = self.topo
        if not 0 <= plane < t.planes:
            raise ValueError(f"plane {plane} outside 0..{t.planes - 1}")
        if not 0 <= uplink < t.uplinks:
            raise ValueError(f"uplink {uplink} outside 0..{t.uplinks - 1}")
        a, b = t.host_t0(src, plane), t.host_t0(dst, plane)
        if a == b:
            return [self.switch_usid(a), self.host_usid(dst, plane)]
        return [
            self.switch_usid(a),
            self._usid(plane, KIND_T1, uplink),
            self.switch_usid(b),
            self.host_usid(dst, plane),
        ]

    def address_int(self, usids: list[int]) -> int:
        addr = self.locator
        for u in usids:
            addr = (addr << 16) | u
        return addr << (16 * (6 - len(usids)))

    def path_address(self, src: int, dst: int, plane: int, uplink: int) -> ipaddress.IPv6Address:
        """The uSID destination address steering a packet from ``src`` to ``dst`` via ``plane``/``uplink``."""
        return ipaddress.IPv6Address(self.address_int(self.path_usids(src, dst, plane, uplink)))

    def prefix(self, usid: int) -> ipaddress.IPv6Network:
        return ipaddress.IPv6Network(((self.locator << 96) | (usid << 80), 48))

    def prefix_str(self, usid: int) -> str:
        """`prefix` as text, fast (the trailing zero groups are the longest run, so '::' goes there)."""
        return f"{self.locator >> 16:x}:{self.locator & 0xFFFF:x}:{usid:x}::/48"

    # -- static tables ---------------------------------------------------------------------------------------
    def table(self, switch: int) -> list[Route]:
        """The static /48 table of one switch (its own uSID first)."""
        t = self.topo
        role, plane, index = t.switch_info(switch)
        routes = [Route(self.switch_usid(switch), "end", -1, -1)]
        if role is Role.T0:
            hpt = t.hosts_per_t0
            first = index * hpt
            for k in range(min(hpt, t.num_hosts - first)):
                routes.append(Route(self._usid(plane, KIND_HOST, k), "forward", k, first + k))
            for j in range(t.uplinks):
                routes.append(Route(self._usid(plane, KIND_T1, j), "forward", hpt + j, t.t1(plane, j)))
        else:
            for i in range(t.t0_per_plane):
                routes.append(Route(self._usid(plane, KIND_T0, i), "forward", i, t.t0(plane, i)))
        return routes

    def forward(self, switch: int, addr: int) -> tuple[int, int]:
        """What the data plane does: (egress port, rewritten address) for a packet to ``addr``.

        Raises ValueError when the address does not match the switch's table (a mis-routed packet)."""
        if addr >> 96 != self.locator:
            raise ValueError(f"address 0x{addr:032x} is outside locator 0x{self.locator:08x}")
        own = self.own_usid(switch)
        active = (addr >> 80) & 0xFFFF
        if active == own:
            addr = (addr & _ABOVE_USIDS) | ((addr << 16) & _USIDS)  # NEXT-CSID shift
            active = (addr >> 80) & 0xFFFF
        return self.route(switch, own, active), addr

    def own_usid(self, switch: int) -> int:
        """`switch_usid`, made once for every switch (this runs at every hop of every packet); raises
        ValueError when ``switch`` is not a switch."""
        t = self.topo
        owns = self._owns
        if not owns:
            owns = self._owns = [self.switch_usid(s) for s in range(t.num_hosts, t.num_nodes())]
        k = switch - t.num_hosts
        if not 0 <= k < len(owns):
            t.switch_info(switch)  # raises: not a switch
        return owns[k]

    def route(self, switch: int, own: int, active: int) -> int:
        """The egress port of ``switch`` (whose uSID is ``own``) for the ``active`` uSID of an address it
        has already shifted past its own (`forward`'s table look-up); ValueError when none matches."""
        t = self.topo
        ib = self.index_bits
        if (active ^ own) >> (ib + 2):  # the plane bits (above kind and index) differ
            p, plane = self.decode(active)[0], self.decode(own)[0]
            raise ValueError(
                f"uSID 0x{active:04x} is on plane {p}, switch {t.node_name(switch)} on plane {plane}"
            )
        kind = (active >> ib) & 3
        i = active & ((1 << ib) - 1)
        if (own >> ib) & 3 == _KIND_T0:
            hpt = t.hosts_per_t0
            if kind == _KIND_HOST and (own & ((1 << ib) - 1)) * hpt + i < t.num_hosts and i < hpt:
                return i
            if kind == _KIND_T1 and i < t.uplinks:
                return hpt + i
        elif kind == _KIND_T0 and i < t.t0_per_plane:
            return i
        raise ValueError(f"no route for uSID 0x{active:04x} on {t.node_name(switch)}")

    # -- export ----------------------------------------------------------------------------------------------
    def table_json(self, switch: int) -> dict[str, Any]:
        t = self.topo
        own = self.switch_usid(switch)
        pfx = self.prefix_str
        return {
            "switch": t.node_name(switch),
            "usid": f"0x{own:04x}",
            "prefix": pfx(own),
            "routes": [
                {"prefix": pfx(r.usid), "port": r.port, "next_hop": t.node_name(r.next_hop)}
                for r in self.table(switch)
                if r.action == "forward"
            ],
        }

    def write_tables(self, path: str, switches: Iterator[int] | None = None) -> int:
        """Write every switch's table as JSON lines (one switch per line); returns the route count."""
        t = self.topo
        n = 0
        with open(path, "w") as f:
            for s in switches if switches is not None else range(t.num_hosts, t.num_nodes()):
                obj = self.table_json(s)
                n += len(obj["routes"]) + 1
                f.write(json.dumps(obj, separators=(",", ":")))
                f.write("\n")
        return n

    # -- EV profiles ----------------------------------------------------------------------------------------
    def ev_profile(self, src: int, dst: int, count: int | None = None) -> tuple[EVProfile, list[int]]:
        """An explicit SRv6 EV profile from ``src`` to ``dst``: ``count`` paths (default every plane ×
        uplink combination) spread equally over the planes, and the NIC port (plane + 1) of each EV.

        When a pair uses fewer paths than a plane has uplinks, its uplinks are evenly spaced from an
        offset that depends on the pair, so that different pairs use different T1s and the whole fabric
        carries traffic (one fixed set would load a few T1s and leave the rest idle)."""
        evs, ports = self._paths(src, dst, count, None)
        fields = (EVField(32, init_val=self.locator), *(EVField(16, mask=0xFFFF) for _ in range(4)))
        prof = EVProfile(
            EVProfileMode.EXP,
            _FMT,
            fields,
            ev_count=len(ports),
            ev_min_active=ev_min_active(len(ports)),
            event_mask=int(EVENT_MASK_ALLOWED),  # the simulator's EV timeline reads these events
            evs=tuple(evs),
        )
        return prof, ports

    def ev_expanded(self, src: int, dst: int, count: int | None = None) -> list[tuple[bytes, int]]:
        """`ev_profile`'s EVs as that profile expands them (32 bytes: the uSID destination address, no
        SRH segment), each with its port: what a simulated fabric's hosts install, without validating
        and expanding a profile per host pair in the interpreter (mode `SRV6_EV_MODE`, floor
        `ev_min_active`)."""
        return list(zip(*self.ev_columns(src, dst, count), strict=True))

    def ev_columns(self, src: int, dst: int, count: int | None = None) -> tuple[list[bytes], list[int]]:
        """`ev_expanded` as two columns, the EVs and their ports (what `ProfileTable.add_expanded_columns`
        takes: a large fabric sets up a profile per host pair, and rows would be a tuple per EV)."""
        return self._paths(src, dst, count, self.locator)

    def _paths(
        self, src: int, dst: int, count: int | None, locator: int | None
    ) -> tuple[list[bytes], list[int]]:
        """`ev_profile`'s EVs, compact (four uSIDs: ``locator`` None) or expanded behind ``locator``, and
        the port of each."""
        t = self.topo
        per_plane = 1 if t.hops(src, dst) == 1 else t.uplinks
        total = t.planes * per_plane
        count = total if count is None else count
        if not 1 <= count <= total:
            raise ValueError(f"count {count} outside 1..{total} paths between host{src} and host{dst}")
        evs: list[bytes] = []
        ports: list[int] = []
        per = -(-count // t.planes)  # EVs per plane
        stride = per_plane // per if per_plane > 1 else 1
        offset = (
            fmix32((mul32(src & 0xFFFFFFFF, 0x9E3779B1) + dst) & 0xFFFFFFFF) % stride
            if per < per_plane
            else 0
        )
        # `path_usids` in arithmetic: T0, T1, T0, host port (under one T0: T0, host port, 0, 0); each
        # uSID the path has carries the plane in its top bits
        ib = self.index_bits
        a, b = src // t.hosts_per_t0, dst // t.hosts_per_t0
        port = dst % t.hosts_per_t0
        if a == b:
            f0, f1, f2, f3 = KIND_T0 << ib | a, KIND_HOST << ib | port, 0, 0
        else:
            f0, f1, f2, f3 = KIND_T0 << ib | a, KIND_T1 << ib, KIND_T0 << ib | b, KIND_HOST << ib | port
        shift = 16 - self.plane_bits
        compact, expanded = _COMPACT.pack, _EXPANDED.pack
        for i in range(count):
            plane = i % t.planes
            bits = plane << shift if self.plane_bits else 0
            far = bits if a != b else 0  # (the two uSIDs only a path through a T1 has)
            u1 = f1 | bits
            if per_plane > 1:
                u1 |= offset + (i // t.planes) * per_plane // per
            if locator is None:
                evs.append(compact(f0 | bits, u1, f2 | far, f3 | far))
            else:
                evs.append(expanded(locator, f0 | bits, u1, f2 | far, f3 | far))
            ports.append(plane + 1)
        return evs, ports
