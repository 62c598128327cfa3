"""`openmrc.verbs`, the mrc.h mirror, over two software NICs on loopback: the OCP QP example's flow, every
state-machine rule and error path the module names, and completions through a channel's descriptor."""

from __future__ import annotations

import errno
import mmap
import random
import select
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from openmrc import verbs as v
from openmrc.provider import Peer, UdpDevice
from openmrc.transport import AckTimeoutWarning, LocalProtocolError
from openmrc.wire import parse, service_time_ns

_RNG = random.Random()


def _names() -> tuple[str, str]:
    k = _RNG.randrange(1 << 30)
    return f"mrc-a-{k}", f"mrc-b-{k}"


@pytest.fixture
def devices() -> Iterator[tuple[str, str, UdpDevice, UdpDevice]]:
    x, y = _RNG.randrange(1, 255), _RNG.randrange(0, 250)
    a = UdpDevice([f"127.{x}.{y}.{p}" for p in (1, 2)])
    b = UdpDevice([f"127.{x}.{y + 1}.{p}" for p in (1, 2)])
    na, nb = _names()
    v.add_device(na, a)
    v.add_device(nb, b)
    try:
        yield na, nb, a, b
    finally:
        for n in (na, nb):
            v.remove_device(n)
        a.close()
        b.close()


@dataclass
class Side:
    dev: v.Device
    ctx: v.Context
    pd: v.ProtectionDomain
    ch: v.CompChannel
    cq: v.Cq
    qp: v.Qp
    buf: bytearray
    mr: v.MemoryRegion


def _side(name: str, size: int) -> Side:
    dev = v.open_device(name)
    ctx = v.create_context(dev, v.API_CURRENT_VERSION)
    pd = v.alloc_pd(dev)
    ch = v.create_comp_channel(ctx)
    cq = v.create_cq(ctx, 128, cq_context="ctx-of-" + name, channel=ch)
    qp = v.create_qp(
        ctx,
        v.QpInitAttr(
            send_cq=cq, recv_cq=cq, pd=pd, cap=v.QpCap(max_send_wr=128, max_recv_wr=128), sq_sig_all=True
        ),
    )
    buf = bytearray(size)
    mr = v.reg_mr(pd, buf, v.Access.LOCAL_WRITE | v.Access.REMOTE_WRITE)
    return Side(dev, ctx, pd, ch, cq, qp, buf, mr)


def _to_init(qp: v.Qp, hint: v.QpHint | None = None, security: object = None) -> None:
    """INIT with profiles 0 (and ``security``, **[openmrc]** the SECURITY attribute, when given)."""
    M = v.MrcQpAttrMask
    v.modify_qp(
        qp,
        v.QpAttr(qp_state=v.QpState.INIT),
        v.QpAttrMask.STATE,
        v.MrcQpAttr(ev_profile_id=0, cc_profile_id=0, qp_hint=hint, security=security),  # type: ignore[arg-type]
        M.EV_PROFILE_ID | M.CC_PROFILE_ID | M.HINT | (M.SECURITY if security is not None else 0),
    )


def _to_rts(qp: v.Qp, peer: UdpDevice, dest_qpn: int, cap: v.QpCapFlags = v.QpCapFlags.DYNAMIC_MPR) -> None:
    """RTR and RTS with the OCP example's attribute values."""
    M = v.MrcQpAttrMask
    v.modify_qp(
        qp,
        v.QpAttr(qp_state=v.QpState.RTR, ah_attr=Peer.of(peer.endpoints()), dest_qp_num=dest_qpn, rq_psn=0),
        v.QpAttrMask.STATE | v.QpAttrMask.AV | v.QpAttrMask.DEST_QPN | v.QpAttrMask.RQ_PSN,
        v.MrcQpAttr(mpr=8, mpr_dest=8, max_wimm=128, max_wimm_dest=128, cap=cap),
        M.MPR | M.MPR_DEST | M.MAX_WIMM | M.MAX_WIMM_DEST | M.CAP,
    )
    v.modify_qp(
        qp,
        v.QpAttr(qp_state=v.QpState.RTS, sq_psn=0),
        v.QpAttrMask.STATE | v.QpAttrMask.SQ_PSN,
        v.MrcQpAttr(mpr=8, max_wimm=128, timeout=14, linear_cnt=7, exp_cnt=25),
        M.MPR | M.MAX_WIMM | M.TIMEOUT | M.RETRY_CNT,
    )


def _pair(
    devices: tuple[str, str, UdpDevice, UdpDevice],
    size: int = 1 << 16,
    cap_b: v.QpCapFlags = v.QpCapFlags.DYNAMIC_MPR,
) -> tuple[Side, Side]:
    na, nb, a, b = devices
    sa, sb = _side(na, size), _side(nb, size)
    _to_init(sa.qp)
    _to_init(sb.qp)
    _to_rts(sa.qp, b, v.get_qpn(sb.qp))
    _to_rts(sb.qp, a, v.get_qpn(sa.qp), cap_b)
    return sa, sb


def _poll_until(
    side: Side, n: int, other: Side | None = None, timeout: float = 20.0
) -> list[v.WorkCompletion]:
    out: list[v.WorkCompletion] = []
    end = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < end:
        out += v.poll_cq(side.cq, n - len(out))
        if other is not None:
            v.poll_cq(other.cq, 0)  # the peer's device makes progress too
    return out


def _errno(exc: pytest.ExceptionInfo[v.VerbsError]) -> str:
    return exc.value.errno_name


# -- versions, devices, contexts ------------------------------------------------------------------------
def test_versions_encode_as_mrc_api_ver() -> None:
    assert v.api_ver(1, 0, 1) == 0x0100_0001
    cur, last, vend, last_vend = v.query_version()
    assert cur == v.API_CURRENT_VERSION == v.api_ver(1, 0, 1)
    assert last <= cur and last_vend <= vend
    with pytest.raises(v.VerbsError) as e:
        v.api_ver(256, 0, 0)
    assert _errno(e) == "EINVAL"


