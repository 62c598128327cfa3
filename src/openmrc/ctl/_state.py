"""What every part of `openmrc.ctl` shares: the controller's record of a device (its profiles in every
state, the ports it took down, its grant, its store), the privilege check, and the argument checks the
profile calls have in common.

The record hangs off the device's NIC (`openmrc.transport.profiles.ProfileTable.controller`): every
opening of a device, and every context of it, sees the same profiles, as every handle on one NIC would,
and the record goes when the device does."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntFlag
from typing import Any, TypeVar

from openmrc import verbs
from openmrc.ctl.records import MAX_VENDOR_CFG_SIZE, CtlError, Ev, ProfileState
from openmrc.ev import EVField, EVFormatMode, EVProfileMode
from openmrc.provider.profile_store import ProfileStore
from openmrc.transport import QpState


@dataclass(slots=True)
class _Fmt:
    state: ProfileState = ProfileState.INIT
    mode: EVFormatMode | None = None
    widths: tuple[int, ...] = ()
    vendor_cfg: bytes = b""


@dataclass(slots=True)
class _EvProf:
    state: ProfileState = ProfileState.INIT
    mode: EVProfileMode | None = None
    fmt_id: int | None = None
    count: int | None = None
    min_active: int | None = None
    event_mask: int | None = None
    fields: tuple[EVField, ...] | None = None
    evs: list[Ev] = field(default_factory=list)  # EXP: the array; ONLINE: the EVs in use
    vendor_cfg: bytes = b""


@dataclass(slots=True)
class _Cc:
    state: ProfileState = ProfileState.INIT
    algorithm: str | None = None
    config: object | None = None
    config_set: bool = False
    vendor_cfg: bytes = b""


@dataclass(slots=True)
class _Controller:
    granted: bool = False
    seeded: bool = False  # the NIC's own profiles 0 entered (at the first profile call)
    fmts: dict[int, _Fmt] = field(default_factory=dict)
    evs: dict[int, _EvProf] = field(default_factory=dict)
    ccs: dict[int, _Cc] = field(default_factory=dict)
    admin_down: set[int] = field(default_factory=set)
    store: ProfileStore | None = None


def _found(dev: verbs.VerbsDevice) -> _Controller | None:
    """The device's record, None until a controller call made one."""
    c = dev.nic.profiles.controller
    return c if isinstance(c, _Controller) else None


def _record(dev: verbs.VerbsDevice) -> _Controller:
    c = _found(dev)
    if c is None:
        c = dev.nic.profiles.controller = _Controller()
    return c


def _ctl(ctx: verbs.Context) -> _Controller:
    """The record of the context's device, with the NIC's own profile 0 of each kind: ONLINE from the start
    (AUTO EVs, NSCC for its rate)."""
    c = _record(ctx.dev)
    if not c.seeded:
        nic = ctx.dev.nic
        b = nic.ev_profile(0)
        c.evs[0] = _EvProf(
            ProfileState.ONLINE,
            EVProfileMode.AUTO,
            None,
            len(b.entries),
            b.min_active,
            b.event_mask,
            None,
            [Ev(ev, port) for ev, port, _ in b.entries],
        )
        algo, cfg = nic.cc_profiles[0]
        c.ccs[0] = _Cc(ProfileState.ONLINE, algo, cfg, True)
        c.seeded = True
    return c


_P = TypeVar("_P", _Fmt, _EvProf, _Cc)


def _slot(profiles: dict[int, _P], pid: int, make: Callable[[], _P], limit: int, kind: str) -> _P:
    """Profile ``pid`` of a kind (``kind``: its plural name): a new one, in INIT, if it was never modified;
    ENOMEM when ``limit`` profiles of the kind exist already."""
    prof = profiles.get(pid)
    if prof is None:
        if len(profiles) >= limit:
            raise CtlError(errno.ENOMEM, f"{limit} {kind} exist already")
        prof = make()
    return prof


def _commit(profiles: dict[int, _P], pid: int, staged: _P, new: ProfileState, make: Callable[[], _P]) -> None:
    """Keep ``staged`` as profile ``pid``, now in state ``new``; back in INIT a profile is unconfigured
    again."""
    back = new is ProfileState.INIT and staged.state is not ProfileState.INIT
    staged.state = new
    profiles[pid] = make() if back else staged


# -- privilege -----------------------------------------------------------------------------------------------
def grant(device: verbs.Device) -> None:
    """Let this process control ``device`` without root: the explicit override for a software NIC it owns
    (a real NIC's controller needs CAP_NET_ADMIN)."""
    device._check()
    _record(device.dev).granted = True


def _priv(ctx: verbs.Context) -> None:
    ctx._check()
    if os.geteuid() != 0 and not ((c := _found(ctx.dev)) is not None and c.granted):
        raise CtlError(
            errno.EPERM,
            f"controlling {ctx.device.name!r} needs CAP_NET_ADMIN: run as root, or call ctl.grant(device) "
            "for a software NIC this process owns",
        )


# -- argument checks -----------------------------------------------------------------------------------------
def _id(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
        raise CtlError(errno.EINVAL, f"{name}: {v!r} is not a 64-bit profile id")
    return v


def _vendor(v: Any) -> bytes:
    if not isinstance(v, bytes | bytearray) or len(v) > MAX_VENDOR_CFG_SIZE:
        raise CtlError(errno.EINVAL, f"vendor_cfg: at most {MAX_VENDOR_CFG_SIZE} bytes")
    return bytes(v)


def _unknown(mask: int, kind: type[IntFlag], what: str) -> None:
    known = sum(int(b) for b in kind)
    if isinstance(mask, bool) or not isinstance(mask, int) or mask < 0 or mask & ~known:
        raise CtlError(errno.EINVAL, f"{what}: attr_mask {mask!r} has bits {kind.__name__} does not name")


def _busy(ctx: verbs.Context, pid: int, kind: str, what: str) -> None:
    """EBUSY when QPs bind profile ``pid`` of ``kind`` ("ev", "cc"): this process's, and, with a store
    attached, those other processes' devices recorded there."""
    attr = f"{kind}_profile_id"
    users = [
        f"0x{qp.qp_num:06x}"
        for qp in ctx.dev.nic.qps.values()
        if qp.state is not QpState.RESET and (getattr(qp.attr, attr) or 0) == pid
    ]
    c = _found(ctx.dev)
    if c is not None and c.store is not None:
        users += [f"0x{qpn:06x} (process {proc})" for proc, qpn in c.store.users(kind, pid)]
    if users:
        more = f" and {len(users) - 8} more" if len(users) > 8 else ""
        raise CtlError(errno.EBUSY, f"{what} is bound by {len(users)} QP(s): {', '.join(users[:8])}{more}")
