"""The node-local profile store from the controller's side: what this device's controller publishes for the
applications of other processes (`openmrc.provider.profile_store`)."""

from __future__ import annotations

import os

from openmrc import verbs
from openmrc.ctl._state import _ctl, _found, _priv
from openmrc.ctl.records import CtlError, ProfileState
from openmrc.provider.profile_store import ProfileStore
from openmrc.transport import LocalProtocolError


def attach_store(ctx: verbs.Context, path: str | os.PathLike[str]) -> ProfileStore:
    """Publish this device's ONLINE EV and CC profiles (not the NIC's own profile 0 of each kind) and the
    EVs denied on them to the node-local store at ``path``, now and after every change, so that the
    applications of other processes (devices with `UdpDevice.use_profile_store`) bind them by id."""
    _priv(ctx)
    c = _ctl(ctx)
    c.store = ProfileStore(path)
    _publish(ctx)
    return c.store


def _publish(ctx: verbs.Context) -> None:
    c = _found(ctx.dev)
    if c is None or c.store is None:
        return
    online_ev = sorted(i for i, p in c.evs.items() if i and p.state is ProfileState.ONLINE)
    online_cc = sorted(i for i, p in c.ccs.items() if i and p.state is ProfileState.ONLINE)
    with ctx.dev.lock:
        try:
            c.store.publish(ctx.dev.nic, online_ev, online_cc)
            c.store.publish_domains(ctx.dev.nic.domains)
        except LocalProtocolError as exc:
            raise CtlError(exc.errno, exc.reason) from None