def test_devices_are_opened_by_name(devices: tuple[str, str, UdpDevice, UdpDevice]) -> None:
    na, nb, a, _b = devices
    assert {na, nb} <= set(v.get_device_list())
    dev = v.open_device(na)
    assert dev.dev is a
    with pytest.raises(v.VerbsError) as e:
        v.open_device("no-such-device")
    assert _errno(e) == "ENOENT" and na in str(e.value)
    with pytest.raises(v.VerbsError) as e:
        v.add_device(na, devices[3])
    assert _errno(e) == "EEXIST"
    attr = v.query_device(dev)
    assert attr.supported and attr.protocol_version & v.ProtocolVersion.V1
    assert attr.max_mpr == 255 and attr.mpr_resolution == 1 and attr.max_qp_hint > 0
    assert attr.cap & v.DeviceCap.TRIM_NACK and attr.cap & v.DeviceCap.DYNAMIC_MPR
    assert attr.cap & v.DeviceCap.SVC_TIME  # its SACKs say how long their trigger waited in the host
    v.close_device(dev)
    with pytest.raises(v.VerbsError) as e:
        v.alloc_pd(dev)
    assert _errno(e) == "EBADF"


def test_context_versions_are_checked(devices: tuple[str, str, UdpDevice, UdpDevice]) -> None:
    dev = v.open_device(devices[0])
    with pytest.raises(v.VerbsError) as e:
        v.create_context(dev, v.api_ver(2, 0, 0))
    assert _errno(e) == "EINVAL" and "2.0.0" in str(e.value) and "1.0.1" in str(e.value)
    with pytest.raises(v.VerbsError):
        v.create_context(dev, 0, v.api_ver(9, 0, 0))
    old = v.create_context(dev, v.api_ver(1, 0, 0))
    with pytest.raises(v.VerbsError) as e:
        v.query_device_ex(dev, old)
    assert _errno(e) == "EOPNOTSUPP"
    new = v.create_context(dev)
    assert v.query_device_ex(dev, new) == v.query_device(dev)
    with pytest.raises(v.VerbsError) as e:
        v.close_device(dev)
    assert _errno(e) == "EBUSY"
    v.destroy_context(old)
    v.destroy_context(new)
    with pytest.raises(v.VerbsError):
        v.destroy_context(new)
    v.close_device(dev)


# -- memory ---------------------------------------------------------------------------------------------
def test_memory_registration_of_buffer_objects(devices: tuple[str, str, UdpDevice, UdpDevice]) -> None:
    dev = v.open_device(devices[0])
    pd = v.alloc_pd(dev)
    rw = v.Access.LOCAL_WRITE | v.Access.REMOTE_WRITE
    arr = np.zeros(1000, dtype=np.float32)
    m = mmap.mmap(-1, 8192)
    mrs = [v.reg_mr(pd, arr, rw), v.reg_mr(pd, bytearray(100), rw), v.reg_mr(pd, m, rw)]
    assert [mr.length for mr in mrs] == [4000, 100, 8192]
    src = v.reg_mr(pd, b"read-only source", 0)  # a Write's source needs no write access
    assert src.length == 16
    for access, why in (
        (v.Access.LOCAL_WRITE, "read-only"),
        (v.Access.REMOTE_WRITE, "LOCAL_WRITE"),
        (1 << 2, "Read"),
        (1 << 9, "unknown"),
    ):
        buf: object = b"x" if why == "read-only" else bytearray(8)
        with pytest.raises(v.VerbsError) as e:
            v.reg_mr(pd, buf, access)
        assert _errno(e) == "EINVAL" and why in str(e.value)
    with pytest.raises(v.VerbsError) as e:
        v.dealloc_pd(pd)
    assert _errno(e) == "EBUSY"
    for mr in [*mrs, src]:
        v.dereg_mr(mr)
    with pytest.raises(v.VerbsError):
        v.dereg_mr(src)
    v.dealloc_pd(pd)
    m.close()


# -- the OCP example's QP flow and a Write with Immediate through the channel ------------------------------
def test_write_with_imm_completes_through_the_channel(devices: tuple[str, str, UdpDevice, UdpDevice]) -> None:
    sa, sb = _pair(devices)
    sa.buf[:] = random.Random(3).randbytes(len(sa.buf))
    v.post_recv(sb.qp, v.RecvWR(77))
    v.req_notify_cq(sb.cq)
    v.post_send(
        sa.qp,
        v.SendWR(
            5,
            v.WrOpcode.RDMA_WRITE_WITH_IMM,
            [v.Sge(sa.mr.addr, len(sa.buf), sa.mr.lkey)],
            sb.mr.addr,
            sb.mr.rkey,
            0xBEEF,
        ),
    )
    fd = v.get_comp_channel_fd(sb.ch)
    assert select.select([fd], [], [], 0)[0] == []  # nothing yet
    for _ in range(2000):  # neither device has a progress thread: the program drives both
        v.poll_cq(sa.cq, 0)
        sb.ctx.progress()
        if select.select([fd], [], [], 0)[0]:
            break
    assert select.select([fd], [], [], 0)[0] == [fd]
    cq, cq_context = v.get_cq_event(sb.ch, timeout=5)
    assert cq is sb.cq and cq_context == sb.cq.cq_context
    assert select.select([fd], [], [], 0)[0] == []  # consumed
    (wc,) = v.poll_cq(sb.cq, 4)
    assert (wc.wr_id, wc.status, wc.opcode, wc.imm_data) == (
        77,
        v.WcStatus.SUCCESS,
        v.WcOpcode.RECV_RDMA_WITH_IMM,
        0xBEEF,
    )
    assert sb.buf == sa.buf
    (wa,) = _poll_until(sa, 1, sb)
    assert (wa.wr_id, wa.status) == (5, v.WcStatus.SUCCESS)
    # destroy in the wrong order: each refusal names what holds it
    with pytest.raises(v.VerbsError) as e:
        v.destroy_cq(sb.cq)
    assert _errno(e) == "EBUSY"
    v.destroy_qp(sb.qp)
    with pytest.raises(v.VerbsError) as e:
        v.destroy_cq(sb.cq)
    assert _errno(e) == "EBUSY" and "acknowledged" in str(e.value)
    with pytest.raises(v.VerbsError):
        v.ack_cq_events(sb.cq, 2)
    v.ack_cq_events(sb.cq, 1)
    with pytest.raises(v.VerbsError) as e:
        v.destroy_comp_channel(sb.ch)
    assert _errno(e) == "EBUSY"
    v.destroy_cq(sb.cq)
    v.destroy_comp_channel(sb.ch)
    with pytest.raises(v.VerbsError) as e:
        v.destroy_context(sa.ctx)
    assert _errno(e) == "EBUSY" and "QP" in str(e.value)


