"""The pair harness for the transport tests (it lives in the package: `openmrc.transport.loopback`)."""

from openmrc.transport.loopback import Fabric, Impairments, Pair

__all__ = ["Fabric", "Impairments", "Pair"]
