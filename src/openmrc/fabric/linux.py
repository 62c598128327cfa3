"""A multi-plane Clos and its SRv6 uSID plan as Linux configuration: one shell script per switch and per host,
the cabling, and every host's addresses, so that Linux routers (or network namespaces) built from the export
alone forward every path the plan names.

Theory of operation
-------------------
*Cabling.* Port ``k`` of a node is the interface ``eth<k>`` (`MultiPlaneClos.ports`: a host's port ``p``
is its plane ``p``; a T0's ports are its hosts, then its uplinks; a T1's port ``i`` is T0 ``i`` of its
plane). Every link is a point-to-point segment whose lower end (the host, or the T0 of an uplink) holds
the link-local address ``fe80::1`` and whose upper end holds ``fe80::2``, so each route names its next hop
without neighbour state from elsewhere.

*Host addresses.* Host ``h``'s port on plane ``p`` has a unique address ``<prefix>:p:i::k+1`` (prefix a
/32, ``i`` its T0 within the plane, ``k`` its port on that T0): per plane a /48, per T0 a /64. They are
the sources of every packet and the destinations of plain IPv6 traffic. The switches route them as a
normal two-tier fabric: a T0 has a /128 per host and the plane's /48 over all its uplinks (ECMP, hashed
on the IPv6 flow label only, ``fib_multipath_hash_policy=3``, ``fib_multipath_hash_fields=0x0008``); a T1
has a /64 per T0. That is the ECMP fabric in which STEV flow labels pick the spine, and, in an SRv6
fabric, the way back to any sender and the path of out-of-band traffic.

*SRv6 (uSID).* Each switch's own /48 (locator + uSID) is a ``seg6local End`` route with the NEXT-CSID
flavour (``lblen 32 nflen 16``), installed on a dummy device (or one end of a veth pair where the kernel
has no dummy driver): on ``lo`` the kernel treats it as a reject route. Every other uSID of the switch's
static table is a /48 ``via`` the neighbour's link-local address (with ``dev`` alone the kernel would
look for the shifted address itself as an on-link neighbour). After
the last switch's shift a packet's destination is ``<locator>:<host-port uSID>::``: the host owns that
address on the port. Host-port uSIDs repeat under every T0 (they are local functions), so these addresses
are unique only within a T0; sources therefore stay the unique host addresses. A host routes the uSID
space of each plane (the locator and the plane's top bits of the first uSID) out of that plane's port.

*Checksums.* UDP over IPv6 carries a checksum over the destination address, and a uSID destination
changes at every hop: RFC 9800 §6.5 has the sender compute it over the final address (the one the host
owns). A normal socket computes it over the address it sends to, and the receiver drops the datagram
(``Udp6InCsumErrors``). openmrc's UDP device sends SRv6 datagrams with a zero checksum instead
(``UDP_NO_CHECK6_TX``, accepted by sockets that set ``UDP_NO_CHECK6_RX``), the ICRC covering the final
address; `openmrc.wire.usid_final_address` computes that address for any uSID destination.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.fabric.srv6 import UsidPlan
from openmrc.fabric.topology import Role

__all__ = ["DEFAULT_HOST_PREFIX", "HostPort", "LinuxFabric", "load_export"]

DEFAULT_HOST_PREFIX: Final = 0xFD006D72  # fd00:6d72::/32 ("mr"), a unique-local prefix
LOWER_LL: Final = "fe80::1"
UPPER_LL: Final = "fe80::2"
USID_DEV: Final = "usid0"
_END: Final = "encap seg6local action End flavors next-csid lblen 32 nflen 16"
_SYSCTLS_COMMON: Final = (
    "net.ipv6.conf.all.keep_addr_on_down=1",
    "net.ipv6.conf.default.keep_addr_on_down=1",
    "net.ipv6.conf.all.ignore_routes_with_linkdown=1",
    "net.ipv6.conf.default.ignore_routes_with_linkdown=1",
    "net.ipv6.conf.all.accept_dad=0",
    "net.ipv6.conf.default.accept_dad=0",
)
_SYSCTLS_SWITCH: Final = (
    "net.ipv6.conf.all.forwarding=1",
    "net.ipv6.fib_multipath_hash_policy=3",
    "net.ipv6.fib_multipath_hash_fields=0x0008",
    "net.ipv6.conf.all.seg6_enabled=1",
    "net.ipv6.conf.default.seg6_enabled=1",
)


@dataclass(frozen=True, slots=True)
class HostPort:
    """One host port as the export describes it."""

    host: int
    plane: int
    ifname: str
    address: str
    usid_address: str
    t0: str


class LinuxFabric:
    """Scripts, cabling and addresses of `plan`'s fabric on Linux. ``srv6=False`` exports the plain ECMP
    fabric only (no seg6local, no uSID addresses)."""

    def __init__(
        self, plan: UsidPlan, *, host_prefix: int = DEFAULT_HOST_PREFIX, srv6: bool = True, mtu: int = 9000
    ) -> None:
        if not 0 < host_prefix < 1 << 32:
            raise ValueError(f"LinuxFabric.host_prefix: 0x{host_prefix:x} is not a non-zero 32-bit value")
        if host_prefix == plan.locator:
            raise ValueError("LinuxFabric.host_prefix: must differ from the SRv6 locator")
        self.plan = plan
        self.topo: MultiPlaneClos = plan.topo
        if not 1280 <= mtu <= 65535:
            raise ValueError(f"LinuxFabric.mtu: {mtu} outside 1280..65535 (IPv6 needs 1280)")
        self.host_prefix = host_prefix
        self.srv6 = srv6
        self.mtu = mtu
        self._hp = f"{host_prefix >> 16:x}:{host_prefix & 0xFFFF:x}"

    # -- names and addresses -------------------------------------------------------------------------------
    @staticmethod
    def ifname(port: int) -> str:
        return f"eth{port}"

    def is_lower(self, node: int, port: int) -> bool:
        """Whether ``node``'s ``port`` is the lower end of its link (``fe80::1``)."""
        t = self.topo
        if node < t.num_hosts:
            return True
        role, _, _ = t.switch_info(node)
        return role is Role.T0 and port >= t.hosts_per_t0

    def link_local(self, node: int, port: int) -> str:
        return LOWER_LL if self.is_lower(node, port) else UPPER_LL

    def peer_link_local(self, node: int, port: int) -> str:
        return UPPER_LL if self.is_lower(node, port) else LOWER_LL

    def host_address(self, host: int, plane: int) -> str:
        t = self.topo
        a = f"{self._hp}:{plane:x}:{t.host_t0_index(host):x}::{host % t.hosts_per_t0 + 1:x}"
        return str(ipaddress.IPv6Address(a))

    def plane_prefix(self, plane: int) -> str:
        return f"{self._hp}:{plane:x}::/48"

    def t0_subnet(self, plane: int, index: int) -> str:
        return f"{self._hp}:{plane:x}:{index:x}::/64"

    def usid_address(self, host: int, plane: int) -> str:
        """The address a uSID path to ``host`` on ``plane`` ends as (owned by that host port)."""
        return str(ipaddress.IPv6Address(self.plan.address_int([self.plan.host_usid(host, plane)])))

    def usid_plane_prefix(self, plane: int) -> str:
        """Every uSID destination of ``plane``: the locator and the plane's top bits of the first uSID."""
        p = self.plan
        bits = p.plane_bits
        first = (plane << (16 - bits)) if bits else 0
        return str(ipaddress.IPv6Network(((p.locator << 96) | (first << 80), 32 + bits)))

    def host_ports(self, host: int) -> list[HostPort]:
        t = self.topo
        return [
            HostPort(
                host,
                p,
                self.ifname(p),
                self.host_address(host, p),
                self.usid_address(host, p),
                t.node_name(t.host_t0(host, p)),
            )
            for p in range(t.planes)
        ]

    # -- scripts -------------------------------------------------------------------------------------------
    def _header(self, node: int, what: str, sysctls: Iterable[str]) -> list[str]:
        lines = [
            "#!/bin/sh",
            f"# {self.topo.node_name(node)}: {what}",
            "# Written by `openmrc topo plan`; run as root on the node once its ports (eth<k>) are cabled as",
            "# links.json says. Static: nothing here changes at run time.",
            "set -e",
        ]
        lines += [f"sysctl -qw {s}" for s in sysctls]
        return lines

    def _ports(self, node: int) -> list[str]:
        lines = []
        for pr in self.topo.ports(node):
            dev = self.ifname(pr.port)
            lines.append(f"ip link set {dev} mtu {self.mtu} up")
            lines.append(f"ip -6 addr add {self.link_local(node, pr.port)}/64 dev {dev} nodad")
        return lines

    def switch_script(self, switch: int) -> str:
        """One switch's configuration: forwarding, its ports, its static uSID table and the host routes."""
        t, plan = self.topo, self.plan
        role, plane, index = t.switch_info(switch)
        own = plan.switch_usid(switch)
        what = f"{role.name} {index} of plane {plane}" + (
            f", uSID 0x{own:04x} ({plan.prefix_str(own)})" if self.srv6 else ""
        )
        lines = self._header(switch, what, _SYSCTLS_COMMON + _SYSCTLS_SWITCH)
        lines += self._ports(switch)
        if self.srv6:
            lines.append(
                "# the End route's device; a veth pair (one end unused) where there is no dummy driver"
            )
            lines.append(
                f"ip link add {USID_DEV} type dummy 2>/dev/null || "
                f"ip link add {USID_DEV} type veth peer name {USID_DEV}p"
            )
            lines.append(
                f"ip link set {USID_DEV}p up 2>/dev/null || true  # a veth's carrier needs both ends up"
            )
            lines.append(f"ip link set {USID_DEV} up")
            for r in plan.table(switch):
                pfx = plan.prefix_str(r.usid)
                if r.action == "end":
                    lines.append(f"ip -6 route add {pfx} {_END} dev {USID_DEV}")
                else:
                    via = self.peer_link_local(switch, r.port)
                    lines.append(f"ip -6 route add {pfx} via {via} dev {self.ifname(r.port)}")
        if role is Role.T0:
            hpt = t.hosts_per_t0
            for k in range(min(hpt, t.num_hosts - index * hpt)):
                addr = self.host_address(index * hpt + k, plane)
                lines.append(
                    f"ip -6 route add {addr}/128 via {self.peer_link_local(switch, k)} dev {self.ifname(k)}"
                )
            hops = " ".join(
                f"nexthop via {self.peer_link_local(switch, hpt + j)} dev {self.ifname(hpt + j)}"
                for j in range(t.uplinks)
            )
            lines.append(f"ip -6 route add {self.plane_prefix(plane)} {hops}")
        else:
            for i in range(t.t0_per_plane):
                via = self.peer_link_local(switch, i)
                lines.append(f"ip -6 route add {self.t0_subnet(plane, i)} via {via} dev {self.ifname(i)}")
        return "\n".join(lines) + "\n"

    def host_script(self, host: int) -> str:
        """The configuration of one host: per plane port its addresses and the routes out of that port."""
        lines = self._header(host, f"host {host}, {self.topo.planes} ports (one per plane)", _SYSCTLS_COMMON)
        lines.append("sysctl -qw net.ipv6.conf.all.forwarding=0")
        lines += self._ports(host)
        for hp in self.host_ports(host):
            dev = hp.ifname
            lines.append(f"ip -6 addr add {hp.address}/128 dev {dev} nodad")
            via = self.peer_link_local(host, hp.plane)
            lines.append(f"ip -6 route add {self.plane_prefix(hp.plane)} via {via} dev {dev}")
            if self.srv6:
                lines.append(f"ip -6 addr add {hp.usid_address}/128 dev {dev} nodad")
                lines.append(f"ip -6 route add {self.usid_plane_prefix(hp.plane)} via {via} dev {dev}")
        return "\n".join(lines) + "\n"

    # -- cabling and hosts ---------------------------------------------------------------------------------
    def links(self) -> list[dict[str, Any]]:
        t = self.topo
        out = []
        for ln in t.links():
            out.append(
                {
                    "name": f"{t.node_name(ln.a)}--{t.node_name(ln.b)}",
                    "plane": t.plane(ln.b),
                    "a": t.node_name(ln.a),
                    "a_dev": self.ifname(ln.a_port),
                    "b": t.node_name(ln.b),
                    "b_dev": self.ifname(ln.b_port),
                    "gbps": ln.bps / 1e9,
                }
            )
        return out

    def hosts(self) -> list[dict[str, Any]]:
        t = self.topo
        return [
            {
                "name": t.node_name(h),
                "index": h,
                "ports": [
                    {
                        "plane": hp.plane,
                        "dev": hp.ifname,
                        "address": hp.address,
                        "t0": hp.t0,
                        **({"usid_address": hp.usid_address} if self.srv6 else {}),
                    }
                    for hp in self.host_ports(h)
                ],
            }
            for h in range(t.num_hosts)
        ]

    def params(self) -> dict[str, Any]:
        """What `load_export` needs to rebuild this object."""
        t = self.topo
        return {
            "planes": t.planes,
            "hosts": t.num_hosts,
            "t0_radix": t.t0_radix,
            "t1_radix": t.t1_radix,
            "link_gbps": t.link_bps / 1e9,
            "latency_ns": t.link_latency_ns,
            "oversubscription": t.oversubscription,
            "locator": f"{self.plan.locator:08x}",
            "host_prefix": f"{self.host_prefix:08x}",
            "srv6": self.srv6,
            "mtu": self.mtu,
        }

    def write(
        self, out: Path, switches: Iterable[int] | None = None, hosts: Iterable[int] | None = None
    ) -> int:
        """Write ``linux/<node>.sh`` for ``switches`` and ``hosts`` (default: all), ``links.json``,
        ``hosts.json`` and ``fabric.json`` under ``out``; returns the number of scripts."""
        t = self.topo
        lin = out / "linux"
        lin.mkdir(parents=True, exist_ok=True)
        n = 0
        for s in range(t.num_hosts, t.num_nodes()) if switches is None else switches:
            (lin / f"{t.node_name(s)}.sh").write_text(self.switch_script(s))
            n += 1
        for h in range(t.num_hosts) if hosts is None else hosts:
            (lin / f"{t.node_name(h)}.sh").write_text(self.host_script(h))
            n += 1
        (out / "links.json").write_text(json.dumps(self.links(), indent=1) + "\n")
        (out / "hosts.json").write_text(json.dumps(self.hosts(), indent=1) + "\n")
        (out / "fabric.json").write_text(json.dumps(self.params(), indent=2) + "\n")
        return n


def load_export(directory: str | Path) -> LinuxFabric:
    """The `LinuxFabric` an export directory (``fabric.json``) was written from; ValueError naming the file
    and the field when it cannot be read."""
    path = Path(directory) / "fabric.json"
    try:
        d = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    try:
        topo = MultiPlaneClos(
            int(d["planes"]),
            int(d["hosts"]),
            int(d["t0_radix"]),
            int(d["t1_radix"]),
            int(float(d["link_gbps"]) * 1e9),
            int(d["latency_ns"]),
            int(d["oversubscription"]),
        )
        plan = UsidPlan(topo, int(str(d["locator"]), 16))
        return LinuxFabric(
            plan,
            host_prefix=int(str(d["host_prefix"]), 16),
            srv6=bool(d["srv6"]),
            mtu=int(d.get("mtu", 9000)),
        )
    except KeyError as exc:
        raise ValueError(f"{path}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