def test_get_cq_event_times_out_and_notification_is_one_shot(
    devices: tuple[str, str, UdpDevice, UdpDevice],
) -> None:
    sa, sb = _pair(devices)
    with pytest.raises(v.VerbsError) as e:
        v.get_cq_event(sa.ch, timeout=0.05)
    assert _errno(e) == "EAGAIN"
    wr = v.SendWR(1, v.WrOpcode.RDMA_WRITE, [v.Sge(sa.mr.addr, 64, sa.mr.lkey)], sb.mr.addr, sb.mr.rkey)
    v.req_notify_cq(sa.cq)
    v.post_send(sa.qp, [wr, wr])
    _poll_until(sa, 2, sb)
    cq, _ = v.get_cq_event(sa.ch, timeout=5)
    v.ack_cq_events(cq, 1)
    v.post_send(sa.qp, wr)  # not re-armed: no second event
    _poll_until(sa, 1, sb)
    with pytest.raises(v.VerbsError):
        v.get_cq_event(sa.ch, timeout=0.05)


def test_threaded_device_delivers_cq_events(devices: tuple[str, str, UdpDevice, UdpDevice]) -> None:
    sa, sb = _pair(devices)
    devices[2].start()
    devices[3].start()
    v.post_recv(sb.qp, v.RecvWR(9))
    v.req_notify_cq(sb.cq, solicited_only=True)
    sa.buf[:100] = b"z" * 100
    plain = v.SendWR(1, v.WrOpcode.RDMA_WRITE, [v.Sge(sa.mr.addr, 100, sa.mr.lkey)], sb.mr.addr, sb.mr.rkey)
    v.post_send(sa.qp, plain)
    imm = v.SendWR(2, v.WrOpcode.RDMA_WRITE_WITH_IMM, [], sb.mr.addr, sb.mr.rkey, 7)
    v.post_send(sa.qp, imm)
    cq, _ = v.get_cq_event(sb.ch, timeout=10)
    (wc,) = v.poll_cq(cq, 8)
    assert wc.opcode == v.WcOpcode.RECV_RDMA_WITH_IMM and wc.imm_data == 7
    assert sb.buf[:100] == b"z" * 100
    v.ack_cq_events(cq, 1)


