"""Packet captures of a simulation: the packets of chosen flows, fully encoded, in a pcap file.

Theory of operation
-------------------
The simulator carries packets as objects (the transport's `Transmit`, with the fabric's fields); nothing
is encoded on the way. A `SimCapture` sets the ``tap`` of the hosts it watches (`Host.tap`, None
otherwise, so a run without a capture pays one attribute test per packet) and turns each packet the tap
sees into the frame a real NIC would send or receive:

    Ethernet / outer IPv6 [/ SRH] / IPv6 / UDP 4791 / MRC headers, payload, pad / ICRC

* SRv6 EVs (the packet's address carries the fabric's uSID locator): an H.Encaps outer header whose
  destination is the uSID path address as it is at that point (the sender's full path when leaving, the
  address the switches shifted it to when arriving) and an SRH when the EV has a second segment. ECMP
  EVs (UDP source ports) and endpoint packets without a path: the inner IPv6 header alone.
* Inner addresses name a host's NIC port: ``fd00:<port>::<host>`` (port = plane, 1-based).
* The UDP source port and flow label are the EV's entropy (``flow_label << 16 | sport``, what the
  responder echoes); traffic class ECT(0), CE once a switch marked the packet.
* The ICRC is computed over the inner packet (`openmrc.wire.framing.encapsulate`), so a capture checks out
  like one from a wire; a packet a switch trimmed is captured as its headers (with an ICRC over them).
* **[openmrc]** A packet of an authenticated QP (``[fabric] security``) is captured sealed, as it crosses
  the wire: its bytes from BTH through the security trailer (`Transmit.body`), S set in BTH; trimmed, its
  headers and trailer (`openmrc.wire.datagram.trim_datagram`).
* Timestamps are simulated nanoseconds: when the NIC hands the packet to its port (leaving), or when its
  last bit arrives (arriving), as a host-side capture would see them.

Without a capture point every watched packet is written once, as it leaves its sending host (data at the
requester, SACKs/NACKs at the responder). With one (``at=(host, port)``) the capture is that NIC port's
(or every port of the host with ``port=None``) in both directions, like tcpdump on an interface. Flows are
chosen by id; the messages of one host pair share a QP pair, so choosing one of them captures them all.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import BinaryIO, cast

from openmrc.sim.fabric_sim import FabricSim
from openmrc.sim.network import Host
from openmrc.transport import Transmit
from openmrc.wire.constants import MRC_UDP_PORT
from openmrc.wire.datagram import trim_datagram
from openmrc.wire.framing import SRv6Encap, encapsulate
from openmrc.wire.packet import ICRC_SIZE
from openmrc.wire.pcap import PcapWriter

__all__ = ["SimCapture", "host_address", "parse_capture_point", "parse_flow_ids"]

_ECT0, _CE = 2, 3
_NO_ICRC = bytes(ICRC_SIZE)


def host_address(host: int, port: int) -> str:
    """The IPv6 address a capture gives NIC ``port`` (1-based plane) of ``host``."""
    return str(ipaddress.IPv6Address((0xFD00 << 112) | (port << 96) | host))


def parse_flow_ids(text: str) -> list[int]:
    """``"0,5"`` -> [0, 5]. Raises ValueError."""
    ids = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"flow ids are non-negative integers separated by commas, not {text!r}")
        ids.append(int(part))
    return ids


def parse_capture_point(text: str) -> tuple[int, int | None]:
    """``"HOST:PORT"`` -> (host, port) with port 1-based, ``"HOST"`` -> (host, None). Raises ValueError."""
    host, sep, port = text.partition(":")
    if not host.isdigit() or (sep and not port.isdigit()) or (sep and int(port) < 1):
        raise ValueError(f"a capture point is HOST or HOST:PORT (host id, NIC port from 1), not {text!r}")
    return int(host), int(port) if sep else None


class SimCapture:
    """Writes packets of ``sim`` to ``stream`` as a pcap while it runs (attach before `FabricSim.run`).

    ``flows``: flow ids to capture (None: every packet); ``at``: a capture point (host, port or None for
    every port of the host) seeing both directions, instead of each packet once at its sender. Raises
    ValueError for an unknown flow, host or port, or a simulation without MRC hosts."""

    def __init__(
        self,
        sim: FabricSim,
        stream: BinaryIO,
        *,
        flows: Iterable[int] | None = None,
        at: tuple[int, int | None] | None = None,
        udp_port: int = MRC_UDP_PORT,
    ) -> None:
        if sim.config.transport != "mrc":
            raise ValueError("a RoCEv2 simulation has no MRC packets to capture")
        self._sim = sim
        self._udp_port = udp_port
        self._locator = None if sim.plan is None else sim.plan.locator
        self._addresses: dict[tuple[int, int], str] = {}
        self.packets = 0
        """Frames written so far."""
        self._keys: set[tuple[int, int]] | None = None  # (sending host, destination QPN) of the chosen flows
        watched: set[int] = set()
        if flows is not None:
            self._keys = set()
            for fid in flows:
                if not 0 <= fid < len(sim.flows):
                    raise ValueError(f"flow {fid}: this run has flows 0..{len(sim.flows) - 1}")
                f = sim.flows[fid]
                qp = f.qp
                assert qp is not None and qp.attr.dest_qp_num is not None  # an MRC flow's, connected
                self._keys.add((f.src, qp.attr.dest_qp_num))
                self._keys.add((f.dst, qp.qp_num))
                watched.update((f.src, f.dst))
        else:
            watched.update(range(sim.topo.num_hosts))
        self._port: int | None = None
        self._both = at is not None
        if at is not None:
            host, port = at
            if not 0 <= host < sim.topo.num_hosts:
                raise ValueError(f"capture point: host {host} is not one of 0..{sim.topo.num_hosts - 1}")
            planes = len(sim.topo.ports(host))
            if port is not None and not 1 <= port <= planes:
                raise ValueError(f"capture point: host {host} has NIC ports 1..{planes}, not {port}")
            self._port = port
            watched = {host}
        self._writer = PcapWriter(stream)
        for h in sorted(watched):
            node = sim.nodes[h]
            if isinstance(node, Host):
                node.tap = self._tap

    def detach(self) -> None:
        """Stop capturing (the stream stays open: its owner closes it)."""
        for node in self._sim.nodes[: self._sim.topo.num_hosts]:
            if isinstance(node, Host) and node.tap == self._tap:
                node.tap = None

    def _tap(self, host: Host, p: Transmit, outgoing: bool) -> None:
        if not (outgoing or self._both):
            return
        if self._port is not None and p.port != self._port:
            return
        if self._keys is not None and (p.src, p.packet.bth.dest_qp) not in self._keys:
            return
        self._writer.write(self.frame(p, outgoing), host.sim.now)
        self.packets += 1

    def _address(self, host: int, port: int) -> str:
        key = (host, port)
        addr = self._addresses.get(key)
        if addr is None:
            addr = self._addresses[key] = host_address(host, port)
        return addr

    def frame(self, p: Transmit, outgoing: bool) -> bytes:
        """The Ethernet frame of ``p`` as it leaves its sender (``outgoing``) or arrives at its receiver."""
        trimmed = p.trim and not outgoing
        if p.body is not None:  # sealed (an authenticated QP's): BTH through the security trailer
            raw = bytes(p.body) + _NO_ICRC
            if trimmed:  # its headers and trailer
                raw = trim_datagram(raw)
        else:  # what is left of a data packet a switch trimmed: its headers
            pkt = p.packet
            raw = pkt.encode_headers(trimmed=True) + _NO_ICRC if trimmed else pkt.encode()
        src, dst = self._address(p.src, p.port), self._address(cast(int, p.peer), p.port)
        tc = _CE if p.ecn and not outgoing else _ECT0
        sport, label = p.entropy & 0xFFFF, (p.entropy >> 16) & 0xFFFF
        srv6 = None
        if self._locator is not None and p.addr >> 96 == self._locator:
            segs = (str(ipaddress.IPv6Address(p.seg)),) if p.seg else ()
            path = str(ipaddress.IPv6Address(p.addr))
            srv6 = SRv6Encap(src, path, segs, traffic_class=tc, flow_label=label)
        return encapsulate(
            raw,
            src=src,
            dst=dst,
            sport=sport,
            dport=self._udp_port,
            flow_label=label,
            traffic_class=tc,
            srv6=srv6,
            ether=True,
        )
