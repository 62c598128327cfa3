"""The UDP device's configuration and records: its default transport settings (`software_config`), endpoints
(`parse_endpoint`, `Peer`), counters (`DeviceStats`) and the Linux socket options and marks it uses."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Final

from openmrc.transport.config import NicConfig
from openmrc.wire import MRC_UDP_PORT

# Linux socket options the socket module does not name
SO_SNDBUFFORCE: Final = 32
SO_RCVBUFFORCE: Final = 33
IPV6_FLOWINFO: Final = 11
IPV6_FLOWINFO_SEND: Final = 33
IPV6_AUTOFLOWLABEL: Final = 70
UDP_NO_CHECK6_TX: Final = 101
UDP_NO_CHECK6_RX: Final = 102
UDP_SEGMENT: Final = 103
UDP_GRO: Final = 104
SOL_UDP: Final = 17
SO_TIMESTAMPNS: Final = 35  # SCM_TIMESTAMPNS: the kernel's receive time, a struct timespec (realtime)
SO_RXQ_OVFL: Final = 40  # datagrams the kernel dropped from this socket's full buffer so far (uint32)

ECT0: Final = 0x02
CE: Final = 0x03
TRIM_DSCP: Final = 0x05
TRIM_LASTHOP_DSCP: Final = 0x06
GSO_MAX_BYTES: Final = 65000  # one UDP datagram before segmentation (IP length limit, headers aside)
GSO_MAX_SEGS: Final = 64
_MRC_OVERHEAD: Final = 64  # MRC headers and ICRC of a data packet (at most), past its payload

Endpoint = tuple[str, int]


def gso_burst(mtu: int) -> int:
    """How many ``mtu``-byte MRC packets fit in one UDP segmentation-offload datagram: the
    `NicConfig.spray_burst` that lets a software NIC send a burst on one EV with one system call."""
    return max(1, min(GSO_MAX_SEGS, GSO_MAX_BYTES // (mtu + _MRC_OVERHEAD)))


SOFTWARE_MIN_ACK_TIMEOUT_NS: Final = 1024 << 13
"""The floor of a software NIC's retransmission timeout (8.39 ms: ``timeout`` 13)."""
SOFTWARE_PEER_ACK_DELAY_NS: Final = 4_000_000
"""How long a software peer may hold an acknowledgement while its process is descheduled (4 ms; more when
the peer reports longer service times: `NicConfig.peer_ack_delay_ns`)."""
DEFAULT_TIMEOUT: Final = 14
"""`UdpDevice.connect`'s ACK timeout exponent: 16.8 ms, and with the default retries (7 linear, 7
exponential) a peer that answers nothing fails the QP with RETRY_EXC_ERR after 4.4 s."""


def software_config(link_gbps: float = 25.0, *, mtu: int = 4096) -> NicConfig:
    """Transport settings for a software NIC (the device's default): ``link_gbps`` per port; timers for the
    RTT of a user-space stack (a base RTT of 200 µs, SACKs coalesced over 32 packets or 20 µs, none sent
    at once for a packet that opens or fills a hole: `NicConfig.sack_on_reorder`), a
    reordering allowance of 128 packets (sockets are drained in turns, so sprayed packets arrive less in
    order than through a NIC's ring), spray bursts of `gso_burst` packets and EVs from the dynamic UDP port
    range. A process is descheduled for milliseconds, so a packet thought lost holds its EV until the loss
    is judged (it is mostly late: `NicConfig.late_host`), the retransmission timeout is at least
    ``SOFTWARE_MIN_ACK_TIMEOUT_NS`` (8.39 ms, the QP attribute ``timeout`` 13, whatever lower value a QP
    asks for), SACKs report the service time (`NicConfig.report_service_time`: how long this host held
    the packet that triggered them, from the kernel's receive timestamp) and a tail loss probe allows the
    peer ``SOFTWARE_PEER_ACK_DELAY_NS`` (4 ms) of such delay, and a path that stays down is probed at least
    every 20 ms once its probes go unanswered (a failed path comes back within that, a dead one costs 50
    probes a second)."""
    return NicConfig(
        mtu=mtu,
        link_bps=int(link_gbps * 1e9),
        base_rtt_ns=200_000,
        sack_delay_ns=20_000,
        sack_every=32,
        reorder_allowance=128,
        default_ev_sports=(0xC000, 0x10000),
        spray_burst=gso_burst(mtu),
        max_send_wr=8192,
        max_recv_wr=8192,
        min_ack_timeout_ns=SOFTWARE_MIN_ACK_TIMEOUT_NS,
        probe_backoff_max_ns=20_000_000,
        late_host=True,
        sack_on_reorder=False,
        report_service_time=True,
        peer_ack_delay_ns=SOFTWARE_PEER_ACK_DELAY_NS,
    )