# -- modify_qp: the state machine and its refusals --------------------------------------------------------
def test_modify_qp_required_attributes_and_refusals(devices: tuple[str, str, UdpDevice, UdpDevice]) -> None:
    na, _nb, _a, b = devices
    s = _side(na, 4096)
    Q, M = v.QpAttrMask, v.MrcQpAttrMask
    init = v.QpAttr(qp_state=v.QpState.INIT)
    # INIT needs EV_PROFILE_ID, CC_PROFILE_ID and HINT (mrc.h's table)
    with pytest.raises(v.VerbsError) as e:
        v.modify_qp(s.qp, init, Q.STATE, v.MrcQpAttr(ev_profile_id=0), M.EV_PROFILE_ID)
    assert "CC_PROFILE_ID" in str(e.value) and "HINT" in str(e.value)
    assert s.qp.state is v.QpState.RESET
    # unsupported verbs attributes say what to use instead
    for bit, word in (
        (Q.PORT, "port"),
        (Q.TIMEOUT, "MrcQpAttrMask.TIMEOUT"),
        (Q.RNR_RETRY, "receiver"),
        (Q.ALT_PATH, "alternate"),
    ):
        with pytest.raises(v.VerbsError) as e:
            v.modify_qp(s.qp, init, Q.STATE | bit)
        assert _errno(e) == "EINVAL" and word in str(e.value)
    # an illegal transition, and a CUR_STATE that is not the state
    with pytest.raises(v.VerbsError) as e:
        v.modify_qp(s.qp, v.QpAttr(qp_state=v.QpState.RTS), Q.STATE)
    assert "RESET -> RTS" in str(e.value)
    with pytest.raises(v.VerbsError) as e:
        v.modify_qp(
            s.qp, v.QpAttr(qp_state=v.QpState.INIT, cur_qp_state=v.QpState.RTR), Q.STATE | Q.CUR_STATE
        )
    assert "cur_qp_state" in str(e.value)
    # an attribute not allowed on this transition; an out-of-range value; a profile nobody installed
    with pytest.raises(v.VerbsError) as e:
        v.modify_qp(
            s.qp,
            init,
            Q.STATE | Q.SQ_PSN,
            v.MrcQpAttr(ev_profile_id=0, cc_profile_id=0),
            M.EV_PROFILE_ID | M.CC_PROFILE_ID | M.HINT,
        )
    assert "SQ_PSN" in str(e.value)
    with pytest.raises(v.VerbsError) as e:
        v.modify_qp(
            s.qp,
            init,
            Q.STATE,
            v.MrcQpAttr(ev_profile_id=0, cc_profile_id=0, vendor_cfg=bytes(129)),
            M.EV_PROFILE_ID | M.CC_PROFILE_ID | M.HINT | M.VENDOR_CFG,
        )
    assert "vendor_cfg" in str(e.value)
    with pytest.raises(v.VerbsError) as e:
        v.modify_qp(
            s.qp,
            init,
            Q.STATE,
            v.MrcQpAttr(ev_profile_id=42, cc_profile_id=0),
            M.EV_PROFILE_ID | M.CC_PROFILE_ID | M.HINT,
        )
    assert "EV profile 42" in str(e.value)
    assert s.qp.state is v.QpState.RESET
    _to_init(s.qp)
    # RTR without the responder's MPR_DEST / MAX_WIMM_DEST or without the peer
    with pytest.raises(v.VerbsError) as e:
        v.modify_qp(
            s.qp,
            v.QpAttr(qp_state=v.QpState.RTR, ah_attr=Peer.of(b.endpoints()), dest_qp_num=5, rq_psn=0),
            Q.STATE | Q.AV | Q.DEST_QPN | Q.RQ_PSN,
        )
    assert "MPR_DEST" in str(e.value) and "MAX_WIMM_DEST" in str(e.value)
    with pytest.raises(v.VerbsError) as e:
        v.modify_qp(
            s.qp,
            v.QpAttr(qp_state=v.QpState.RTR),
            Q.STATE,
            v.MrcQpAttr(mpr_dest=8, max_wimm_dest=8),
            M.MPR_DEST | M.MAX_WIMM_DEST,
        )
    assert "AV" in str(e.value) and "DEST_QPN" in str(e.value)
    with pytest.raises(v.VerbsError) as e:
        v.modify_qp(
            s.qp,
            v.QpAttr(qp_state=v.QpState.RTR, ah_attr=Peer.of(b.endpoints()), dest_qp_num=5, rq_psn=0),
            Q.STATE | Q.AV | Q.DEST_QPN | Q.RQ_PSN,
            v.MrcQpAttr(mpr_dest=0, max_wimm_dest=8),
            M.MPR_DEST | M.MAX_WIMM_DEST,
        )
    assert "mpr_dest" in str(e.value) and "1..255" in str(e.value)
    assert s.qp.state is v.QpState.INIT
    _to_rts(s.qp, b, 5)
    # in RTS: TIMEOUT may change in place (below the software NIC's floor: raised to it, with a warning),
    # MPR may not; to ERROR and back to RESET need nothing
    v.modify_qp(s.qp, None, 0, v.MrcQpAttr(timeout=15), M.TIMEOUT)
    assert v.query_qp(s.qp, 0, M.TIMEOUT).mrc_attr.timeout == 15 and s.qp.core.ack_timeout_ns == 1024 << 15
    with pytest.warns(AckTimeoutWarning, match="floor"):
        v.modify_qp(s.qp, None, 0, v.MrcQpAttr(timeout=12), M.TIMEOUT)
    assert v.query_qp(s.qp, 0, M.TIMEOUT).mrc_attr.timeout == 12 and s.qp.core.ack_timeout_ns == 1024 << 13
    with pytest.raises(v.VerbsError):
        v.modify_qp(s.qp, None, 0, v.MrcQpAttr(mpr=4), M.MPR)
    v.modify_qp(s.qp, v.QpAttr(qp_state=v.QpState.ERROR), Q.STATE)
    v.modify_qp(s.qp, v.QpAttr(qp_state=v.QpState.RESET), Q.STATE)
    q = v.query_qp(s.qp, Q.STATE | Q.DEST_QPN, M.TIMEOUT)
    assert q.attr.qp_state is v.QpState.RESET and q.attr.dest_qp_num is None and q.mrc_attr.timeout is None


def test_query_qp_returns_what_the_masks_name(devices: tuple[str, str, UdpDevice, UdpDevice]) -> None:
    sa, sb = _pair(devices)
    Q, M = v.QpAttrMask, v.MrcQpAttrMask
    q = v.query_qp(sa.qp, Q.STATE | Q.DEST_QPN | Q.PATH_MTU, M.MPR | M.MPR_DEST | M.RETRY_CNT | M.CAP)
    assert q.attr.qp_state is v.QpState.RTS and q.attr.dest_qp_num == sb.qp.qp_num
    assert q.attr.path_mtu == 5 and q.attr.rq_psn is None  # 4096 B; RQ_PSN not asked
    m = q.mrc_attr
    assert (m.mpr, m.mpr_dest, m.linear_cnt, m.exp_cnt, m.cap) == (8, 8, 7, 25, v.QpCapFlags.DYNAMIC_MPR)
    assert m.max_wimm is None and q.init_attr.send_cq is sa.cq
    with pytest.raises(v.VerbsError):
        v.query_qp(sa.qp, Q.PORT)


