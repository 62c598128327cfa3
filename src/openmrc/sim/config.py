"""`FabricSimConfig`: one simulated fabric's links, buffers, routing and host transport, checked at once.

The Clos shape (``planes``, ``hosts``, ``t0_radix``, ``t1_radix``) is checked by `MultiPlaneClos` itself
(`FabricSimConfig.clos`), the same rule `openmrc topo plan` applies; a fat tree takes its shape from its own
description and uses only the other fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from openmrc.fabric.clos import MultiPlaneClos

__all__ = ["FabricSimConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FabricSimConfig:
    """One simulated fabric. Sizes in bytes, times in ns, rates in bit/s."""

    planes: int = 4
    """Independent planes = NIC ports per host (multi-plane Clos)."""
    hosts: int = 32
    """Hosts (GPUs) of a multi-plane Clos; the last T0 of each plane may be partly filled."""
    t0_radix: int = 16
    """Ports of a T0 switch (half to hosts, half up)."""
    t1_radix: int = 16
    """Ports of a T1 switch (at most this many T0s per plane)."""
    link_bps: int = 100_000_000_000
    """Every link's rate."""
    latency_ns: int = 1_000
    """Every link's one-way propagation delay."""
    mtu: int = 4096
    """Transport payload per packet."""
    buffer_bytes: int | None = None
    """Data buffer per switch output port; default one bandwidth-delay product of the longest path."""
    ecn: tuple[float, float] | None = (0.2, 0.8)
    """ECN RED thresholds as fractions of the buffer (None: no marking)."""
    last_hop_ecn: bool = False
    """Mark ECN on switch ports toward MRC hosts too (MRC marks every hop but the last; htsim's sender-CC-only
    runs, whose figures the htsim-* scenarios compare with, mark the last hop as well)."""
    trimming: bool = True
    """Trim instead of dropping when a switch buffer is full."""
    evs_per_qp: int = 128
    """SRv6 paths each QP sprays over (at most planes × uplinks)."""
    seed: int = 1
    """Seeds every random choice (NIC keys and rotations, ECN marking)."""
    routing: str = "srv6"
    """"srv6": EVs are SRv6 uSID source routes; "ecmp": EVs are UDP source ports hashed by every switch."""
    transport: str = "mrc"
    """"mrc" (the openmrc transport on every host) or "roce" (the RoCEv2 baseline; ECMP, one plane)."""
    roce_qps: int = 1
    """RoCE only: QPs (UDP source ports, hence ECMP paths) per flow."""
    roce_planes: int = 1
    """RoCE only: a flow's QPs take NIC ports (planes) 0..roce_planes-1 in turn (multi-rail); 0: all."""
    roce_window: int = 64
    """RoCE only: packets in flight per QP."""
    validate_wire: bool = False
    """Encode every packet a NIC sends or receives to bytes and parse it back (`openmrc.wire`): slower, and
    proves the simulated conversation is made of valid MRC packets."""
    dcqcn: bool = False
    """RoCE only: DCQCN congestion control (CNPs, per-QP rate pacing) with `DcqcnConfig`'s defaults."""
    pfc: bool = False
    """Lossless fabric: priority flow control on every port (PAUSE instead of drop; no trimming), as RoCEv2
    deployments run. Thresholds per ingress port as fractions of the port buffer: `pfc_xoff`, `pfc_xon`."""
    pfc_xoff: float = 0.25
    """PFC: pause the upstream port when more than this fraction of a port buffer it sent waits here."""
    pfc_xon: float = 0.125
    """PFC: resume it when that falls to this fraction."""
    ecmp_reconverge_ns: int | None = 100_000
    """ECMP routing only: how long after a link changes state the switches hash around dead links (the
    routing protocol's convergence; real fabrics take 50 ms to seconds, kept short here so that short runs
    show both phases). None: never."""
    security: str = "none"
    """MRC hosts only: "none" (MRC 1.0), "auth" (every QP authenticated in one security domain, each packet
    carrying the 32-byte security trailer, `openmrc.transport.security`) or "encrypt" (payloads encrypted
    too). Data packets carry header tags when the switches trim (``trimming``): a trimmed packet keeps its
    trailer, is verified and NACKed at once."""
    ordered: bool = False
    """Partition-independent event order and one random stream per port, so that a run split across
    processes (`openmrc.sim.partition`, ``--ranks``) gives the same results as in one: ties and random draws
    differ from the default order's, so figures differ from a default run's. MRC hosts without PFC only."""

    def __post_init__(self) -> None:
        if self.routing not in ("srv6", "ecmp"):
            raise ValueError(f"FabricSimConfig.routing: {self.routing!r} is not 'srv6' or 'ecmp'")
        if self.transport not in ("mrc", "roce"):
            raise ValueError(f"FabricSimConfig.transport: {self.transport!r} is not 'mrc' or 'roce'")
        if self.transport == "roce" and self.routing != "ecmp":
            raise ValueError("FabricSimConfig.routing: RoCEv2 needs 'ecmp' (it has no SRv6 EVs)")
        if self.security not in ("none", "auth", "encrypt"):
            raise ValueError(
                f"FabricSimConfig.security: {self.security!r} is not 'none', 'auth' or 'encrypt'"
            )
        if self.security != "none" and self.transport != "mrc":
            raise ValueError("FabricSimConfig.security: MRC hosts only (RoCEv2 has no authentication)")
        if self.ordered and (self.transport != "mrc" or self.pfc):
            raise ValueError("FabricSimConfig.ordered: MRC hosts without PFC only")
        if self.pfc and not 0 <= self.pfc_xon < self.pfc_xoff <= 1:
            raise ValueError(
                f"FabricSimConfig.pfc_xon / pfc_xoff: need 0 <= pfc_xon ({self.pfc_xon}) "
                f"< pfc_xoff ({self.pfc_xoff}) <= 1"
            )

    def clos(self) -> MultiPlaneClos:
        """The multi-plane Clos of ``planes``, ``hosts`` and the radices (ValueError naming the rule a shape
        breaks, as `openmrc topo plan` reports it)."""
        return MultiPlaneClos(
            self.planes, self.hosts, self.t0_radix, self.t1_radix, self.link_bps, self.latency_ns
        )
