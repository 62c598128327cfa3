"""`openmrc.ctl`, the mrc_ctl.h mirror, on software NICs: privilege, device query, port admin, the three
profile state machines with their required attributes and refusals, EV operations on line (DENIED seen by
bound QPs and by QPs that bind later), EV events with drop counts, endpoint request batches."""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from openmrc import ctl, verbs
from openmrc.ev import EVField, EVFormatMode, EVProfileMode, EVState
from openmrc.provider import Peer, UdpDevice
from openmrc.provider.profile_store import ProfileStore
from openmrc.transport import LocalProtocolError, NsccConfig

S = ctl.ProfileState
EM = ctl.EvProfileAttrMask
FM = ctl.EvFmtProfileAttrMask
CM = ctl.CcProfileAttrMask
_RNG = random.Random()


class Node:
    """One software NIC with a controller context and an application context."""

    def __init__(self, ips: list[str]) -> None:
        self.udp = UdpDevice(ips)
        self.name = f"ctl-{_RNG.randrange(1 << 40)}"
        verbs.add_device(self.name, self.udp)
        self.dev = verbs.open_device(self.name)
        self.ctx = verbs.create_context(self.dev)
        ctl.grant(self.dev)

    def close(self) -> None:
        verbs.remove_device(self.name)
        self.udp.close()


@pytest.fixture
def nodes() -> Iterator[tuple[Node, Node]]:
    x, y = _RNG.randrange(1, 255), _RNG.randrange(0, 250)
    a, b = Node([f"127.{x}.{y}.1", f"127.{x}.{y}.2"]), Node([f"127.{x}.{y + 1}.1", f"127.{x}.{y + 1}.2"])
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _code(e: pytest.ExceptionInfo[ctl.CtlError]) -> str:
    return e.value.errno_name


def _udp_format(n: Node, fid: int = 3) -> None:
    ctl.modify_ev_fmt_profile(
        n.ctx,
        fid,
        ctl.EvFmtProfileAttr(
            S.OFFLINE, ev_fmt_mode=EVFormatMode.UDP, op=ctl.EvFmtOp.MODIFY_FIELDS, fmt_fields=[16]
        ),
        FM.STATE | FM.MODE | FM.OP,
    )
    ctl.modify_ev_fmt_profile(n.ctx, fid, ctl.EvFmtProfileAttr(S.ONLINE), FM.STATE)


def _ev(i: int) -> ctl.Ev:
    return ctl.Ev.of(0xC100 + i, 2, 1 + i % 2)


def _explicit_profile(n: Node, pid: int = 7, count: int = 16, fid: int = 3) -> None:
    """The OCP explicit-EV example on a UDP-mode format: OFFLINE, replace every unpopulated EV, ONLINE."""
    ctl.modify_ev_profile(
        n.ctx,
        pid,
        ctl.EvProfileAttr(
            S.OFFLINE,
            ev_mode=EVProfileMode.EXP,
            ev_fmt_profile_id=fid,
            ev_count=count,
            ev_min_active=count // 4,
            ev_event_mask=int(EVState.GOOD | EVState.ASSUMED_BAD),
        ),
        EM.STATE | EM.MODE | EM.FMT_ID | EM.COUNT | EM.MIN_ACTIVE | EM.EVENT_MASK,
    )
    for i in range(count):
        ctl.modify_ev_profile(
            n.ctx,
            pid,
            ctl.EvProfileAttr(ev_op=ctl.EvOp.REPLACE_EV, entries=[ctl.EvOpEntry(ctl.EV_UNPOPULATED, _ev(i))]),
            EM.EV_OP,
        )
    ctl.modify_ev_profile(n.ctx, pid, ctl.EvProfileAttr(S.ONLINE), EM.STATE)


def _qp(n: Node, ev_pid: int, cc_pid: int = 0) -> verbs.Qp:
    pd = verbs.alloc_pd(n.dev)
    cq = verbs.create_cq(n.ctx, 64)
    qp = verbs.create_qp(n.ctx, verbs.QpInitAttr(send_cq=cq, recv_cq=cq, pd=pd))
    verbs.modify_qp(
        qp,
        verbs.QpAttr(qp_state=verbs.QpState.INIT),
        verbs.QpAttrMask.STATE,
        verbs.MrcQpAttr(ev_profile_id=ev_pid, cc_profile_id=cc_pid),
        verbs.MrcQpAttrMask.EV_PROFILE_ID | verbs.MrcQpAttrMask.CC_PROFILE_ID | verbs.MrcQpAttrMask.HINT,
    )
    return qp


