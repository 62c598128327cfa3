"""Connecting a QP: RESET → INIT → RTR → RTS in one call, as the pair harness (`openmrc.provider.loopback`)
and the software NIC (`openmrc.provider.udp.UdpDevice.connect`) set one up.

The simulator's hosts do not call it: `openmrc.sim.hosts.MrcHost.connect` makes the same three transitions
itself, because (1) it runs in the compiled simulator up to millions of times in a run (a large all-reduce
makes a QP pair per step and host pair) and this module is interpreted, and the simulator does not import
from `openmrc.provider`; (2) its attributes are the simulation's, not these defaults: MPR 64 both ways, no
Write-with-Immediate window (``max_wimm`` 0 both ways), ``retry_exp`` 25 (retry for ever), the ACK
timeout from about four base RTTs of the fabric, the EV profile towards the peer host, ``now`` 0; (3) a
transition that fails leaves the QP where it stopped (no ERROR → RESET undo) and there is no ``on_init``
hook."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from openmrc.transport.qp import Qp
from openmrc.transport.security import QpSecurity
from openmrc.transport.types import QpState

__all__ = ["connect_qp"]


def connect_qp(
    qp: Qp,
    peer: Hashable,
    dest_qp_num: int,
    *,
    now: int = 0,
    rq_psn: int = 0,
    sq_psn: int = 0,
    ev_profile_id: int = 0,
    cc_profile_id: int = 0,
    mpr: int = 8,
    mpr_dest: int = 8,
    max_wimm: int = 16,
    max_wimm_dest: int = 16,
    timeout: int = 16,
    retry_linear: int = 7,
    retry_exp: int = 7,
    on_init: Callable[[Qp], None] | None = None,
    security: QpSecurity | None = None,
) -> None:
    """Take ``qp`` from RESET to RTS towards QP ``dest_qp_num`` of ``peer``. ``on_init`` runs once the QP is
    in INIT (its EV profile bound), e.g. a driver checking it can carry every EV. If any step raises, the
    QP is put back in RESET and the error propagates. ``security``: the security domain the QP's packets
    are authenticated in (the peer's QP must be connected with the same domain and mode)."""
    try:
        qp.modify(
            QpState.INIT,
            now=now,
            ev_profile_id=ev_profile_id,
            cc_profile_id=cc_profile_id,
            security=security,
        )
        if on_init is not None:
            on_init(qp)
        qp.modify(
            QpState.RTR,
            now=now,
            dest_qp_num=dest_qp_num,
            peer=peer,
            rq_psn=rq_psn,
            mpr_dest=mpr_dest,
            max_wimm_dest=max_wimm_dest,
        )
        qp.modify(
            QpState.RTS,
            now=now,
            sq_psn=sq_psn,
            mpr=mpr,
            max_wimm=max_wimm,
            timeout=timeout,
            retry_linear=retry_linear,
            retry_exp=retry_exp,
        )
    except BaseException:
        if qp.state is not QpState.RESET:
            qp.modify(QpState.ERROR, now=now)
            qp.modify(QpState.RESET, now=now)
        raise
