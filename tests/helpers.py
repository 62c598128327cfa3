"""Shared by the tests: the pair harness for the transport tests (it lives in the package:
`openmrc.provider.loopback`), and whether this host has an IPv6 loopback."""

import socket

from openmrc.provider.loopback import Fabric, Impairments, Pair

__all__ = ["Fabric", "Impairments", "Pair", "has_ipv6_loopback"]


def has_ipv6_loopback() -> bool:
    """Whether a socket can bind ``::1`` here (some containers have no IPv6)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False
