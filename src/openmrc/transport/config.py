"""Configuration of a transport `Nic` (one dataclass, a docstring per field)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NicConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NicConfig:
    """Knobs of the sans-IO MRC NIC. Times in ns, sizes in bytes, rates in bit/s."""

    mtu: int = 4096
    """Payload bytes per packet (the path MTU of every QP)."""
    link_bps: int = 100_000_000_000
    """Rate of one NIC port (one plane), bit/s. A QP sprays over every port, so the default CC profile
    sizes its window for the NIC's aggregate rate, ``link_bps × num_ports``."""
    base_rtt_ns: int = 10_000
    """Unloaded round-trip time of the longest path; used for congestion-control defaults."""
    trimming: bool = True
    """Whether the fabric trims packets (chooses NSCC defaults)."""
    sack_every: int = 4
    """Coalesce: a SACK at least every this many data packets (and at once on holes, ECN, trims, last
    packets of messages, probes and ACK-requested packets)."""
    sack_on_reorder: bool = True
    """Acknowledge at once a packet that opens or fills a hole (a loss or reordering). A software NIC, which
    reads its planes' sockets in turns and so sees reordering all the time, would send a SACK every few
    packets, each a system call on both sides: it leaves them to the coalescing (`sack_every`,
    `sack_delay_ns`; `openmrc.provider.udp.software_config`)."""
    sack_delay_ns: int = 2_000
    """A pending SACK is sent at the latest this long after the packet that made it pending."""
    reorder_allowance: int = 32
    """A packet is declared lost once more than this many packets sent after it have been acknowledged."""
    reshuffle_rotations: int = 1
    """Re-shuffle a QP's EV rotation after this many complete rotations."""
    spray_burst: int = 1
    """New data packets sent in a row on one EV before the rotation moves on (1: every packet on the next
    EV, as a hardware NIC sprays). A software NIC sends a burst as one segmentation-offload datagram, which
    only works for packets of one UDP source port and destination (`openmrc.provider.udp`).
    Retransmissions and probes always take a fresh EV."""
    active_ev_fraction: float = 0.75
    """Share of a QP's EVs (per plane) in the spraying set; the rest are backups of the same plane."""
    probe_interval_ns: int = 50_000
    """How often an ASSUMED_BAD EV is probed; never more often than its QP's probe timeout
    (about 2 · srtt, at least half the base RTT), so that a probe is not repeated while its answer can
    still come."""
    late_host: bool = False
    """The NIC runs in a process that is descheduled for milliseconds (a software NIC:
    `openmrc.provider.udp.software_config`), so a packet thought lost is often only late: its EV is held out
    of the rotation until the loss is judged, and blamed (ASSUMED_BAD) only once a grace has passed after the
    retransmission was acknowledged with no copy of the original turning up (`openmrc.transport.recovery`).
    Without it (a hardware NIC, the simulator's hosts), the EV is skipped for the rest of the rotation and
    blamed when the retransmission is acknowledged, as MRC's rule has it; a fabric with random loss recovers
    faster so."""
    report_service_time: bool = False
    """Report in every SACK how long its triggering packet had been in this host when the SACK left (SETH
    ``svc``, an ``[openmrc]`` use of a reserved byte: `openmrc.wire.service_time_code`), for a driver that
    knows when a packet arrived and when a SACK leaves (the UDP device, from the kernel's receive
    timestamps). The requester takes it out of the RTT its congestion control sees (MRC: delay = RTT −
    base RTT − service time) and waits for it before a tail loss probe."""
    peer_ack_delay_ns: int = 0
    """The longest the peer is expected to hold an acknowledgement (QUIC's max_ack_delay): a tail loss probe
    waits at least srtt plus this, or plus the longest service time the peer reported in the last second
    if that is longer. A software peer is descheduled for one to four milliseconds at a time on a busy
    host (`openmrc.provider.udp.software_config`: 4 ms); 0 for a hardware NIC or the simulator's hosts."""
    probe_backoff_max_ns: int = 50_000
    """The longest spacing between probes of one ASSUMED_BAD EV: each probe that goes unanswered doubles the
    EV's spacing up to this (the default, ``probe_interval_ns``: no backoff)."""
    silent_probe_interval_ns: int = 10_000_000
    """While a QP's peer answers nothing (no acknowledgement or probe answer for a retransmission timeout and
    at least this long), the QP sends at most one probe this often (10 ms: 100 probe datagrams a second
    towards a dead peer)."""
    min_ack_timeout_ns: int = 0
    """A floor under the retransmission timeout the QP attribute ``timeout`` gives (1.024 µs · 2^timeout): a
    software NIC is descheduled for milliseconds, and a timeout shorter than that fires for nothing
    (`openmrc.provider.udp.software_config`: 8.39 ms, ``timeout`` 13)."""
    probes_to_restore: int = 2
    """Consecutive successful probes that turn an ASSUMED_BAD EV back to GOOD."""
    default_ev_count: int = 128
    """EVs per QP when the QP names no EV profile (UDP source-port EVs, drawn equally from all ports)."""
    default_ev_sports: tuple[int, int] = (1, 65536)
    """UDP source ports [low, high) the default profile's EVs are drawn from. A UDP device narrows it to the
    dynamic range 49152-65535 (ports a host does not reserve for services)."""
    validate_wire: bool = False
    """Encode and re-parse every packet sent and received (validation mode; slow)."""
    max_send_wr: int = 4096
    """Default send-queue depth when a QP is created without caps."""
    max_recv_wr: int = 4096
    """Default receive-queue depth when a QP is created without caps."""

    def __post_init__(self) -> None:
        checks = {
            "mtu": self.mtu > 0 and self.mtu % 4 == 0,
            "link_bps": self.link_bps > 0,
            "base_rtt_ns": self.base_rtt_ns > 0,
            "sack_every": self.sack_every >= 1,
            "sack_delay_ns": self.sack_delay_ns >= 0,
            "reorder_allowance": self.reorder_allowance >= 0,
            "reshuffle_rotations": self.reshuffle_rotations >= 1,
            "spray_burst": 1 <= self.spray_burst <= 1024,
            "active_ev_fraction": 0 < self.active_ev_fraction <= 1,
            "probe_interval_ns": self.probe_interval_ns > 0,
            "probes_to_restore": self.probes_to_restore >= 1,
            "probe_backoff_max_ns": self.probe_backoff_max_ns > 0,
            "silent_probe_interval_ns": self.silent_probe_interval_ns > 0,
            "min_ack_timeout_ns": 0 <= self.min_ack_timeout_ns <= 1024 << 24,
            "peer_ack_delay_ns": 0 <= self.peer_ack_delay_ns <= 1_000_000_000,
            "default_ev_count": self.default_ev_count >= 1,
            "default_ev_sports": len(self.default_ev_sports) == 2
            and 1 <= self.default_ev_sports[0] < self.default_ev_sports[1] <= 65536
            and self.default_ev_sports[1] - self.default_ev_sports[0] >= self.default_ev_count,
            "max_send_wr": self.max_send_wr >= 1,
            "max_recv_wr": self.max_recv_wr >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"NicConfig.{name}: invalid value {getattr(self, name)!r}")
