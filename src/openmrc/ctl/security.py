"""**[openmrc]** Security domains from the controller's side (mrc_ctl.h has none): create, query, rotate,
revoke and destroy a device's domains, and authenticate its endpoint packets (`docs/security.md`)."""

from __future__ import annotations

import errno
from typing import Any, NamedTuple

from openmrc import verbs
from openmrc.ctl._state import _priv
from openmrc.ctl.records import CtlError
from openmrc.ctl.store import _publish
from openmrc.transport import LocalProtocolError, QpState, SecurityDomain
from openmrc.wire import RESERVED_QP_ENDPOINT


class SecurityDomainAttr(NamedTuple):
    """`query_security_domain`: the domain's identifier, current key epoch, whether it is revoked, the QPs
    of this device in it, and its key's fingerprint (never the key)."""

    sdi: int
    epoch: int
    revoked: bool
    qps: int
    fingerprint: str


def _domain(ctx: verbs.Context, sdi: Any) -> SecurityDomain:
    _priv(ctx)
    if isinstance(sdi, bool) or not isinstance(sdi, int):
        raise CtlError(errno.EINVAL, f"sdi: {sdi!r} is not a security domain identifier")
    dom = ctx.dev.nic.domains.get(sdi)
    if dom is None:
        raise CtlError(errno.ENOENT, f"no security domain {sdi} on {ctx.device.name!r}")
    return dom


def create_security_domain(
    ctx: verbs.Context, sdi: int, key: bytes | None = None, *, epoch: int = 0
) -> SecurityDomain:
    """Create security domain ``sdi`` (1 .. 2^32-1) on the device with the 32-byte domain ``key`` (a fresh
    random one when None: hand `SecurityDomain.spec` to the other members out of band). Applications
    bind QPs to it in INIT (`verbs.MrcQpAttr.security`; `verbs.get_security_domain` finds it by id), in
    other processes of the node too once the device publishes to a store (`attach_store`: rotations and
    revocations follow). EEXIST if the device has it already."""
    _priv(ctx)
    nic = ctx.dev.nic
    if isinstance(sdi, int) and not isinstance(sdi, bool) and sdi in nic.domains:
        raise CtlError(errno.EEXIST, f"security domain {sdi} exists on {ctx.device.name!r}")
    try:
        dom = (
            SecurityDomain(sdi, key, epoch=epoch)
            if key is not None
            else SecurityDomain.generate(sdi, epoch=epoch)
        )
    except LocalProtocolError as exc:
        raise CtlError(exc.errno, exc.reason) from None
    with ctx.dev.lock:
        nic.domains[dom.sdi] = dom
    _publish(ctx)
    return dom


def query_security_domain(ctx: verbs.Context, sdi: int) -> SecurityDomainAttr:
    dom = _domain(ctx, sdi)
    nic = ctx.dev.nic
    n = sum(1 for q, s in nic.secure.items() if s.domain is dom and q in nic.qps)
    return SecurityDomainAttr(dom.sdi, dom.epoch, dom.revoked, n, dom.fingerprint())


def rotate_security_domain(ctx: verbs.Context, sdi: int) -> int:
    """Seal with the next key epoch from now on; the new epoch. Packets of the epoch before stay
    accepted (those in flight), and the next epoch is accepted already, so the members of a domain rotate
    without coordinating, as long as none runs more than one epoch ahead."""
    dom = _domain(ctx, sdi)
    with ctx.dev.lock:
        try:
            epoch = dom.rotate()
        except LocalProtocolError as exc:
            raise CtlError(exc.errno, exc.reason) from None
    _publish(ctx)
    return epoch


def revoke_security_domain(ctx: verbs.Context, sdi: int) -> int:
    """End security domain ``sdi`` at once: nothing is sealed or opened under it again, and every QP of the
    device in it fails (ERROR, its work flushed with LOC_PROT_ERR first, a QP_FATAL async event); how many
    QPs. The domain stays, revoked, until `destroy_security_domain`."""
    dom = _domain(ctx, sdi)
    dev = ctx.dev
    with dev.lock:
        n = dev.nic.revoke_domain(dom, dev.now())
    _publish(ctx)
    return n


def secure_endpoint(ctx: verbs.Context, sdi: int | None) -> None:
    """**[openmrc]** Authenticate the device's endpoint packets (port status updates, EV probes and their
    answers) in security domain ``sdi``, so that a forged one cannot take a plane out of use; None: MRC
    1.0 again. Every device that exchanges endpoint packets with this one must do the same."""
    if sdi is None:
        _priv(ctx)
        dom = None
    else:
        dom = _domain(ctx, sdi)
    with ctx.dev.lock:
        ctx.dev.nic.secure_endpoint(dom)


def destroy_security_domain(ctx: verbs.Context, sdi: int) -> None:
    """Remove security domain ``sdi`` from the device (EBUSY while a QP not in RESET is bound to it)."""
    dom = _domain(ctx, sdi)
    nic = ctx.dev.nic
    users = [
        q
        for q, s in nic.secure.items()
        if s.domain is dom and q in nic.qps and nic.qps[q].state is not QpState.ERROR
    ]
    if (ep := nic.secure.get(RESERVED_QP_ENDPOINT)) is not None and ep.domain is dom:
        raise CtlError(
            errno.EBUSY, f"security domain {sdi} secures the endpoint (secure_endpoint(ctx, None))"
        )
    if users:
        raise CtlError(errno.EBUSY, f"security domain {sdi} is bound by {len(users)} QP(s)")
    with ctx.dev.lock:
        del nic.domains[dom.sdi]
    _publish(ctx)
