"""The EV profiles perf's QPs spray over (``udp``, ``stev``, ``srv6``) and this side's place in a fabric
export (`PerfFabric`)."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass

from openmrc.ev import EVField, EVFormatMode, EVFormatProfile, EVProfile, EVProfileMode
from openmrc.fabric.linux import LinuxFabric, load_export
from openmrc.provider.perf.report import PerfError
from openmrc.provider.udp import UdpDevice, parse_endpoint

__all__ = ["EV_MODES", "PerfFabric", "install_profile", "stev_profile"]

EV_MODES = ("udp", "stev", "srv6")
_PROFILE = 1  # the EV profile id perf installs for stev and srv6


@dataclass(frozen=True)
class PerfFabric:
    """This side's place in a fabric export: the fabric and the host index this process is."""

    fabric: LinuxFabric
    host: int

    @classmethod
    def locate(cls, directory: str, binds: Sequence[str] | None = None) -> PerfFabric:
        """Read the export in ``directory`` and find the host whose plane-0 address is ``binds[0]``, or,
        without binds, the one whose address this machine (namespace) owns."""
        fab = load_export(directory)
        n = fab.topo.num_hosts
        if binds:
            ip = parse_endpoint(binds[0])[0]
            for h in range(n):
                if fab.host_address(h, 0) == ip:
                    return cls(fab, h)
            raise PerfError(f"{ip} is not a host's plane-0 address in the fabric export {directory}")
        for h in range(n):
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
                try:
                    s.bind((fab.host_address(h, 0), 0))
                except OSError:
                    continue
                return cls(fab, h)
        raise PerfError(f"none of the {n} hosts of the fabric export {directory} has its address here")

    def binds(self) -> list[str]:
        return [self.fabric.host_address(self.host, p) for p in range(self.fabric.topo.planes)]

    def srv6_addresses(self) -> list[str | None] | None:
        f = self.fabric
        return [f.usid_address(self.host, p) for p in range(f.topo.planes)] if f.srv6 else None


def stev_profile(count: int) -> EVProfile:
    """Generated STEV EVs: a random flow label (high 16 bits) and a source port of the dynamic range."""
    fields = (
        EVField(16, min_val=1, max_val=0xFFFF, mask=0xFFFF),
        EVField(16, min_val=0xC000, max_val=0xFFFF, mask=0xFFFF),
    )
    fmt = EVFormatProfile(EVFormatMode.STEV, (16, 16))
    return EVProfile(EVProfileMode.GEN, fmt, fields, count, max(1, count // 8))


def install_profile(
    dev: UdpDevice, mode: str, fabric: PerfFabric | None, peer_host: int | None, evs: int | None
) -> int:
    """Install the EV profile ``mode`` asks for towards the peer; returns its id (0: the default)."""
    if mode == "udp":
        return 0
    if mode == "stev":
        dev.add_ev_profile(_PROFILE, stev_profile(evs or 64))
        return _PROFILE
    if mode != "srv6":
        raise PerfError(f"EV mode {mode!r}: one of {', '.join(EV_MODES)}")
    if fabric is None or not fabric.fabric.srv6:
        raise PerfError("SRv6 EVs need the fabric's SRv6 export on both sides (--fabric DIR)")
    if peer_host is None or not 0 <= peer_host < fabric.fabric.topo.num_hosts or peer_host == fabric.host:
        raise PerfError(f"the peer's host {peer_host!r} is not another host of the fabric")
    try:
        prof, ports = fabric.fabric.plan.ev_profile(fabric.host, peer_host, evs)
    except ValueError as exc:
        raise PerfError(f"--evs: {exc}") from None
    dev.add_ev_profile(_PROFILE, prof, ports)
    return _PROFILE
