"""Ranks on the hosts of a fabric export (`openmrc testbed`, or real hosts set up from the same export):
each rank's device binds its host's plane addresses, and each QP sprays over the paths the fabric offers
towards its peer's host -- SRv6 micro-segment routes over every plane and uplink (``--mode srv6``), or
flow-label (STEV) EVs that the fabric's ECMP hashes over the spines (``--mode ecmp``).

    fd = fabric_device("/var/lib/openmrc/testbed/export")   # this namespace's host, found by its address
    comm = Communicator(rank, size, store, device=fd.device, ev_profile=fd.profile_for)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openmrc.provider import UdpDevice
from openmrc.provider.perf import PerfFabric, stev_profile
from openmrc.provider.udp.config import parse_endpoint

__all__ = ["FabricDevice", "fabric_device"]

_FIRST_PROFILE = 16  # EV profile ids from here on, one per peer host (0 stays the device's default)


class FabricDevice:
    """This host's `UdpDevice` in a fabric export, and `profile_for`, the EV profile towards a peer."""

    def __init__(self, place: PerfFabric, *, evs: int | None = None) -> None:
        self.place = place
        self.evs = evs
        self.device = UdpDevice(place.binds(), srv6_addresses=place.srv6_addresses())
        self._by_host: dict[int, int] = {}
        fab = place.fabric
        self._host_of = {fab.host_address(h, 0): h for h in range(fab.topo.num_hosts)}

    @property
    def host(self) -> int:
        return self.place.host

    def profile_for(self, peer_address: Any) -> int:
        """The EV profile id for QPs towards the rank whose device address (its endpoints, as a
        `Communicator` publishes them) is ``peer_address``; installed on first use."""
        ip = parse_endpoint(peer_address[0])[0]
        host = self._host_of.get(ip)
        if host is None:
            raise ValueError(f"{ip} is not a host's plane-0 address in this fabric")
        if host not in self._by_host:
            pid = _FIRST_PROFILE + len(self._by_host)
            fab = self.place.fabric
            if fab.srv6:
                prof, ports = fab.plan.ev_profile(self.place.host, host, self.evs)
                self.device.add_ev_profile(pid, prof, ports)
            else:
                self.device.add_ev_profile(pid, stev_profile(self.evs or 64))
            self._by_host[host] = pid
        return self._by_host[host]


def fabric_device(
    export_dir: str, binds: Sequence[str] | None = None, *, evs: int | None = None
) -> FabricDevice:
    """The device of this host of the fabric exported in ``export_dir``: the host whose plane-0 address is
    ``binds[0]``, or without ``binds`` the one whose address this machine (namespace) owns."""
    return FabricDevice(PerfFabric.locate(export_dir, binds), evs=evs)
