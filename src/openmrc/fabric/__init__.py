"""The fabric model: topologies, SRv6 uSID address plans and static tables, ECMP (no simulator inside)."""

from openmrc.fabric.clos import MultiPlaneClos, SinglePlaneEquivalent, single_plane_equivalent
from openmrc.fabric.ecmp import EcmpHash
from openmrc.fabric.fattree import FatTree, FatTreeSpec, FoldedClos, LeafSpine, TierSpec, parse_topo
from openmrc.fabric.srv6 import Route, UsidPlan
from openmrc.fabric.topology import Link, MaterializedTopology, PortRef, Role, Topology

__all__ = [
    "EcmpHash",
    "FatTree",
    "FatTreeSpec",
    "FoldedClos",
    "LeafSpine",
    "Link",
    "MaterializedTopology",
    "MultiPlaneClos",
    "PortRef",
    "Role",
    "Route",
    "SinglePlaneEquivalent",
    "TierSpec",
    "Topology",
    "UsidPlan",
    "parse_topo",
    "single_plane_equivalent",
]
