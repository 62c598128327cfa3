"""The NIC's counters (`NicStats`): what it did and what it refused, shared by the data path, the profile
table and the endpoint."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["NicStats"]


@dataclass(slots=True)
class NicStats:
    """Counters of everything the NIC did or refused.

    ``rx_bad_icrc``: datagrams whose ICRC did not match their bytes and addressing (dropped);
    ``rx_bogus_ack``: SACK/NACK/ACK/probe answers that match nothing this QP has outstanding (stale,
    duplicated or forged; dropped, never acted upon); ``ep_unsent``: endpoint requests (port status
    updates) that could not leave because no port was up; ``tx_dropped_port``: control packets queued for
    a port that went down before the driver took them; ``ev_events_dropped``: EV events lost because the
    event queue was full."""

    rx_packets: int = 0
    rx_data: int = 0
    rx_malformed: int = 0
    rx_bad_icrc: int = 0
    rx_dropped_no_qp: int = 0
    rx_dropped_state: int = 0
    rx_dropped_port: int = 0
    rx_bogus_ack: int = 0
    tx_packets: int = 0
    tx_data: int = 0
    retransmits: int = 0
    losses_inferred: int = 0
    spurious_losses: int = 0
    """Packets inferred lost whose original transmission was acknowledged after all (their EV not blamed)."""
    tail_probes: int = 0
    timeouts: int = 0
    sacks_reneged: int = 0
    """Packets a SACK's bitmap said had arrived, sent again because the cumulative acknowledgement stayed
    below them until a retransmission timeout (the SACK was wrong: forged, or its data never placed)."""
    duplicates: int = 0
    sacks_sent: int = 0
    nacks_sent: int = 0
    nacks_received: int = 0
    trims_seen: int = 0
    trims_unreported: int = 0
    trims_received: int = 0
    probes_sent: int = 0
    probes_answered: int = 0
    access_errors: int = 0
    protocol_errors: int = 0
    qp_errors: int = 0
    ep_requests: int = 0
    ep_responses: int = 0
    ep_unsent: int = 0
    tx_dropped_port: int = 0
    ev_events_dropped: int = 0
    rx_auth_failed: int = 0
    """Packets for an authenticated QP whose security trailer or tag did not verify (forged, modified, of
    another domain or mode, or from another SSI than the peer's), dropped."""
    rx_auth_replayed: int = 0
    """Packets for an authenticated QP whose counter was seen before or is behind the replay window."""
    rx_auth_epoch: int = 0
    """Packets sealed in an epoch that is not live (an old key, or a revoked domain)."""
    rx_auth_unsealed: int = 0
    """Packets for an authenticated QP too short to carry a security trailer, or trimmed (a plain MRC
    packet long enough is taken for one, which does not verify: ``rx_auth_failed``)."""

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
