"""`openmrc.verbs.qp_attr`: `modify_qp`'s rules are the transport's state machine. Every (from, to) pair of
QP states is walked twice: against the transport's own `Qp.modify` (which attributes it requires, takes and
refuses) and against `modify_qp` (which mask bits it requires, takes and refuses), so that the two cannot
disagree; and the table ``docs/verbs.md`` shows is the one `modify_qp` applies."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from openmrc import verbs as v
from openmrc.provider import Peer, UdpDevice
from openmrc.transport import TRANSITIONS, LocalProtocolError, Nic, QpCapFlags, QpSecurity, SecurityDomain
from openmrc.transport import Qp as CoreQp
from openmrc.transport import QpAttr as CoreQpAttr
from openmrc.transport import QpInitAttr as CoreQpInitAttr
from openmrc.verbs.qp_attr import _MRC_H, _UNSUPPORTED_VATTR, ATTR_BITS, OWN_FIELDS, RULES, AttrBit

S = v.QpState
V, M = v.QpAttrMask, v.MrcQpAttrMask
PAIRS = [(a, b) for a in S for b in S]
PAIR_IDS = [f"{a.name}-{b.name}" for a, b in PAIRS]
DOMAIN = SecurityDomain.generate(1)

#: A valid value of every transport attribute.
CORE_VALUES: dict[str, Any] = {
    "peer": "b",
    "dest_qp_num": 0x123,
    "rq_psn": 0,
    "sq_psn": 0,
    "mpr": 8,
    "mpr_dest": 8,
    "max_wimm": 8,
    "max_wimm_dest": 8,
    "timeout": 14,
    "ev_profile_id": 0,
    "cc_profile_id": 0,
    "retry_linear": 7,
    "retry_exp": 7,
    "qp_hint": "a hint",
    "cap": QpCapFlags.DYNAMIC_MPR,
    "security": QpSecurity(DOMAIN),
}
#: The mask bits `modify_qp` can be given (the states and the unsupported verbs attributes aside).
BITS: list[AttrBit] = [b for b in V if b and b not in (V.STATE, V.CUR_STATE) and b not in _UNSUPPORTED_VATTR]
BITS += [b for b in M if b]
#: The bits mrc.h asks for or allows on top of the transport's table.
MRC_H_BITS = {(type(bit), bit) for _, bit, _ in _MRC_H}


def _key(bit: AttrBit) -> tuple[type, int]:
    return type(bit), int(bit)  # (a QpAttrMask and an MrcQpAttrMask bit may have the same value)


def _carried(bit: AttrBit) -> list[str]:
    """The transport attributes ``bit`` carries."""
    return [name for name, (b, _) in ATTR_BITS.items() if _key(b) == _key(bit)]


# -- the transport ------------------------------------------------------------------------------------------
def _core_qp(state: S) -> CoreQp:
    """A transport QP driven to ``state`` (ERROR straight from RESET), on a NIC of its own."""
    nic = Nic(2, rng=random.Random(1))
    qp = nic.create_qp(CoreQpInitAttr(send_cq=nic.create_cq(), recv_cq=nic.create_cq()))
    if state is S.ERROR:
        qp.modify(S.ERROR)
    for to, names in (
        (S.INIT, ("ev_profile_id", "cc_profile_id")),
        (S.RTR, ("dest_qp_num", "peer", "rq_psn", "mpr_dest", "max_wimm_dest")),
        (S.RTS, ("sq_psn", "mpr", "max_wimm", "timeout", "retry_linear", "retry_exp")),
    ):
        if qp.state is state:
            break
        qp.modify(to, **{n: CORE_VALUES[n] for n in names})
    assert qp.state is state
    return qp


def _core_takes(frm: S, to: S, names: set[str]) -> bool:
    """Whether the transport's `Qp.modify` takes ``frm -> to`` with ``names`` given."""
    try:
        _core_qp(frm).modify(to, **{n: CORE_VALUES[n] for n in names})
    except LocalProtocolError:
        return False
    return True


def test_the_map_names_every_transport_attribute_once() -> None:
    assert set(ATTR_BITS) == {f.name for f in fields(CoreQpAttr)} == set(CORE_VALUES)
    verbs_fields = [f for _, f in ATTR_BITS.values()] + [f for _, f in OWN_FIELDS]
    assert len(set(verbs_fields)) == len(verbs_fields)
    assert set(verbs_fields) == {f.name for f in fields(v.QpAttr) if "state" not in f.name} | {
        f.name for f in fields(v.MrcQpAttr)
    }


