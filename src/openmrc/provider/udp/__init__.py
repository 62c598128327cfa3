"""A software MRC NIC over UDP: N ports (planes), one UDP socket per port, the same `transport.Nic` inside.

Theory of operation
-------------------
A `UdpDevice` drives one sans-IO `Nic` by the driver contract of `openmrc.provider`. Port ``p`` is a UDP
socket bound to its own endpoint (an IPv4 or IPv6 address and the UDP port MRC listens on, 4791 by
default): on one machine e.g. ``127.0.0.1``, ``127.0.0.2`` ... or one UDP port per plane on ``::1``; on
real hosts one interface address per plane. A `Peer` names the remote device's endpoint on every port;
packets of plane ``p`` go from the local port ``p`` to the peer's port ``p``.

*Wire image.* Every packet leaves as the MRC UDP payload (BTH through ICRC) with the real RoCEv2 ICRC for
its addressing (source and destination address and UDP ports, `openmrc.wire.seal_parts`); the payload is
handed to the kernel as a view of the registered memory (scatter/gather ``sendmsg``), never copied. On
receipt the ICRC is checked against the addresses the socket reports (`Nic.receive_datagram`); a mismatch
is dropped and counted (``nic.stats.rx_bad_icrc``). Packets are sent ECN-capable (ECT(0)); the CE mark and
the DSCP arrive with every datagram (``IP_RECVTOS`` / ``IPV6_RECVTCLASS``).

*Entropy values on the wire.* The EV a packet takes is the source of its addressing, by the QP's EV profile:

* UDP mode: the EV is the UDP source port. A socket sends from one port only, so the device keeps one
  sending socket per (plane, source port), bound when a QP is connected (`UdpDevice.connect` says at
  once when a port cannot be bound). Its default EV profile draws source ports from the dynamic range
  49152-65535.
* STEV: the source port as above, and the high 16 bits of the EV in the IPv6 flow label (the destination
  address in ``sendmsg`` carries it, with ``IPV6_FLOWINFO_SEND`` on and the kernel's automatic flow labels
  off). IPv4 ports cannot carry it: connecting such a QP fails with a reason.
* SRv6: the datagram is sent to the EV's uSID address; the fabric shifts it hop by hop and the last hop
  delivers it to the peer's port address. **[openmrc]** Plain UDP, not IPv6-in-IPv6: an unprivileged
  socket can send it and the receiver needs no decapsulation. The kernel would compute the UDP checksum
  over the first (uSID) address and the receiver check it over the final one, so SRv6 sockets send with
  a zero checksum (``UDP_NO_CHECK6_TX``) and every IPv6 port accepts zero checksums
  (``UDP_NO_CHECK6_RX``); end-to-end integrity is the ICRC's job, computed over the final address
  (RFC 6935/6936 allow zero-checksum UDP over IPv6 where the payload is protected otherwise). A raw socket
  would keep the checksum but needs root. EVs with an SRH segment need a raw socket and are refused.

*Trimming and ECN in tests.* A fabric that trims marks the packet with a DSCP; **[openmrc]** DSCP 0x05
(trimmed) and 0x06 (trimmed at the last hop), configurable. The in-process fault injector (`impair`, per
port: drop, duplicate, reorder, trim, ECN-mark, corrupt, blackhole an EV or a whole port for a time) uses
the same marks, so tests and demos need no root.

*Progress.* Manual by default (as libfabric's ``FI_PROGRESS_MANUAL``): `progress` runs one round (receive
every queued datagram, run due timers, send what pacing allows) and optionally waits for the next event;
`poll_cq` progresses before it polls. `start` runs the rounds in a background thread instead.
`completion_fd` becomes readable when a CQ of the device holds completions (for ``select`` or asyncio's
``add_reader``; `wait_completions` does that). `close` stops the thread, moves every QP to ERROR (pending
work requests complete with ``WR_FLUSH_ERR``) and closes every socket and descriptor.

*Fast path.* Socket buffers as large as the host allows (``SO_RCVBUFFORCE`` as root), receives into one
preallocated buffer, UDP GRO on receive (a burst of datagrams from one source arrives as one) and UDP GSO
on send when consecutive packets share socket, destination and size. Sends are paced to the port rate
(``NicConfig.link_bps`` per port). **[openmrc]** A kernel call costs a software NIC far more than a
packet's worth of work, and packets of different EVs leave from different sockets, so no two of them can
share a call: the device's default configuration (`software_config`, with timers for a user-space
stack's RTT) sprays new data in bursts of `gso_burst` packets per EV (``NicConfig.spray_burst``; 15 at a
4 KiB MTU), which leave as one GSO datagram and arrive as one GRO batch. Every EV of the rotation still
carries its share, retransmissions and probes still take a fresh EV, and ``spray_burst=1`` sprays every
packet on its own EV as a hardware NIC does (one call per packet).
These modules are compiled with the transport core (``make native``).

Everything the device does is counted in `DeviceStats`; the transport's own counters are ``nic.stats``.

Modules: `config` (`software_config`, `gso_burst`, `parse_endpoint`, `format_endpoint`, `Peer`, `DeviceStats`,
the socket options), `sockets` (the port sockets, the SRv6 receive sockets, the epoll object and the sending
sockets), `receive` (datagrams and their ancillary data to the NIC, ports drained in turns), `send` (routes,
GSO runs, pacing), `injector` (the fault injector and its delayed datagrams), `progress` (the progress
thread, waits and the completion eventfd), `device` (`UdpDevice`, which composes them).
"""

from openmrc.provider.udp.config import (
    CE,
    DEFAULT_TIMEOUT,
    ECT0,
    IPV6_AUTOFLOWLABEL,
    IPV6_FLOWINFO,
    IPV6_FLOWINFO_SEND,
    SO_RCVBUFFORCE,
    SO_RXQ_OVFL,
    SO_SNDBUFFORCE,
    SO_TIMESTAMPNS,
    SOFTWARE_MIN_ACK_TIMEOUT_NS,
    SOFTWARE_PEER_ACK_DELAY_NS,
    SOL_UDP,
    TRIM_DSCP,
    TRIM_LASTHOP_DSCP,
    UDP_GRO,
    UDP_NO_CHECK6_RX,
    UDP_NO_CHECK6_TX,
    UDP_SEGMENT,
    DeviceStats,
    Endpoint,
    Peer,
    format_endpoint,
    gso_burst,
    parse_endpoint,
    software_config,
)
from openmrc.provider.udp.device import UdpDevice

__all__ = [
    "CE",
    "DEFAULT_TIMEOUT",
    "ECT0",
    "IPV6_AUTOFLOWLABEL",
    "IPV6_FLOWINFO",
    "IPV6_FLOWINFO_SEND",
    "SOFTWARE_MIN_ACK_TIMEOUT_NS",
    "SOFTWARE_PEER_ACK_DELAY_NS",
    "SOL_UDP",
    "SO_RCVBUFFORCE",
    "SO_RXQ_OVFL",
    "SO_SNDBUFFORCE",
    "SO_TIMESTAMPNS",
    "TRIM_DSCP",
    "TRIM_LASTHOP_DSCP",
    "UDP_GRO",
    "UDP_NO_CHECK6_RX",
    "UDP_NO_CHECK6_TX",
    "UDP_SEGMENT",
    "DeviceStats",
    "Endpoint",
    "Peer",
    "UdpDevice",
    "format_endpoint",
    "gso_burst",
    "parse_endpoint",
    "software_config",
]