def _rts(qp: verbs.Qp, peer: Node, dest: int) -> None:
    M = verbs.MrcQpAttrMask
    Q = verbs.QpAttrMask
    verbs.modify_qp(
        qp,
        verbs.QpAttr(
            qp_state=verbs.QpState.RTR, ah_attr=Peer.of(peer.udp.endpoints()), dest_qp_num=dest, rq_psn=0
        ),
        Q.STATE | Q.AV | Q.DEST_QPN | Q.RQ_PSN,
        verbs.MrcQpAttr(mpr_dest=8, max_wimm_dest=8),
        M.MPR_DEST | M.MAX_WIMM_DEST,
    )
    verbs.modify_qp(
        qp,
        verbs.QpAttr(qp_state=verbs.QpState.RTS, sq_psn=0),
        Q.STATE | Q.SQ_PSN,
        verbs.MrcQpAttr(mpr=8, max_wimm=8, timeout=14, linear_cnt=7, exp_cnt=7),
        M.MPR | M.MAX_WIMM | M.TIMEOUT | M.RETRY_CNT,
    )


# -- privilege, device, ports --------------------------------------------------------------------------------
def test_controller_calls_need_privilege(nodes: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = nodes
    monkeypatch.setattr(ctl.os, "geteuid", lambda: 1000)
    a.udp.nic.profiles.controller = None  # the controller's record of the device, its grant with it
    with pytest.raises(ctl.CtlError) as e:
        ctl.query_port(a.ctx, 1)
    assert _code(e) == "EPERM" and "CAP_NET_ADMIN" in str(e.value) and "ctl.grant" in str(e.value)
    ctl.grant(a.dev)
    assert ctl.query_port(a.ctx, 1).port_admin_state is ctl.PortAdminState.ENABLED


def test_a_closed_device_is_not_kept_alive_by_its_controller() -> None:
    """The controller's record of a device (its grant, its profiles) lives on the device: once the device
    is closed and forgotten, nothing in ctl keeps it alive."""
    x, y = _RNG.randrange(1, 255), _RNG.randrange(0, 250)
    n = Node([f"127.{x}.{y}.1", f"127.{x}.{y}.2"])  # granted
    try:
        ref: Callable[[], object] = weakref.ref(n.udp)
    except TypeError:  # a compiled UdpDevice takes no weak references: look for it among the live objects
        ident = id(n.udp)
        ref = lambda: next((o for o in gc.get_objects() if id(o) == ident and type(o) is UdpDevice), None)  # noqa: E731
    _udp_format(n)
    cfg = NsccConfig.defaults(50_000_000_000, 200_000, 4096)
    ctl.modify_cc_profile(
        n.ctx, 5, ctl.CcProfileAttr(S.OFFLINE, algorithm="uet-1.0-nscc"), CM.STATE | CM.ALGORITHM
    )
    ctl.modify_cc_profile(n.ctx, 5, ctl.CcProfileAttr(S.ONLINE, cc_config=cfg), CM.STATE | CM.CONFIG)
    verbs.destroy_context(n.ctx)
    verbs.close_device(n.dev)
    n.close()
    del n
    gc.collect()
    assert ref() is None


def test_every_opening_of_a_device_sees_its_controller_state(nodes: tuple[Node, Node]) -> None:
    """Profiles and grants belong to the device, not to one opening of it: a device opened again (by
    another part of the program, or after closing it) sees the profiles a controller made before."""
    a, _ = nodes
    _udp_format(a)
    verbs.destroy_context(a.ctx)
    verbs.close_device(a.dev)
    dev = verbs.open_device(a.name)  # no grant asked again
    ctx = verbs.create_context(dev)
    assert ctl.query_ev_fmt_profile(ctx, 3, FM.STATE).profile_state is S.ONLINE
    ctl.modify_ev_fmt_profile(ctx, 3, ctl.EvFmtProfileAttr(S.OFFLINE), FM.STATE)
    verbs.destroy_context(ctx)
    verbs.close_device(dev)


def test_device_query_and_versions(nodes: tuple[Node, Node]) -> None:
    a, _ = nodes
    cur, last, _v, _lv = ctl.query_version()
    assert cur == verbs.api_ver(1, 0, 1) and last <= cur
    attr = ctl.query_device(a.dev)
    assert "uet-1.0-nscc" in attr.algorithms and attr.phy_port_mask == 0b110
    assert attr.ev_mode_mask & EVProfileMode.EXP and attr.ev_fmt_mode_mask & EVFormatMode.SRV6
    assert (
        attr.opt_attr & ctl.CtlAttrOpt.EV_EVENT
        and not attr.opt_attr & ctl.CtlAttrOpt.EV_PROFILE_MODIFY_ONLINE
    )
    assert ctl.query_device_ex(a.dev, a.ctx) == attr


def test_port_admin_state(nodes: tuple[Node, Node]) -> None:
    a, _ = nodes
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_port(a.ctx, 3, ctl.PortAttr(ctl.PortAdminState.DISABLED))
    assert _code(e) == "EINVAL" and "1..2" in str(e.value)
    ctl.modify_port(a.ctx, 2, ctl.PortAttr(ctl.PortAdminState.DISABLED))
    assert ctl.query_port(a.ctx, 2).port_admin_state is ctl.PortAdminState.DISABLED
    assert not a.udp.nic.ports_up[2]
    ev = verbs.get_async_event(a.ctx, timeout=2)  # applications see the port down
    assert (ev.event_type, ev.element) == (verbs.AsyncEventType.PORT_ERR, 2)
    verbs.ack_async_event(ev)
    ctl.modify_port(a.ctx, 2, ctl.PortAttr(ctl.PortAdminState.ENABLED))
    assert a.udp.nic.ports_up[2]


# -- EV format profiles -----------------------------------------------------------------------------------
def test_ev_format_profile_state_machine(nodes: tuple[Node, Node]) -> None:
    a, _ = nodes
    q = ctl.query_ev_fmt_profile(a.ctx, 9, FM.STATE)
    assert q.profile_state is S.INIT
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_ev_fmt_profile(a.ctx, 9, ctl.EvFmtProfileAttr(S.ONLINE), FM.STATE)
    assert "INIT -> ONLINE" in str(e.value)
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_ev_fmt_profile(a.ctx, 9, ctl.EvFmtProfileAttr(S.OFFLINE), FM.STATE)
    assert "needs MODE" in str(e.value)
    ctl.modify_ev_fmt_profile(
        a.ctx, 9, ctl.EvFmtProfileAttr(S.OFFLINE, ev_fmt_mode=EVFormatMode.STEV), FM.STATE | FM.MODE
    )
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_ev_fmt_profile(a.ctx, 9, ctl.EvFmtProfileAttr(S.ONLINE), FM.STATE)
    assert "fields" in str(e.value)
    with pytest.raises(ctl.CtlError) as e:  # 40 bits do not fit a 32-bit STEV
        ctl.modify_ev_fmt_profile(
            a.ctx, 9, ctl.EvFmtProfileAttr(op=ctl.EvFmtOp.MODIFY_FIELDS, fmt_fields=[16, 24]), FM.OP
        )
    assert _code(e) == "E2BIG"
    ctl.modify_ev_fmt_profile(
        a.ctx,
        9,
        ctl.EvFmtProfileAttr(S.ONLINE, op=ctl.EvFmtOp.MODIFY_FIELDS, fmt_fields=[16, 16]),
        FM.STATE | FM.OP,
    )
    with pytest.raises(ctl.CtlError) as e:
        ctl.query_ev_fmt_profile(a.ctx, 9, FM.OP, fmt_field_count=1)
    assert _code(e) == "E2BIG" and e.value.needed == 2
    q = ctl.query_ev_fmt_profile(a.ctx, 9, FM.STATE | FM.MODE | FM.OP, fmt_field_count=2)
    assert (q.profile_state, q.ev_fmt_mode, q.fmt_fields) == (S.ONLINE, EVFormatMode.STEV, [16, 16])
    with pytest.raises(ctl.CtlError):  # ONLINE: the mode is fixed
        ctl.modify_ev_fmt_profile(a.ctx, 9, ctl.EvFmtProfileAttr(ev_fmt_mode=EVFormatMode.UDP), FM.MODE)
    ctl.modify_ev_fmt_profile(a.ctx, 9, ctl.EvFmtProfileAttr(S.OFFLINE), FM.STATE)
    ctl.modify_ev_fmt_profile(a.ctx, 9, ctl.EvFmtProfileAttr(S.INIT), FM.STATE)
    assert ctl.query_ev_fmt_profile(a.ctx, 9, FM.MODE).ev_fmt_mode is None


# -- EV profiles -------------------------------------------------------------------------------------------
def test_explicit_profile_carries_a_transfer_and_denies_on_line(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    for n in (a, b):
        _udp_format(n)
    # ONLINE needs every EV populated; the format must be ONLINE; the array reads back with E2BIG first
    ctl.modify_ev_profile(
        a.ctx,
        7,
        ctl.EvProfileAttr(
            S.OFFLINE,
            ev_mode=EVProfileMode.EXP,
            ev_fmt_profile_id=3,
            ev_count=16,
            ev_min_active=4,
            ev_event_mask=3,
        ),
        EM.STATE | EM.MODE | EM.FMT_ID | EM.COUNT | EM.MIN_ACTIVE | EM.EVENT_MASK,
    )
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_ev_profile(a.ctx, 7, ctl.EvProfileAttr(S.ONLINE), EM.STATE)
    assert "16 of 16 EVs unpopulated" in str(e.value)
    with pytest.raises(ctl.CtlError) as e:  # an EV wider than the 16-bit format
        bad = ctl.Ev.of(0xC1_0001, 3, 1)  # bits past the first 16
        ctl.modify_ev_profile(
            a.ctx,
            7,
            ctl.EvProfileAttr(ev_op=ctl.EvOp.REPLACE_EV, entries=[ctl.EvOpEntry(ctl.EV_UNPOPULATED, bad)]),
            EM.EV_OP,
        )
    assert "wider" in str(e.value)
    ctl.modify_ev_profile(a.ctx, 7, ctl.EvProfileAttr(S.INIT), EM.STATE)  # start over, as the example does
    for n in (a, b):
        _explicit_profile(n)
    arr = ctl.EvProfileAttr(ev_op=ctl.EvOp.QUERY_EV_ARRAY, entry_count=4)
    with pytest.raises(ctl.CtlError) as e:
        ctl.query_ev_profile(a.ctx, 7, arr, EM.EV_OP)
    assert _code(e) == "E2BIG" and e.value.needed == 16 and arr.entry_count == 16
    ctl.query_ev_profile(a.ctx, 7, arr, EM.EV_OP | EM.STATE | EM.COUNT)
    assert [x.ev for x in arr.entries] == [_ev(i) for i in range(16)] and arr.profile_state is S.ONLINE
    # a QP pair bound to profile 7 moves data over exactly those source ports
    qa, qb = _qp(a, 7), _qp(b, 7)
    _rts(qa, b, qb.qp_num)
    _rts(qb, a, qa.qp_num)
    sports = sorted(s.entropy & 0xFFFF for s in qa.core.ev_states())
    assert sports == sorted(0xC100 + i for i in range(16))
    # deny EVs 4..7 on line: the bound QP stops using them, a QP bound later starts with them denied
    deny = [ctl.EvOpEntry(_ev(i), state=EVState.DENIED) for i in range(4, 8)]
    ctl.modify_ev_profile(a.ctx, 7, ctl.EvProfileAttr(ev_op=ctl.EvOp.MODIFY_EV_STATE, entries=deny), EM.EV_OP)
    denied = {s.entropy & 0xFFFF for s in qa.core.ev_states() if s.state is EVState.DENIED}
    assert denied == {0xC100 + i for i in range(4, 8)}
    later = _qp(a, 7)
    _rts(later, b, qb.qp_num)
    assert {s.entropy & 0xFFFF for s in later.core.ev_states() if s.state is EVState.DENIED} == denied
    probe = [ctl.EvOpEntry(_ev(i)) for i in (3, 4)]
    ctl.query_ev_profile(a.ctx, 7, ctl.EvProfileAttr(ev_op=ctl.EvOp.QUERY_EV_STATE, entries=probe), EM.EV_OP)
    assert [p.state for p in probe] == [EVState.GOOD, EVState.DENIED]
    with pytest.raises(ctl.CtlError) as e:
        ctl.query_ev_profile(
            a.ctx,
            7,
            ctl.EvProfileAttr(ev_op=ctl.EvOp.QUERY_EV_STATE, entries=[ctl.EvOpEntry(ctl.Ev.of(5, 2, 1))]),
            EM.EV_OP,
        )
    assert _code(e) == "ENOENT"
    # data still flows (on the EVs left) and arrives intact
    buf_a, buf_b = bytearray(random.Random(1).randbytes(1 << 16)), bytearray(1 << 16)
    mra = verbs.reg_mr(qa.pd, buf_a, 1)
    mrb = verbs.reg_mr(qb.pd, buf_b, 3)
    verbs.post_send(
        qa,
        verbs.SendWR(
            1, verbs.WrOpcode.RDMA_WRITE, [verbs.Sge(mra.addr, len(buf_a), mra.lkey)], mrb.addr, mrb.rkey
        ),
    )
    end = time.monotonic() + 20
    wcs: list[verbs.WorkCompletion] = []
    while not wcs and time.monotonic() < end:
        wcs = verbs.poll_cq(qa.send_cq, 1)
        verbs.poll_cq(qb.send_cq, 0)
    assert wcs and wcs[0].status == verbs.WcStatus.SUCCESS and buf_b == buf_a
    # ONLINE: fields and the array are fixed, and going OFFLINE waits for the QPs
    with pytest.raises(ctl.CtlError):
        ctl.modify_ev_profile(a.ctx, 7, ctl.EvProfileAttr(ev_count=8), EM.COUNT)
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_ev_profile(a.ctx, 7, ctl.EvProfileAttr(S.OFFLINE), EM.STATE)
    assert _code(e) == "EBUSY"
    with pytest.raises(ctl.CtlError) as e:  # nor can its format go OFFLINE under it
        ctl.modify_ev_fmt_profile(a.ctx, 3, ctl.EvFmtProfileAttr(S.OFFLINE), FM.STATE)
    assert _code(e) == "EBUSY"
    verbs.dereg_mr(mra)
    for qp in (qa, later):
        verbs.destroy_qp(qp)
    ctl.modify_ev_profile(a.ctx, 7, ctl.EvProfileAttr(S.OFFLINE), EM.STATE)
    with pytest.raises(verbs.VerbsError) as ve:  # an OFFLINE profile cannot be bound
        _qp(a, 7)
    assert "EV profile 7" in str(ve.value)


def test_generated_profile_with_a_denied_subset(nodes: tuple[Node, Node]) -> None:
    a, _ = nodes
    _udp_format(a, 4)
    fields = [EVField(width=16, init_val=0xC000, min_val=0x100, max_val=0x1FF, mask=0x01FF)]
    with pytest.raises(ctl.CtlError) as e:  # GEN needs its fields
        ctl.modify_ev_profile(
            a.ctx,
            11,
            ctl.EvProfileAttr(S.OFFLINE, ev_mode=EVProfileMode.GEN, ev_fmt_profile_id=4, ev_count=32),
            EM.STATE | EM.MODE | EM.FMT_ID | EM.COUNT,
        )
    assert "MODIFY_FIELDS" in str(e.value)
    ctl.modify_ev_profile(
        a.ctx,
        11,
        ctl.EvProfileAttr(ev_mode=EVProfileMode.GEN, ev_fmt_profile_id=4, ev_count=32),
        EM.MODE | EM.FMT_ID | EM.COUNT,
    )
    ctl.modify_ev_profile(
        a.ctx,
        11,
        ctl.EvProfileAttr(ev_fields_op=ctl.EvFieldsOp.MODIFY_FIELDS, fields=fields),
        EM.EV_FIELDS_OP,
    )
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_ev_profile(
            a.ctx,
            11,
            ctl.EvProfileAttr(ev_op=ctl.EvOp.QUERY_EV_ARRAY, ev_fields_op=ctl.EvFieldsOp.QUERY_FIELDS),
            EM.EV_OP | EM.EV_FIELDS_OP,
        )
    assert "mutually exclusive" in str(e.value)
    ctl.modify_ev_profile(a.ctx, 11, ctl.EvProfileAttr(S.OFFLINE), EM.STATE)
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_ev_profile(a.ctx, 11, ctl.EvProfileAttr(S.ONLINE), EM.STATE)
    assert "MIN_ACTIVE" in str(e.value) and "EVENT_MASK" in str(e.value)
    with pytest.raises(ctl.CtlError) as e:  # DENIED is not a state events can watch
        ctl.modify_ev_profile(a.ctx, 11, ctl.EvProfileAttr(ev_event_mask=4), EM.EVENT_MASK)
    assert "GOOD and ASSUMED_BAD" in str(e.value)
    ctl.modify_ev_profile(
        a.ctx, 11, ctl.EvProfileAttr(ev_min_active=8, ev_event_mask=2), EM.MIN_ACTIVE | EM.EVENT_MASK
    )
    ctl.modify_ev_profile(a.ctx, 11, ctl.EvProfileAttr(S.ONLINE), EM.STATE)
    arr = ctl.query_ev_profile(a.ctx, 11, ctl.EvProfileAttr(ev_op=ctl.EvOp.QUERY_EV_ARRAY), EM.EV_OP)
    values = [int.from_bytes(x.ev.val[:2], "big") for x in arr.entries]
    assert len(values) == 32 and all(0xC100 <= v <= 0xC1FF for v in values) and len(set(values)) == 32
    subset = [ctl.EvOpEntry(x.ev, state=EVState.DENIED) for x in arr.entries[:10]]
    ctl.modify_ev_profile(
        a.ctx, 11, ctl.EvProfileAttr(ev_op=ctl.EvOp.MODIFY_EV_STATE, entries=subset), EM.EV_OP
    )
    qp = _qp(a, 11)
    _rts(qp, nodes[1], 0x100)
    states = {s.entropy & 0xFFFF: s.state for s in qp.core.ev_states()}
    assert sum(1 for s in states.values() if s is EVState.DENIED) == 10
    assert all(states[v] is EVState.DENIED for v in values[:10])
    f = ctl.query_ev_profile(
        a.ctx, 11, ctl.EvProfileAttr(ev_fields_op=ctl.EvFieldsOp.QUERY_FIELDS), EM.EV_FIELDS_OP
    )
    assert f.fields == fields


# -- CC profiles -------------------------------------------------------------------------------------------
def test_cc_profile_state_machine(nodes: tuple[Node, Node]) -> None:
    a, _ = nodes
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_cc_profile(a.ctx, 5, ctl.CcProfileAttr(S.OFFLINE), CM.STATE)
    assert "ALGORITHM" in str(e.value)
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_cc_profile(
            a.ctx, 5, ctl.CcProfileAttr(S.OFFLINE, algorithm="cubic"), CM.STATE | CM.ALGORITHM
        )
    assert "uet-1.0-nscc" in str(e.value)
    ctl.modify_cc_profile(
        a.ctx, 5, ctl.CcProfileAttr(S.OFFLINE, algorithm="uet-1.0-nscc"), CM.STATE | CM.ALGORITHM
    )
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_cc_profile(a.ctx, 5, ctl.CcProfileAttr(S.ONLINE), CM.STATE)
    assert "CONFIG" in str(e.value)
    with pytest.raises(ctl.CtlError):  # a config of the wrong type is refused when the profile goes ONLINE
        ctl.modify_cc_profile(a.ctx, 5, ctl.CcProfileAttr(S.ONLINE, cc_config="fast"), CM.STATE | CM.CONFIG)
    cfg = NsccConfig.defaults(50_000_000_000, 200_000, 4096)
    ctl.modify_cc_profile(a.ctx, 5, ctl.CcProfileAttr(S.ONLINE, cc_config=cfg), CM.STATE | CM.CONFIG)
    q = ctl.query_cc_profile(a.ctx, 5, CM.STATE | CM.ALGORITHM | CM.CONFIG)
    assert (q.profile_state, q.algorithm, q.cc_config) == (S.ONLINE, "uet-1.0-nscc", cfg)
    qp = _qp(a, 0, 5)
    with pytest.raises(ctl.CtlError) as e:
        ctl.modify_cc_profile(a.ctx, 5, ctl.CcProfileAttr(S.OFFLINE), CM.STATE)
    assert _code(e) == "EBUSY"
    verbs.destroy_qp(qp)
    ctl.modify_cc_profile(a.ctx, 5, ctl.CcProfileAttr(S.OFFLINE), CM.STATE)
    ctl.modify_cc_profile(a.ctx, 5, ctl.CcProfileAttr(S.INIT), CM.STATE)
    assert ctl.query_cc_profile(a.ctx, 5, CM.STATE | CM.ALGORITHM).algorithm is None
    assert ctl.query_cc_profile(a.ctx, 0, CM.STATE).profile_state is S.ONLINE  # the NIC's own


# -- EV events and endpoint requests ------------------------------------------------------------------------
def test_ev_events_with_drop_counts(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    _udp_format(a)
    _explicit_profile(a)
    qp = _qp(a, 7)
    _rts(qp, b, 0x100)
    ch = verbs.create_comp_channel(a.ctx)
    ecq = ctl.create_ev_event_cq(a.ctx, 2, cq_context="evq", channel=ch)
    verbs.req_notify_cq(ecq)
    bad = [ctl.EvOpEntry(_ev(i), state=EVState.ASSUMED_BAD) for i in range(5)]
    ctl.modify_ev_profile(a.ctx, 7, ctl.EvProfileAttr(ev_op=ctl.EvOp.MODIFY_EV_STATE, entries=bad), EM.EV_OP)
    cq, context = verbs.get_cq_event(ch, timeout=2)
    assert cq is ecq and context == "evq"
    verbs.ack_cq_events(ecq, 1)
    got = ctl.poll_ev_event(ecq, 8)
    assert [(e.profile_id, e.ev, e.state, e.drop_count) for e in got] == [
        (7, _ev(0), EVState.ASSUMED_BAD, 0),
        (7, _ev(1), EVState.ASSUMED_BAD, 0),
    ]
    good = [ctl.EvOpEntry(_ev(0), state=EVState.GOOD)]
    ctl.modify_ev_profile(a.ctx, 7, ctl.EvProfileAttr(ev_op=ctl.EvOp.MODIFY_EV_STATE, entries=good), EM.EV_OP)
    (nxt,) = ctl.poll_ev_event(ecq, 8)
    assert (nxt.ev, nxt.state, nxt.drop_count, nxt.qp_num) == (_ev(0), EVState.GOOD, 3, qp.qp_num)
    verbs.destroy_qp(qp)
    verbs.destroy_cq(ecq)
    assert ecq._sink not in a.udp.nic.profiles.sinks


def test_endpoint_probe_batch(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    b.udp.start()
    peer = Peer.of(b.udp.endpoints())
    reqs = [ctl.EpReq(100 + p, peer, ctl.Ev.of(0xD000 + p, 2, p)) for p in (1, 2)]
    rsps = ctl.ep_batch_send_wait(a.ctx, 0, ctl.EpOpType.EV_PROBE, reqs, 2_000_000_000)
    assert sorted(r.req_id for r in rsps) == [101, 102] and all(r.rtt > 0 and r.adj_svc_time for r in rsps)
    assert {r.port for r in rsps} == {1, 2}
    # a request nobody answers: ETIMEDOUT, with the answers that did come
    nowhere = ctl.EpReq(200, "127.254.254.254", ctl.Ev.of(0xD100, 2, 1))
    with pytest.raises(ctl.CtlError) as e:
        ctl.ep_batch_send_wait(a.ctx, 0, ctl.EpOpType.EV_PROBE, [reqs[0], nowhere], 300_000_000)
    assert _code(e) == "ETIMEDOUT" and [r.req_id for r in e.value.responses] == [101]
    for bad_args in (
        (64, ctl.EpOpType.EV_PROBE, reqs),
        (0, ctl.EpOpType.EV_PROBE, [reqs[0], reqs[0]]),
        (0, ctl.EpOpType.EV_PROBE, [ctl.EpReq(1, peer, ctl.Ev.of(1, 2, 9))]),
    ):
        with pytest.raises(ctl.CtlError) as e:
            ctl.ep_batch_send_wait(a.ctx, *bad_args, 1000)  # type: ignore[arg-type]
        assert _code(e) == "EINVAL"


def test_probe_rtts_on_loopback_are_round_trips_not_progress_ticks(nodes: tuple[Node, Node]) -> None:
    """An RTT runs from the probe leaving to its answer arriving (the kernel's receive time), the far
    end's service time taken out: on loopback, well under the progress loop's millisecond waits, and
    not one figure for every probe of a batch (a round's time, as the first software NIC reported)."""
    a, b = nodes
    b.udp.start()
    peer = Peer.of(b.udp.endpoints())
    rtts = []
    for i in range(4):
        reqs = [ctl.EpReq(10 * i + p, peer, ctl.Ev.of(0xD000 + p, 2, p)) for p in (1, 2)]
        rtts += [r.rtt for r in ctl.ep_batch_send_wait(a.ctx, 0, ctl.EpOpType.EV_PROBE, reqs, 2_000_000_000)]
    b.udp.stop()
    assert all(r > 0 for r in rtts) and len(set(rtts)) > 1, rtts
    assert sorted(rtts)[len(rtts) // 2] < 500_000, rtts  # the median (µs on a quiet machine)


def test_binding_a_profile_the_device_cannot_carry_is_refused(nodes: tuple[Node, Node]) -> None:
    a, _ = nodes  # IPv4 endpoints: no flow label, so no STEV EVs
    ctl.modify_ev_fmt_profile(
        a.ctx,
        5,
        ctl.EvFmtProfileAttr(
            S.OFFLINE, ev_fmt_mode=EVFormatMode.STEV, op=ctl.EvFmtOp.MODIFY_FIELDS, fmt_fields=[16, 16]
        ),
        FM.STATE | FM.MODE | FM.OP,
    )
    ctl.modify_ev_fmt_profile(a.ctx, 5, ctl.EvFmtProfileAttr(S.ONLINE), FM.STATE)
    attr = ctl.EvProfileAttr(
        S.OFFLINE,
        ev_mode=EVProfileMode.EXP,
        ev_fmt_profile_id=5,
        ev_count=2,
        ev_min_active=1,
        ev_event_mask=0,
    )
    ctl.modify_ev_profile(
        a.ctx, 8, attr, EM.STATE | EM.MODE | EM.FMT_ID | EM.COUNT | EM.MIN_ACTIVE | EM.EVENT_MASK
    )
    evs = [ctl.EvOpEntry(ctl.EV_UNPOPULATED, ctl.Ev.of(0x0001_C000 + i, 4, 1 + i), flags=0) for i in range(2)]
    ctl.modify_ev_profile(a.ctx, 8, ctl.EvProfileAttr(ev_op=ctl.EvOp.REPLACE_EV, entries=evs), EM.EV_OP)
    ctl.modify_ev_profile(a.ctx, 8, ctl.EvProfileAttr(S.ONLINE), EM.STATE)
    with pytest.raises(verbs.VerbsError) as e:
        _qp(a, 8)
    assert e.value.errno_name == "EAFNOSUPPORT" and "IPv6" in str(e.value)
    qp = _qp(a, 0)  # bound to the NIC's own profile, then moved to the STEV one in INIT
    with pytest.raises(verbs.VerbsError):
        verbs.modify_qp(qp, None, 0, verbs.MrcQpAttr(ev_profile_id=8), verbs.MrcQpAttrMask.EV_PROFILE_ID)
    assert qp.state is verbs.QpState.INIT and qp.core.attr.ev_profile_id == 0
    assert verbs.query_qp(qp, 0, verbs.MrcQpAttrMask.EV_PROFILE_ID).mrc_attr.ev_profile_id == 0


# -- profiles shared between the processes of a node ----------------------------------------------------
_APP = r"""
import sys
from openmrc import verbs
from openmrc.provider import UdpDevice
from openmrc.transport import QpInitAttr, QpState
dev = UdpDevice([sys.argv[2], sys.argv[3]])
dev.use_profile_store(sys.argv[1])
def bind(ev, cc):
    qp = dev.create_qp()
    try:
        qp.modify(QpState.INIT, ev_profile_id=ev, cc_profile_id=cc)
        qp.modify(QpState.RTR, dest_qp_num=0x123, peer="peer", rq_psn=0, mpr_dest=8, max_wimm_dest=8)
    except Exception as exc:
        return f"refused {exc}"
    return qp
qp = bind(7, 5)
if isinstance(qp, str):
    sys.exit(f"first bind {qp}")
print("ports", *sorted(s.entropy & 0xFFFF for s in qp.ev_states()), flush=True)
import time
import weakref
for line in sys.stdin:
    if line.strip() == "denied":
        end = time.monotonic() + 5
        gone = []
        while not gone and time.monotonic() < end:  # the device looks at the store every 50 ms
            dev.progress(0.02)
            gone = sorted(s.entropy & 0xFFFF for s in qp.ev_states() if s.state.name == "DENIED")
        print("denied", *gone, flush=True)
    elif line.strip() == "bind":
        r = bind(7, 5)
        print("bind", r if isinstance(r, str) else "ok", flush=True)
    elif line.strip() == "destroy":
        dev.destroy_qp(qp)
        print("destroyed", flush=True)
dev.close()
"""


def test_profiles_reach_the_applications_of_other_processes(nodes: tuple[Node, Node], tmp_path: Path) -> None:
    a, _ = nodes
    store = tmp_path / "node" / "profiles.json"
    ctl.attach_store(a.ctx, store)
    _udp_format(a)
    _explicit_profile(a)  # EV profile 7, source ports 0xC100..
    cfg = NsccConfig.defaults(25_000_000_000, 200_000, 4096)
    ctl.modify_cc_profile(
        a.ctx,
        5,
        ctl.CcProfileAttr(S.OFFLINE, algorithm="uet-1.0-nscc", cc_config=cfg),
        CM.STATE | CM.ALGORITHM | CM.CONFIG,
    )
    ctl.modify_cc_profile(a.ctx, 5, ctl.CcProfileAttr(S.ONLINE), CM.STATE)
    net = _RNG.randrange(2, 250)
    app = subprocess.Popen(
        [sys.executable, "-c", _APP, str(store), f"127.{net}.33.1", f"127.{net}.33.2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert app.stdin is not None and app.stdout is not None
        line = app.stdout.readline().split()
        assert line[:1] == ["ports"], app.stderr.read() if app.stderr else ""
        assert [int(x) for x in line[1:]] == sorted(0xC100 + i for i in range(16))
        deny = [ctl.EvOpEntry(_ev(i), state=EVState.DENIED) for i in (2, 3)]
        ctl.modify_ev_profile(
            a.ctx, 7, ctl.EvProfileAttr(ev_op=ctl.EvOp.MODIFY_EV_STATE, entries=deny), EM.EV_OP
        )
        app.stdin.write("denied\n")
        app.stdin.flush()
        assert app.stdout.readline().split() == ["denied", str(0xC102), str(0xC103)]  # on its running QP
        # the application's QP binds profile 7 and CC profile 5: neither goes OFFLINE under it
        with pytest.raises(ctl.CtlError) as busy:
            ctl.modify_ev_profile(a.ctx, 7, ctl.EvProfileAttr(S.OFFLINE), EM.STATE)
        assert _code(busy) == "EBUSY" and f"(process {app.pid})" in str(busy.value)
        with pytest.raises(ctl.CtlError) as busy:
            ctl.modify_cc_profile(a.ctx, 5, ctl.CcProfileAttr(S.OFFLINE), CM.STATE)
        assert _code(busy) == "EBUSY" and f"(process {app.pid})" in str(busy.value)
        app.stdin.write("destroy\n")
        app.stdin.flush()
        assert app.stdout.readline().strip() == "destroyed"
        ctl.modify_ev_profile(a.ctx, 7, ctl.EvProfileAttr(S.OFFLINE), EM.STATE)  # no QP binds it now
        app.stdin.write("bind\n")
        app.stdin.flush()
        answer = app.stdout.readline()
        assert answer.startswith("bind refused") and "EV profile 7" in answer
    finally:
        if app.stdin is not None:
            app.stdin.close()
        app.wait(timeout=20)
    assert not list((store.parent / "profiles.json.users").glob("*.json"))  # its device closed: no record
    # a store that is not one is refused with its path
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(LocalProtocolError) as e:
        nodes[1].udp.use_profile_store(bad)
    assert "not a version-1 store" in str(e.value) and str(bad) in str(e.value)


def test_the_store_forgets_the_users_of_processes_that_exited(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "p.json")
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(gone.stdout)
    store.write_users({"ev": {7: [0x11, 0x12]}, "cc": {}}, pid=dead)
    store.write_users({"ev": {7: [0x21]}, "cc": {5: [0x21]}}, pid=os.getppid())  # a running process
    store.write_users({"ev": {7: [0x31]}, "cc": {}})  # this process's own QPs are not foreign users
    assert store.users("ev", 7) == [(os.getppid(), 0x21)]
    assert store.users("cc", 5) == [(os.getppid(), 0x21)] and store.users("ev", 8) == []
    assert not (store.users_dir / f"{dead}.json").exists()
    store.write_users({"ev": {}, "cc": {}})  # nothing bound any more: the record goes
    assert not (store.users_dir / f"{os.getpid()}.json").exists()