# -- creation checks, hints, posting ----------------------------------------------------------------------
def test_create_qp_refuses_what_mrc_does_not_do(devices: tuple[str, str, UdpDevice, UdpDevice]) -> None:
    s = _side(devices[0], 64)
    for kw, code in (
        ({"send_ops_flags": v.SendOpsFlags.WITH_SEND}, "EOPNOTSUPP"),
        ({"send_ops_flags": v.SendOpsFlags.WITH_RDMA_WRITE | v.SendOpsFlags.WITH_RDMA_READ}, "EOPNOTSUPP"),
        ({"protocol_version": v.ProtocolVersion(2)}, "EPROTONOSUPPORT"),
        ({"cap": v.QpCap(max_send_sge=2)}, "EINVAL"),
        ({"cap": v.QpCap(max_inline_data=64)}, "EINVAL"),
        ({"cap": v.QpCap(max_send_wr=0)}, "EINVAL"),
    ):
        with pytest.raises(v.VerbsError) as e:
            v.create_qp(s.ctx, v.QpInitAttr(send_cq=s.cq, recv_cq=s.cq, pd=s.pd, **kw))  # type: ignore[arg-type]
        assert _errno(e) == code, kw
    other = v.create_context(s.dev)
    with pytest.raises(v.VerbsError):
        v.create_qp(other, v.QpInitAttr(send_cq=s.cq, recv_cq=s.cq, pd=s.pd))


def test_qp_hints(devices: tuple[str, str, UdpDevice, UdpDevice]) -> None:
    s = _side(devices[0], 64)
    H = v.QpHintAttrMask
    hint = v.create_qp_hint(s.ctx, v.QpHintAttr(num_qps_per_peer=2, num_send_peers=7))
    got = v.query_qp_hint(hint, H.NUM_QPS_PER_PEER)
    assert got.num_qps_per_peer == 2 and got.num_send_peers == 0
    v.modify_qp_hint(
        hint,
        v.QpHintAttr(num_remote_recv_peers=16, vendor_cfg=b"\x01\x02"),
        H.NUM_REMOTE_RECV_PEERS | H.VENDOR_CFG,
    )
    got = v.query_qp_hint(hint, H.NUM_SEND_PEERS | H.NUM_REMOTE_RECV_PEERS | H.VENDOR_CFG)
    assert (got.num_send_peers, got.num_remote_recv_peers, got.vendor_cfg) == (7, 16, b"\x01\x02")
    for bad, mask in (
        (v.QpHintAttr(num_send_peers=-1), H.NUM_SEND_PEERS),
        (v.QpHintAttr(vendor_cfg=bytes(200)), H.VENDOR_CFG),
    ):
        with pytest.raises(v.VerbsError):
            v.modify_qp_hint(hint, bad, mask)
    _to_init(s.qp, hint)
    assert v.query_qp(s.qp, 0, v.MrcQpAttrMask.HINT).mrc_attr.qp_hint is hint
    with pytest.raises(v.VerbsError) as e:
        v.destroy_qp_hint(hint)
    assert _errno(e) == "EBUSY"
    v.destroy_qp(s.qp)
    v.destroy_qp_hint(hint)
    with pytest.raises(v.VerbsError):
        v.query_qp_hint(hint, H.NUM_SEND_PEERS)


def test_post_send_reports_the_bad_wr_and_keeps_the_earlier_ones(
    devices: tuple[str, str, UdpDevice, UdpDevice],
) -> None:
    sa, sb = _pair(devices)
    good = v.SendWR(1, v.WrOpcode.RDMA_WRITE, [v.Sge(sa.mr.addr, 128, sa.mr.lkey)], sb.mr.addr, sb.mr.rkey)
    outside = v.SendWR(
        2, v.WrOpcode.RDMA_WRITE, [v.Sge(sa.mr.addr + len(sa.buf), 128, sa.mr.lkey)], sb.mr.addr, sb.mr.rkey
    )
    foreign = v.SendWR(3, v.WrOpcode.RDMA_WRITE, [v.Sge(sb.mr.addr, 8, 0x1234_5678)], sb.mr.addr, sb.mr.rkey)
    two_sge = v.SendWR(
        4, v.WrOpcode.RDMA_WRITE, [v.Sge(sa.mr.addr, 8, sa.mr.lkey)] * 2, sb.mr.addr, sb.mr.rkey
    )
    for bad in (outside, foreign, two_sge):
        with pytest.raises(v.PostError) as e:
            v.post_send(sa.qp, [good, bad, good])
        assert e.value.bad_wr is bad and e.value.index == 1
    wcs = _poll_until(sa, 3, sb)
    assert [(w.wr_id, w.status) for w in wcs] == [(1, v.WcStatus.SUCCESS)] * 3
    v.modify_qp(sa.qp, v.QpAttr(qp_state=v.QpState.ERROR), v.QpAttrMask.STATE)
    with pytest.raises(v.PostError) as e:
        v.post_send(sa.qp, good)
    assert e.value.index == 0
    with pytest.raises(v.PostError):
        v.post_recv(sb.qp, [v.RecvWR(1), v.RecvWR(2, [v.Sge(0, 1, 1)] * 2)])


# -- asynchronous events -----------------------------------------------------------------------------------
def test_async_events_for_a_failed_qp_and_a_port(devices: tuple[str, str, UdpDevice, UdpDevice]) -> None:
    sa, sb = _pair(devices)
    with pytest.raises(v.VerbsError) as e:
        v.get_async_event(sa.ctx, timeout=0.02)
    assert _errno(e) == "EAGAIN"
    # a Write to an R_Key the peer never issued: the peer refuses it and the QP fails
    bad = v.SendWR(
        1, v.WrOpcode.RDMA_WRITE, [v.Sge(sa.mr.addr, 64, sa.mr.lkey)], sb.mr.addr, sb.mr.rkey ^ 0xFFFF
    )
    v.post_send(sa.qp, bad)
    (wc,) = _poll_until(sa, 1, sb)
    assert wc.status == v.WcStatus.REM_ACCESS_ERR
    ev = v.get_async_event(sa.ctx, timeout=5)
    assert ev.event_type is v.AsyncEventType.QP_FATAL and ev.element is sa.qp
    with pytest.raises(v.VerbsError) as e:
        v.destroy_qp(sa.qp)
    assert _errno(e) == "EBUSY"
    v.ack_async_event(ev)
    with pytest.raises(v.VerbsError):
        v.ack_async_event(ev)
    v.destroy_qp(sa.qp)
    # a port going down and up again
    dev_a = devices[2]
    with dev_a.lock:
        dev_a.nic.port_down(2, now=dev_a.now())
    ev = v.get_async_event(sa.ctx, timeout=5)
    assert (ev.event_type, ev.element) == (v.AsyncEventType.PORT_ERR, 2)
    v.ack_async_event(ev)
    with dev_a.lock:
        dev_a.nic.port_up(2, now=dev_a.now())
    ev = v.get_async_event(sa.ctx, timeout=5)
    assert (ev.event_type, ev.element) == (v.AsyncEventType.PORT_ACTIVE, 2)
    v.ack_async_event(ev)
    # a user's own move to ERROR is not an event
    v.modify_qp(sb.qp, v.QpAttr(qp_state=v.QpState.ERROR), v.QpAttrMask.STATE)
    with pytest.raises(v.VerbsError):
        v.get_async_event(sb.ctx, timeout=0.02)