def parse_endpoint(text: str | Endpoint, default_port: int = MRC_UDP_PORT) -> Endpoint:
    """``"10.0.0.1"``, ``"10.0.0.1:4791"``, ``"::1"``, ``"[::1]:4791"`` or ``(ip, port)`` as ``(ip, port)``;
    raises `ValueError` naming what is wrong."""
    if isinstance(text, tuple):
        ip, port = text
    else:
        s = text.strip()
        port = default_port
        if s.startswith("["):
            ip, _, rest = s[1:].partition("]")
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(f"endpoint {text!r}: expected [address]:port")
                port = _port_number(rest[1:], text)
        elif s.count(":") == 1:
            ip, _, p = s.partition(":")
            port = _port_number(p, text)
        else:
            ip = s
    try:
        ip = str(ipaddress.ip_address(ip))
    except ValueError:
        raise ValueError(f"endpoint {text!r}: {ip!r} is not an IPv4 or IPv6 address") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 0xFFFF:
        raise ValueError(f"endpoint {text!r}: UDP port {port!r} outside 1..65535")
    return ip, port


def _port_number(p: str, text: object) -> int:
    try:
        return int(p)
    except ValueError:
        raise ValueError(f"endpoint {text!r}: UDP port {p!r} is not a number") from None


def format_endpoint(ep: Endpoint) -> str:
    """``ip:port``, with the IPv6 address in brackets."""
    ip, port = ep
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


@dataclass(frozen=True, slots=True)
class Peer:
    """A remote device: its endpoint (address, UDP port) on every port (plane), port 1 first."""

    endpoints: tuple[Endpoint, ...]

    @classmethod
    def of(cls, endpoints: Iterable[str | Endpoint], dport: int = MRC_UDP_PORT) -> Peer:
        eps = tuple(parse_endpoint(e, dport) for e in endpoints)
        if not eps:
            raise ValueError("a peer needs at least one endpoint")
        return cls(eps)

    def endpoint(self, port: int) -> Endpoint:
        return self.endpoints[port - 1]

    def __str__(self) -> str:
        return " ".join(f"[{ip}]:{p}" if ":" in ip else f"{ip}:{p}" for ip, p in self.endpoints)


@dataclass(slots=True)
class DeviceStats:
    """What the device did with datagrams (the transport's own counters are ``nic.stats``).

    ``rx_truncated``: datagrams larger than the receive buffer (dropped); ``tx_errors``: sends the kernel
    refused (socket buffer full, no route ...; the packet is lost and the transport recovers it);
    ``tx_unbound``: packets whose source port had no socket (sent from the port's own socket instead, so
    the peer echoes a different EV); ``fault_*``: what the fault injector did."""

    rx_datagrams: int = 0
    rx_gro_batches: int = 0
    rx_truncated: int = 0
    rx_errors: int = 0
    rx_overflow: int = 0
    """Datagrams the kernel dropped because a port's socket buffer was full (``SO_RXQ_OVFL``): real losses
    in this host, which the transport recovers like any other."""
    rx_delay_max_ns: int = 0
    """The longest a datagram waited in a socket buffer before the device read it (kernel receive
    timestamp to read): how late this host was."""
    tx_datagrams: int = 0
    tx_gso_batches: int = 0
    tx_errors: int = 0
    tx_unbound: int = 0
    tx_bytes: int = 0
    rounds: int = 0
    fault_dropped: int = 0
    fault_duplicated: int = 0
    fault_trimmed: int = 0
    fault_corrupted: int = 0
    fault_ecn: int = 0
    fault_delayed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
