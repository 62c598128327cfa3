"""The pair harness for the transport tests (it lives in the package: `openmrc.provider.loopback`)."""

from openmrc.provider.loopback import Fabric, Impairments, Pair

__all__ = ["Fabric", "Impairments", "Pair"]