def test_a_destroyed_object_refuses_every_call(devices: tuple[str, str, UdpDevice, UdpDevice]) -> None:
    s = _side(devices[0], 64)
    v.destroy_qp(s.qp)
    for call in (
        lambda: v.get_qpn(s.qp),
        lambda: v.query_qp(s.qp),
        lambda: v.post_recv(s.qp, v.RecvWR(1)),
        lambda: v.destroy_qp(s.qp),
    ):
        with pytest.raises(v.VerbsError) as e:
            call()
        assert _errno(e) == "EINVAL"


# -- one program, two kinds of device ---------------------------------------------------------------------
def _program(name_a: str, name_b: str, peer_of_a: object, peer_of_b: object, ev_ids: tuple[int, int]) -> bool:
    """A verbs program as an application writes it: open both devices by name, connect a QP pair, write
    256 KiB with an immediate and check it arrived; the peers and EV profile ids come out of band."""
    sides = []
    for name, ev in zip((name_a, name_b), ev_ids, strict=True):
        dev = v.open_device(name)
        ctx = v.create_context(dev)
        pd = v.alloc_pd(dev)
        cq = v.create_cq(ctx, 64)
        qp = v.create_qp(ctx, v.QpInitAttr(send_cq=cq, recv_cq=cq, pd=pd, sq_sig_all=True))
        buf = bytearray(1 << 18)
        mr = v.reg_mr(pd, buf, v.Access.LOCAL_WRITE | v.Access.REMOTE_WRITE)
        v.modify_qp(
            qp,
            v.QpAttr(qp_state=v.QpState.INIT),
            v.QpAttrMask.STATE,
            v.MrcQpAttr(ev_profile_id=ev, cc_profile_id=0),
            v.MrcQpAttrMask.EV_PROFILE_ID | v.MrcQpAttrMask.CC_PROFILE_ID | v.MrcQpAttrMask.HINT,
        )
        sides.append((dev, ctx, pd, cq, qp, buf, mr))
    M, Q = v.MrcQpAttrMask, v.QpAttrMask
    for (_d, _c, _p, _cq, qp, _b, _m), peer, (*_, other, _ob, _om) in zip(
        sides, (peer_of_a, peer_of_b), reversed(sides), strict=True
    ):
        v.modify_qp(
            qp,
            v.QpAttr(qp_state=v.QpState.RTR, ah_attr=peer, dest_qp_num=v.get_qpn(other), rq_psn=0),  # type: ignore[arg-type]
            Q.STATE | Q.AV | Q.DEST_QPN | Q.RQ_PSN,
            v.MrcQpAttr(mpr_dest=8, max_wimm_dest=16),
            M.MPR_DEST | M.MAX_WIMM_DEST,
        )
        v.modify_qp(
            qp,
            v.QpAttr(qp_state=v.QpState.RTS, sq_psn=0),
            Q.STATE | Q.SQ_PSN,
            v.MrcQpAttr(mpr=8, max_wimm=16, timeout=14, linear_cnt=7, exp_cnt=7),
            M.MPR | M.MAX_WIMM | M.TIMEOUT | M.RETRY_CNT,
        )
    (_, _, _, cq_a, qp_a, buf_a, mr_a), (_, _, _, cq_b, qp_b, buf_b, mr_b) = sides
    buf_a[:] = random.Random(5).randbytes(len(buf_a))
    v.post_recv(qp_b, v.RecvWR(1))
    wr = v.SendWR(
        2, v.WrOpcode.RDMA_WRITE_WITH_IMM, [v.Sge(mr_a.addr, len(buf_a), mr_a.lkey)], mr_b.addr, mr_b.rkey, 3
    )
    v.post_send(qp_a, wr)
    got: list[v.WorkCompletion] = []
    sent: list[v.WorkCompletion] = []
    end = time.monotonic() + 30
    while not (got and sent) and time.monotonic() < end:
        sent += v.poll_cq(cq_a, 1)
        got += v.poll_cq(cq_b, 1)
    ok = (
        bool(got and sent)
        and got[0].imm_data == 3
        and sent[0].status == v.WcStatus.SUCCESS
        and buf_b == buf_a
    )
    for dev, ctx, pd, cq, qp, _buf, mr in sides:
        v.destroy_qp(qp)
        v.dereg_mr(mr)
        v.destroy_cq(cq)
        v.destroy_context(ctx)
        v.dealloc_pd(pd)
        v.close_device(dev)
    return ok


