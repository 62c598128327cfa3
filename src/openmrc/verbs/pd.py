"""Protection domains and memory regions (ibv_alloc_pd, ibv_reg_mr): a PD groups the regions a QP of it
may use, and remote Writes reach a region only through QPs of its PD."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any

from openmrc.transport import Access, LocalProtocolError, MemoryRegion
from openmrc.verbs._errors import VerbsError, _err
from openmrc.verbs.device import Device

if TYPE_CHECKING:
    from openmrc.verbs.qp import Qp


class ProtectionDomain:
    """ibv_pd: groups memory regions and the QPs that may use them."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.mrs: list[MemoryRegion] = []
        self.qps: list[Qp] = []
        self.alive = True

    def _check(self) -> None:
        if not self.alive:
            raise VerbsError(errno.EINVAL, "the PD has been deallocated")
        self.device._check()


def alloc_pd(device: Device) -> ProtectionDomain:
    """ibv_alloc_pd."""
    device._check()
    pd = ProtectionDomain(device)
    device.pds.append(pd)
    return pd


def dealloc_pd(pd: ProtectionDomain) -> None:
    """ibv_dealloc_pd: EBUSY while memory regions or QPs use it."""
    pd._check()
    if pd.mrs or pd.qps:
        raise VerbsError(errno.EBUSY, f"the PD still has {len(pd.mrs)} MR(s) and {len(pd.qps)} QP(s)")
    pd.alive = False
    pd.device.pds.remove(pd)


_MR_ACCESS = Access.LOCAL_WRITE | Access.REMOTE_WRITE
_IBV_REMOTE_READ = 1 << 2
_IBV_REMOTE_ATOMIC = 1 << 3


def reg_mr(pd: ProtectionDomain, buffer: Any, access: int) -> MemoryRegion:
    """ibv_reg_mr of a buffer-protocol object (bytearray, numpy array, mmap; a read-only one such as
    ``bytes`` with access 0, as the source of Writes). ``access``: `Access` flags; REMOTE_WRITE needs
    LOCAL_WRITE (as in verbs); REMOTE_READ and REMOTE_ATOMIC are refused (MRC has neither)."""
    pd._check()
    if isinstance(access, bool) or not isinstance(access, int) or access < 0:
        raise VerbsError(errno.EINVAL, f"access: expected Access flags, got {access!r}")
    if access & (_IBV_REMOTE_READ | _IBV_REMOTE_ATOMIC):
        raise VerbsError(
            errno.EINVAL, "access: MRC has no RDMA Read or atomics (REMOTE_READ / REMOTE_ATOMIC)"
        )
    if access & ~int(_MR_ACCESS):
        raise VerbsError(errno.EINVAL, f"access: unknown flag bits 0x{access & ~int(_MR_ACCESS):x}")
    if access & Access.REMOTE_WRITE and not access & Access.LOCAL_WRITE:
        raise VerbsError(errno.EINVAL, "access: REMOTE_WRITE needs LOCAL_WRITE")
    try:
        mr = pd.device.dev.register(buffer, Access(access))
    except LocalProtocolError as exc:
        raise _err(exc) from None
    mr.pd = pd  # remote Writes reach it only through QPs of this PD (the NIC checks it per packet)
    pd.mrs.append(mr)
    return mr


def dereg_mr(mr: MemoryRegion) -> None:
    """ibv_dereg_mr. Writes already in flight to it are refused (R_Key unknown) from now on."""
    pd = getattr(mr, "pd", None)
    if not isinstance(pd, ProtectionDomain) or mr not in pd.mrs:
        raise VerbsError(errno.EINVAL, "the memory region is not registered")
    pd.mrs.remove(mr)
    mr.pd = None
    with pd.device.dev.lock:
        pd.device.dev.deregister(mr)
