"""Endpoint requests (mrc_ctl_ep_batch_send_wait): batches of EV probes or port status updates sent to
peers, and their answers waited for on the device's clock."""

from __future__ import annotations

import contextlib
import errno
import time

from openmrc import verbs
from openmrc.ctl._state import _priv
from openmrc.ctl.ev_ops import _ev_check
from openmrc.ctl.records import CtlError, EpOpType, EpReq, EpRsp
from openmrc.ev import ev_echo32
from openmrc.transport import LocalProtocolError
from openmrc.wire import EpOp


def ep_batch_send_wait(
    ctx: verbs.Context,
    req_tc: int,
    op_type: EpOpType,
    reqs: list[EpReq],
    rsp_timeout: int,
) -> list[EpRsp]:
    """mrc_ctl_ep_batch_send_wait: send ``reqs`` (all EV probes or all port status updates) and wait up to
    ``rsp_timeout`` ns of the device's clock for their answers, returned in arrival order. ETIMEDOUT when
    some did not come: the error's ``responses`` hold those that did. ``req_tc``: the DSCP (0..63) the
    request asks for; the software NIC sends every endpoint packet with its own marking."""
    _priv(ctx)
    if isinstance(req_tc, bool) or not isinstance(req_tc, int) or not 0 <= req_tc <= 63:
        raise CtlError(errno.EINVAL, f"req_tc: {req_tc!r} is not a DSCP (0..63)")
    if op_type not in (EpOpType.EV_PROBE, EpOpType.PORT_STATUS_UPDATE):
        raise CtlError(errno.ENOTSUP, f"op_type: {op_type!r}")
    if isinstance(rsp_timeout, bool) or not isinstance(rsp_timeout, int) or not 0 <= rsp_timeout < 1 << 32:
        raise CtlError(errno.EINVAL, f"rsp_timeout: {rsp_timeout!r} ns outside 0..2^32-1")
    if not reqs:
        return []
    dev = ctx.dev
    nic = dev.nic
    ids = [r.req_id for r in reqs]
    if len(set(ids)) != len(ids) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= 0xFFFF for i in ids
    ):
        raise CtlError(errno.EINVAL, "req_id: 16-bit values, unique within the batch")
    for i, r in enumerate(reqs):
        _ev_check(r.req_ev, f"reqs[{i}].req_ev", nic.num_ports)
    op = EpOp.EV_PROBE if op_type is EpOpType.EV_PROBE else EpOp.PORT_STATUS_UPDATE
    with dev.lock:
        start = dev.now()
        for r in reqs:
            if r.dgid is not None:
                # a peer the device may not know yet; an address it cannot learn is answered there
                with contextlib.suppress(LocalProtocolError, TypeError, AttributeError):
                    dev.add_peer(r.dgid)
            try:
                nic.endpoint.request(
                    op,
                    r.dgid,
                    now=start,
                    port=r.req_ev.port,
                    ev=r.req_ev.val,
                    entropy=ev_echo32(r.req_ev.val, r.ev_fmt_mode),
                    port_status=r.port_status if op_type is EpOpType.PORT_STATUS_UPDATE else None,
                    rid=r.req_id,
                )
            except LocalProtocolError as exc:
                raise CtlError(exc.errno, exc.reason) from None
    want = set(ids)
    got: list[EpRsp] = []
    while want:
        with dev.lock:
            pending = nic.endpoint.responses
            kept = []
            while pending:
                resp = pending.popleft()
                if resp.req_id in want:
                    want.discard(resp.req_id)
                    got.append(EpRsp(resp.req_id, resp.port, resp.rtt, resp.adj_svc_time))
                else:
                    kept.append(resp)
            pending.extend(kept)
            now = dev.now()
        if not want:
            break
        if now - start >= rsp_timeout:
            raise CtlError(
                errno.ETIMEDOUT, f"{len(want)} of {len(reqs)} endpoint request(s) unanswered", responses=got
            )
        step = min(0.001, (rsp_timeout - (now - start)) / 1e9)
        if dev.threaded:
            time.sleep(step)
        else:
            dev.progress(step)
    return got