def test_the_same_program_runs_on_sockets_and_on_simulated_hosts(
    devices: tuple[str, str, UdpDevice, UdpDevice],
) -> None:
    from openmrc.sim.config import FabricSimConfig
    from openmrc.sim.fabric_sim import FabricSim

    na, nb, a, b = devices
    assert _program(na, nb, Peer.of(b.endpoints()), Peer.of(a.endpoints()), (0, 0))
    for routing in ("ecmp", "srv6"):
        fabric = FabricSim.clos(FabricSimConfig(planes=2, hosts=8, t0_radix=8, t1_radix=8, routing=routing))
        ha, hb = fabric.verbs_device(1), fabric.verbs_device(6)  # under different T0s
        sa, sb = _names()
        v.add_device(sa, ha)
        v.add_device(sb, hb)
        try:
            t0 = fabric.sim.now
            assert _program(sa, sb, 6, 1, (ha.ev_profile_for(6), hb.ev_profile_for(1))), routing
            assert fabric.sim.now > t0  # simulated time passed; the data crossed the simulated fabric
            assert ha.nic.stats.tx_data >= 64 and hb.nic.stats.rx_data >= 64
        finally:
            v.remove_device(sa)
            v.remove_device(sb)
    with pytest.raises(LocalProtocolError) as err:
        fabric.verbs_device(0).add_peer(99)
    assert err.value.errno == errno.EINVAL and "0..7" in str(err.value)


@pytest.mark.parametrize("unsupported", [False, True], ids=["svc-time", "svc-time-dest-unsupported"])
def test_a_responder_reports_its_service_time_unless_the_peer_cannot_take_it(
    devices: tuple[str, str, UdpDevice, UdpDevice], unsupported: bool
) -> None:
    """The responder reads a Write 20 ms after it arrived: its SACK says so (SVC_TIME), unless its QP's
    cap says the peer cannot take a service time (SVC_TIME_DEST_UNSUPPORTED)."""
    cap = v.QpCapFlags.DYNAMIC_MPR
    if unsupported:
        cap |= v.QpCapFlags.SVC_TIME_DEST_UNSUPPORTED
    sa, sb = _pair(devices, 4096, cap)
    a = devices[2]
    codes: list[int] = []
    a.rx_tap = lambda port, src, flow, tos, data: codes.extend(
        [p.seth.svc] if (p := parse(bytes(data))).seth is not None else []
    )
    v.post_send(
        sa.qp,
        v.SendWR(1, v.WrOpcode.RDMA_WRITE, [v.Sge(sa.mr.addr, 4096, sa.mr.lkey)], sb.mr.addr, sb.mr.rkey),
    )
    v.poll_cq(sa.cq, 0)  # the packet leaves
    time.sleep(0.02)
    v.poll_cq(sb.cq, 0)  # read 20 ms late
    (wc,) = _poll_until(sa, 1, sb)
    assert wc.status is v.WcStatus.SUCCESS and codes
    if unsupported:
        assert set(codes) == {0}
    else:
        assert service_time_ns(max(codes)) >= 15_000_000


def test_an_authenticated_qp_over_verbs_and_protection_domains_that_hold(
    devices: tuple[str, str, UdpDevice, UdpDevice],
) -> None:
    """**[openmrc]** MrcQpAttrMask.SECURITY in INIT: both QPs in one security domain, a Write goes through
    and query_qp returns the attribute; a wrong value is EINVAL at once. And a Write through a QP of one
    PD naming the region of another PD of the same device (a guessed R_Key) fails REM_ACCESS_ERR, the
    region untouched."""
    na, nb, a, b = devices
    dom = v.SecurityDomain.generate(12)
    sa, sb = _side(na, 1 << 16), _side(nb, 1 << 16)
    M = v.MrcQpAttrMask
    for side in (sa, sb):
        with pytest.raises(v.VerbsError) as exc:
            _to_init(side.qp, security="key")
        assert _errno(exc) == "EINVAL" and "QpSecurity" in exc.value.reason
        _to_init(side.qp, security=v.QpSecurity(dom))
    _to_rts(sa.qp, b, v.get_qpn(sb.qp))
    _to_rts(sb.qp, a, v.get_qpn(sa.qp))
    q = v.query_qp(sa.qp, 0, M.SECURITY).mrc_attr.security
    assert q is not None and q.domain is dom
    sa.buf[:4096] = random.Random(1).randbytes(4096)
    v.post_send(
        sa.qp,
        v.SendWR(1, v.WrOpcode.RDMA_WRITE, [v.Sge(sa.mr.addr, 4096, sa.mr.lkey)], sb.mr.addr, sb.mr.rkey),
    )
    (wc,) = _poll_until(sa, 1, sb)
    assert wc.status is v.WcStatus.SUCCESS and sb.buf[:4096] == sa.buf[:4096]
    assert b.nic.stats.rx_auth_failed == 0 and a.nic.stats.rx_auth_failed == 0

    other_pd = v.alloc_pd(sb.dev)
    secret = bytearray(4096)
    mr2 = v.reg_mr(other_pd, secret, v.Access.LOCAL_WRITE | v.Access.REMOTE_WRITE)
    v.post_send(
        sa.qp, v.SendWR(2, v.WrOpcode.RDMA_WRITE, [v.Sge(sa.mr.addr, 4096, sa.mr.lkey)], mr2.addr, mr2.rkey)
    )
    (wc,) = _poll_until(sa, 1, sb)
    assert wc.status is v.WcStatus.REM_ACCESS_ERR and not any(secret)