@pytest.mark.parametrize(("frm", "to"), PAIRS, ids=PAIR_IDS)
def test_the_rules_are_what_the_transport_does(frm: S, to: S) -> None:
    """Probing `Qp.modify` attribute by attribute: a transition `modify_qp` has is one the transport has; an
    attribute the transport requires is a bit `modify_qp` requires, one it takes a bit it takes, one it
    refuses a bit it refuses, but for mrc.h's additions (`_MRC_H`)."""
    if (frm, to) not in TRANSITIONS:
        assert (frm, to) not in RULES
        assert not _core_takes(frm, to, set())
        return
    v_req, v_opt, m_req, m_opt = RULES[frm, to]
    required = {_key(b) for b in BITS if (v_req if isinstance(b, V) else m_req) & b}
    allowed = required | {_key(b) for b in BITS if (v_opt if isinstance(b, V) else m_opt) & b}
    base = set(TRANSITIONS[frm, to][0])
    assert _core_takes(frm, to, base)
    for name, (bit, _) in ATTR_BITS.items():
        if name in base:
            assert frm is to or not _core_takes(frm, to, base - {name}), name
            assert _key(bit) in required, name
        elif _core_takes(frm, to, base | {name}):
            assert _key(bit) in allowed, name
        else:
            assert _key(bit) not in allowed or _key(bit) in MRC_H_BITS, name
    transport_required = {_key(ATTR_BITS[n][0]) for n in base}
    assert required <= transport_required | MRC_H_BITS


# -- modify_qp ----------------------------------------------------------------------------------------------
Ctx = tuple[v.Context, v.Cq, v.ProtectionDomain, Peer, v.QpHint]


@pytest.fixture(scope="module")
def ctx() -> Iterator[Ctx]:
    rng = random.Random()
    x, y = rng.randrange(1, 255), rng.randrange(0, 250)
    dev = UdpDevice([f"127.{x}.{y}.{p}" for p in (1, 2)])
    name = f"mrc-rules-{rng.randrange(1 << 30)}"
    v.add_device(name, dev)
    device = v.open_device(name)
    context = v.create_context(device)
    cq = v.create_cq(context, 1024)
    pd = v.alloc_pd(device)
    try:
        yield context, cq, pd, Peer.of([f"127.{x}.{y + 1}.{p}" for p in (1, 2)]), v.create_qp_hint(context)
    finally:
        for qp in list(context.qps):
            v.destroy_qp(qp)
        for hint in list(context.hints):
            v.destroy_qp_hint(hint)
        v.destroy_cq(cq)
        v.dealloc_pd(pd)
        v.destroy_context(context)
        v.close_device(device)
        v.remove_device(name)
        dev.close()


def _attrs(c: Ctx, to: S) -> tuple[v.QpAttr, v.MrcQpAttr]:
    """A valid value of every attribute ``modify_qp`` takes, moving to ``to``."""
    _context, _cq, _pd, peer, hint = c
    attr = v.QpAttr(
        qp_state=to,
        ah_attr=peer,
        dest_qp_num=0x123,
        rq_psn=0,
        sq_psn=0,
        path_mtu=1,
        qp_access_flags=v.Access.LOCAL_WRITE,
        pkey_index=0,
    )
    mrc = v.MrcQpAttr(
        mpr=8,
        mpr_dest=8,
        max_wimm=8,
        max_wimm_dest=8,
        timeout=14,
        ev_profile_id=0,
        cc_profile_id=0,
        linear_cnt=7,
        exp_cnt=7,
        qp_hint=hint,
        cap=QpCapFlags.DYNAMIC_MPR,
        vendor_cfg=b"cfg",
        security=QpSecurity(DOMAIN),
    )
    return attr, mrc


def _modify(c: Ctx, qp: v.Qp, to: S, bits: list[AttrBit]) -> None:
    attr, mrc = _attrs(c, to)
    vm = sum(int(b) for b in bits if isinstance(b, V))
    mm = sum(int(b) for b in bits if isinstance(b, M))
    v.modify_qp(qp, attr, V.STATE | vm, mrc, mm)