def test_the_controller_creates_rotates_and_revokes_a_security_domain(
    devices: tuple[str, str, UdpDevice, UdpDevice],
) -> None:
    """**[openmrc]** ctl: a domain created on both devices (the same key, handed over as its spec), bound
    by id through verbs; Writes go through before and after the keys rotate; revoking it on one device
    fails that device's QP at once (a queued Write flushed LOC_PROT_ERR, a QP_FATAL async event)."""
    from openmrc import ctl

    na, nb, a, b = devices
    sa, sb = _side(na, 1 << 16), _side(nb, 1 << 16)
    for side in (sa, sb):
        ctl.grant(side.dev)
    da = ctl.create_security_domain(sa.ctx, 40)
    key = bytes.fromhex(da.spec().split(":")[1])
    ctl.create_security_domain(sb.ctx, 40, key)
    for side in (sa, sb):
        ctl.secure_endpoint(side.ctx, 40)  # port status updates and probes sealed too
    with pytest.raises(ctl.CtlError) as exc:
        ctl.create_security_domain(sa.ctx, 40)
    assert _errno(exc) == "EEXIST"
    with pytest.raises(v.VerbsError) as exc:
        v.get_security_domain(sa.ctx, 41)
    assert _errno(exc) == "ENOENT"
    for side in (sa, sb):
        _to_init(side.qp, security=v.QpSecurity(v.get_security_domain(side.ctx, 40)))
    _to_rts(sa.qp, b, v.get_qpn(sb.qp))
    _to_rts(sb.qp, a, v.get_qpn(sa.qp))
    q = ctl.query_security_domain(sa.ctx, 40)
    assert (q.sdi, q.epoch, q.revoked, q.qps) == (40, 0, False, 1)
    assert q.fingerprint == ctl.query_security_domain(sb.ctx, 40).fingerprint

    def write(wr_id: int) -> v.WcStatus:
        sa.buf[:4096] = random.Random(wr_id).randbytes(4096)
        v.post_send(
            sa.qp,
            v.SendWR(
                wr_id, v.WrOpcode.RDMA_WRITE, [v.Sge(sa.mr.addr, 4096, sa.mr.lkey)], sb.mr.addr, sb.mr.rkey
            ),
        )
        (wc,) = _poll_until(sa, 1, sb)
        return wc.status

    assert write(1) is v.WcStatus.SUCCESS and sb.buf[:4096] == sa.buf[:4096]
    assert ctl.rotate_security_domain(sa.ctx, 40) == 1  # a first, b later: no packet lost meanwhile
    assert write(2) is v.WcStatus.SUCCESS and sb.buf[:4096] == sa.buf[:4096]
    assert ctl.rotate_security_domain(sb.ctx, 40) == 1
    assert write(3) is v.WcStatus.SUCCESS and sb.buf[:4096] == sa.buf[:4096]
    assert a.nic.stats.rx_auth_epoch == b.nic.stats.rx_auth_epoch == 0
    with pytest.raises(ctl.CtlError) as exc:
        ctl.destroy_security_domain(sa.ctx, 40)
    assert _errno(exc) == "EBUSY"

    assert ctl.revoke_security_domain(sa.ctx, 40) == 1
    assert v.query_qp(sa.qp).attr.qp_state is v.QpState.ERROR
    ev = v.get_async_event(sa.ctx, timeout=5)
    assert ev.event_type is v.AsyncEventType.QP_FATAL and ev.element is sa.qp
    v.ack_async_event(ev)
    assert ctl.query_security_domain(sa.ctx, 40).revoked
    with pytest.raises(ctl.CtlError):
        ctl.rotate_security_domain(sa.ctx, 40)
    with pytest.raises(ctl.CtlError) as exc:
        ctl.destroy_security_domain(sa.ctx, 40)  # it still secures the endpoint
    assert _errno(exc) == "EBUSY"
    ctl.secure_endpoint(sa.ctx, None)
    ctl.destroy_security_domain(sa.ctx, 40)
    with pytest.raises(ctl.CtlError) as exc:
        ctl.query_security_domain(sa.ctx, 40)
    assert _errno(exc) == "ENOENT"


def test_security_domains_reach_other_processes_through_the_store(
    devices: tuple[str, str, UdpDevice, UdpDevice], tmp_path: Path
) -> None:
    """**[openmrc]** A controller that publishes to the node's store: a device that uses the store (another
    process's, here another device) finds the domain by id, follows its rotation, and fails its QP when the
    controller revokes it; the domains file is its owner's only."""
    from openmrc import ctl

    na, nb, a, b = devices
    sa, sb = _side(na, 1 << 16), _side(nb, 1 << 16)
    ctl.grant(sa.dev)
    store = tmp_path / "profiles.json"
    ctl.attach_store(sa.ctx, store)
    b.use_profile_store(store)
    da = ctl.create_security_domain(sa.ctx, 9)
    assert (store.parent / "profiles.json.domains").stat().st_mode & 0o777 == 0o600
    db = v.get_security_domain(sb.ctx, 9)  # found in the store
    assert db is not da and db.fingerprint() == da.fingerprint()
    for side, dom in ((sa, da), (sb, db)):
        _to_init(side.qp, security=v.QpSecurity(dom))
    _to_rts(sa.qp, b, v.get_qpn(sb.qp))
    _to_rts(sb.qp, a, v.get_qpn(sa.qp))
    v.post_send(
        sa.qp,
        v.SendWR(1, v.WrOpcode.RDMA_WRITE, [v.Sge(sa.mr.addr, 512, sa.mr.lkey)], sb.mr.addr, sb.mr.rkey),
    )
    assert _poll_until(sa, 1, sb)[0].status is v.WcStatus.SUCCESS
    ctl.rotate_security_domain(sa.ctx, 9)
    ctl.rotate_security_domain(sa.ctx, 9)
    end = time.monotonic() + 10
    while db.epoch != 2 and time.monotonic() < end:
        b.progress(0.01)
    assert db.epoch == 2  # followed through the store
    ctl.revoke_security_domain(sa.ctx, 9)
    end = time.monotonic() + 10
    while not db.revoked and time.monotonic() < end:
        b.progress(0.01)
    assert db.revoked and v.query_qp(sb.qp).attr.qp_state is v.QpState.ERROR
    with pytest.raises(v.VerbsError) as exc:
        v.get_security_domain(sb.ctx, 10)
    assert _errno(exc) == "ENOENT"