def _verbs_qp(c: Ctx, state: S) -> v.Qp:
    """A verbs QP driven to ``state`` (ERROR straight from RESET)."""
    context, cq, pd, _peer, _hint = c
    qp = v.create_qp(context, v.QpInitAttr(send_cq=cq, recv_cq=cq, pd=pd))
    if state is S.ERROR:
        _modify(c, qp, S.ERROR, [])
    for to, bits in (
        (S.INIT, [M.EV_PROFILE_ID, M.CC_PROFILE_ID, M.HINT]),
        (S.RTR, [V.AV, V.DEST_QPN, V.RQ_PSN, M.MPR_DEST, M.MAX_WIMM_DEST]),
        (S.RTS, [V.SQ_PSN, M.MPR, M.MAX_WIMM, M.TIMEOUT, M.RETRY_CNT]),
    ):
        if qp.state is state:
            break
        _modify(c, qp, to, bits)
    assert qp.state is state
    return qp


def _refused(c: Ctx, qp: v.Qp, to: S, bits: list[AttrBit]) -> str:
    with pytest.raises(v.VerbsError) as e:
        _modify(c, qp, to, bits)
    assert e.value.errno_name == "EINVAL"
    return str(e.value)


@pytest.mark.parametrize(("frm", "to"), PAIRS, ids=PAIR_IDS)
def test_modify_qp_takes_exactly_the_derived_masks(ctx: Ctx, frm: S, to: S) -> None:
    """With the required bits the transition is made; without any one of them it is refused naming it; an
    optional bit is taken; any other bit is refused naming it; and a transition the table does not have is
    refused whatever is given. A refusal changes nothing."""
    rule = RULES.get((frm, to))
    qp = _verbs_qp(ctx, frm)
    if rule is None:
        assert f"illegal QP transition {frm.name} -> {to.name}" in _refused(ctx, qp, to, [])
        assert qp.state is frm
        v.destroy_qp(qp)
        return
    v_req, v_opt, m_req, m_opt = rule
    required = [b for b in BITS if (v_req if isinstance(b, V) else m_req) & b]
    optional = [b for b in BITS if (v_opt if isinstance(b, V) else m_opt) & b]
    for bit in required:
        reason = _refused(ctx, qp, to, [b for b in required if b is not bit])
        assert f"{frm.name} -> {to.name} needs" in reason and re.search(rf"\b{bit.name}\b", reason)
    for bit in BITS:
        if bit not in required and bit not in optional:
            reason = _refused(ctx, qp, to, [*required, bit])
            assert f"not allowed on {frm.name} -> {to.name}" in reason
            assert re.search(rf"\b{bit.name}\b", reason)
    assert qp.state is frm
    _modify(ctx, qp, to, required)
    assert qp.state is to
    v.destroy_qp(qp)
    for bit in optional:
        qp = _verbs_qp(ctx, frm)
        _modify(ctx, qp, to, [*required, bit])
        assert qp.state is to, bit
        v.destroy_qp(qp)


def test_the_docs_show_the_rules() -> None:
    """``docs/verbs.md``'s table of the QP state machine: each row's required and (optional) bits."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "verbs.md").read_text()
    section = docs[docs.index("## The QP state machine") :]
    shown: dict[tuple[S, S], tuple[set[str], set[str], set[str], set[str]]] = {}
    for row in re.findall(r"^\| (\w+) → (\w+) \| (.*) \| (.*) \|$", section, re.M):
        frm, to, verbs_cell, mrc_cell = row
        shown[S[frm], S[to]] = (*_cell(verbs_cell), *_cell(mrc_cell))
    assert "| any → ERROR, any → RESET | — | — |" in section
    derived = {
        pair: (
            {b.name or "" for b in V if b & rule[0]},
            {b.name or "" for b in V if b & rule[1]},
            {b.name or "" for b in M if b & rule[2]},
            {b.name or "" for b in M if b & rule[3]},
        )
        for pair, rule in RULES.items()
        if any(rule)
    }
    assert shown == derived
    assert all(not any(RULES[pair]) for pair in RULES if pair[1] in (S.ERROR, S.RESET))


def _cell(text: str) -> tuple[set[str], set[str]]:
    """ "AV (the peer), DEST_QPN (PATH_MTU, ACCESS_FLAGS)" -> ({AV, DEST_QPN}, {PATH_MTU, ACCESS_FLAGS})."""
    text = text.replace("(the peer)", "")
    optional = re.findall(r"\(([^)]*)\)", text)
    required = re.sub(r"\([^)]*\)", "", text)

    def names(s: str) -> set[str]:
        return {n.strip() for n in s.split(",") if n.strip()}

    return names(required), names(optional[0]) if optional else set()
