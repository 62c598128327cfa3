"""`openmrc.ctl.machine`: the one profile state machine, walked through the public API. For each profile kind
(EV format, EV, CC), a profile is brought to every state and asked every operation, by every call that asks
it; what the table allows succeeds and leaves the profile in the state the table names, what it refuses
raises with the table's errno and reason."""

from __future__ import annotations

import errno
import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from openmrc import ctl, verbs
from openmrc.ctl.machine import TABLE, ProfileOp, Refusal
from openmrc.ev import EVFormatMode, EVProfileMode, EVState
from openmrc.provider import UdpDevice

S = ctl.ProfileState
FM = ctl.EvFmtProfileAttrMask
EM = ctl.EvProfileAttrMask
CM = ctl.CcProfileAttrMask
_RNG = random.Random()
_FMT = 1  # the ONLINE format the EV profiles use


@pytest.fixture
def ctx() -> Iterator[verbs.Context]:
    x, y = _RNG.randrange(1, 255), _RNG.randrange(0, 250)
    udp = UdpDevice([f"127.{x}.{y}.1", f"127.{x}.{y}.2"])
    name = f"ctl-machine-{_RNG.randrange(1 << 40)}"
    verbs.add_device(name, udp)
    try:
        dev = verbs.open_device(name)
        c = verbs.create_context(dev)
        ctl.grant(dev)
        yield c
    finally:
        verbs.remove_device(name)
        udp.close()


def _ev(i: int) -> ctl.Ev:
    return ctl.Ev.of(0xC100 + i, 2, 1 + i % 2)


Call = Callable[[verbs.Context, int], object]


@dataclass
class Kind:
    """How to reach each state and ask each operation of one kind of profile through `openmrc.ctl`."""

    what: str
    stage: Call  # in INIT: everything the moves to OFFLINE and ONLINE need
    move: Callable[[verbs.Context, int, ctl.ProfileState], None]
    state: Callable[[verbs.Context, int], ctl.ProfileState]
    calls: dict[ProfileOp, list[tuple[str, Call]]]  # besides the moves: (the names a refusal gives, call)


def _fmt_modify(attr: ctl.EvFmtProfileAttr, mask: int) -> Call:
    return lambda c, pid: ctl.modify_ev_fmt_profile(c, pid, attr, mask)


def _ev_modify(attr: ctl.EvProfileAttr, mask: int) -> Call:
    return lambda c, pid: ctl.modify_ev_profile(c, pid, attr, mask)


def _cc_modify(attr: ctl.CcProfileAttr, mask: int) -> Call:
    return lambda c, pid: ctl.modify_cc_profile(c, pid, attr, mask)


def _stage_ev(c: verbs.Context, pid: int) -> None:
    ctl.modify_ev_profile(
        c,
        pid,
        ctl.EvProfileAttr(
            ev_mode=EVProfileMode.EXP, ev_fmt_profile_id=_FMT, ev_count=2, ev_min_active=1, ev_event_mask=3
        ),
        EM.MODE | EM.FMT_ID | EM.COUNT | EM.MIN_ACTIVE | EM.EVENT_MASK,
    )
    entries = [ctl.EvOpEntry(ctl.EV_UNPOPULATED, _ev(i)) for i in range(2)]
    ctl.modify_ev_profile(c, pid, ctl.EvProfileAttr(ev_op=ctl.EvOp.REPLACE_EV, entries=entries), EM.EV_OP)


def _ev_entries(op: ctl.EvOp, **kw: object) -> ctl.EvProfileAttr:
    return ctl.EvProfileAttr(ev_op=op, entries=[ctl.EvOpEntry(_ev(0), **kw)])  # type: ignore[arg-type]


FORMAT = Kind(
    "EV format profile",
    _fmt_modify(
        ctl.EvFmtProfileAttr(ev_fmt_mode=EVFormatMode.UDP, op=ctl.EvFmtOp.MODIFY_FIELDS, fmt_fields=[16]),
        FM.MODE | FM.OP,
    ),
    lambda c, pid, st: ctl.modify_ev_fmt_profile(c, pid, ctl.EvFmtProfileAttr(st), FM.STATE),
    lambda c, pid: ctl.query_ev_fmt_profile(c, pid, FM.STATE).profile_state or S.INIT,
    {
        ProfileOp.CONFIGURE: [
            ("MODE", _fmt_modify(ctl.EvFmtProfileAttr(ev_fmt_mode=EVFormatMode.UDP), FM.MODE)),
            (
                "its fields (MODIFY_FIELDS)",
                _fmt_modify(ctl.EvFmtProfileAttr(op=ctl.EvFmtOp.MODIFY_FIELDS, fmt_fields=[16]), FM.OP),
            ),
        ],
        ProfileOp.ADJUST: [("VENDOR_CFG", _fmt_modify(ctl.EvFmtProfileAttr(vendor_cfg=b"v"), FM.VENDOR_CFG))],
        ProfileOp.QUERY: [
            ("QUERY_FIELDS", _fmt_modify(ctl.EvFmtProfileAttr(op=ctl.EvFmtOp.QUERY_FIELDS), FM.OP)),
            ("", lambda c, pid: ctl.query_ev_fmt_profile(c, pid, FM.STATE | FM.MODE | FM.OP)),
        ],
    },
)

EV = Kind(
    "EV profile",
    _stage_ev,
    lambda c, pid, st: ctl.modify_ev_profile(c, pid, ctl.EvProfileAttr(st), EM.STATE),
    lambda c, pid: ctl.query_ev_profile(c, pid, ctl.EvProfileAttr(), EM.STATE).profile_state or S.INIT,
    {
        ProfileOp.CONFIGURE: [
            ("MODE", _ev_modify(ctl.EvProfileAttr(ev_mode=EVProfileMode.EXP), EM.MODE)),
            ("FMT_ID", _ev_modify(ctl.EvProfileAttr(ev_fmt_profile_id=_FMT), EM.FMT_ID)),
            ("COUNT", _ev_modify(ctl.EvProfileAttr(ev_count=2), EM.COUNT)),
            ("MIN_ACTIVE", _ev_modify(ctl.EvProfileAttr(ev_min_active=1), EM.MIN_ACTIVE)),
            ("EVENT_MASK", _ev_modify(ctl.EvProfileAttr(ev_event_mask=3), EM.EVENT_MASK)),
            ("VENDOR_CFG", _ev_modify(ctl.EvProfileAttr(vendor_cfg=b"v"), EM.VENDOR_CFG)),
            (
                "MIN_ACTIVE, EVENT_MASK",
                _ev_modify(
                    ctl.EvProfileAttr(ev_min_active=1, ev_event_mask=3), EM.MIN_ACTIVE | EM.EVENT_MASK
                ),
            ),
            (
                "its fields (MODIFY_FIELDS)",
                _ev_modify(ctl.EvProfileAttr(ev_fields_op=ctl.EvFieldsOp.MODIFY_FIELDS), EM.EV_FIELDS_OP),
            ),
            (
                "its EVs (REPLACE_EV)",
                _ev_modify(_ev_entries(ctl.EvOp.REPLACE_EV, ev_new=_ev(0)), EM.EV_OP),
            ),
        ],
        ProfileOp.ADJUST: [
            (
                "MODIFY_EV_STATE",
                _ev_modify(_ev_entries(ctl.EvOp.MODIFY_EV_STATE, state=EVState.GOOD), EM.EV_OP),
            )
        ],
        ProfileOp.QUERY: [
            (
                "QUERY_FIELDS",
                _ev_modify(ctl.EvProfileAttr(ev_fields_op=ctl.EvFieldsOp.QUERY_FIELDS), EM.EV_FIELDS_OP),
            ),
            ("QUERY_EV_ARRAY", _ev_modify(ctl.EvProfileAttr(ev_op=ctl.EvOp.QUERY_EV_ARRAY), EM.EV_OP)),
            ("QUERY_EV_STATE", _ev_modify(_ev_entries(ctl.EvOp.QUERY_EV_STATE), EM.EV_OP)),
            (
                "",
                lambda c, pid: ctl.query_ev_profile(
                    c, pid, ctl.EvProfileAttr(ev_op=ctl.EvOp.QUERY_EV_ARRAY), EM.STATE | EM.COUNT | EM.EV_OP
                ),
            ),
        ],
    },
)

CC = Kind(
    "CC profile",
    _cc_modify(ctl.CcProfileAttr(algorithm="uet-1.0-nscc", cc_config=None), CM.ALGORITHM | CM.CONFIG),
    lambda c, pid, st: ctl.modify_cc_profile(c, pid, ctl.CcProfileAttr(st), CM.STATE),
    lambda c, pid: ctl.query_cc_profile(c, pid, CM.STATE).profile_state or S.INIT,
    {
        ProfileOp.CONFIGURE: [
            ("ALGORITHM", _cc_modify(ctl.CcProfileAttr(algorithm="uet-1.0-nscc"), CM.ALGORITHM)),
            ("CONFIG", _cc_modify(ctl.CcProfileAttr(cc_config=None), CM.CONFIG)),
            ("VENDOR_CFG", _cc_modify(ctl.CcProfileAttr(vendor_cfg=b"v"), CM.VENDOR_CFG)),
            (
                "ALGORITHM, CONFIG",
                _cc_modify(
                    ctl.CcProfileAttr(algorithm="uet-1.0-nscc", cc_config=None), CM.ALGORITHM | CM.CONFIG
                ),
            ),
        ],
        ProfileOp.ADJUST: [],  # a CC profile has nothing that changes on line
        ProfileOp.QUERY: [
            ("", lambda c, pid: ctl.query_cc_profile(c, pid, CM.STATE | CM.ALGORITHM | CM.CONFIG)),
        ],
    },
)

_MOVES = {ProfileOp.TO_INIT: S.INIT, ProfileOp.TO_OFFLINE: S.OFFLINE, ProfileOp.TO_ONLINE: S.ONLINE}


def test_the_table_is_complete() -> None:
    assert set(TABLE) == set(itertools.product(S, ProfileOp))
    assert set(_MOVES) | {ProfileOp.CONFIGURE, ProfileOp.ADJUST, ProfileOp.QUERY} == set(ProfileOp)


def test_the_table_is_mrc_ctl_h_s_state_machine() -> None:
    """INIT -> OFFLINE -> ONLINE -> OFFLINE -> INIT one step at a time (staying put is no step); nothing
    that defines a profile changes while it is ONLINE; on-line changes and reads are always allowed."""
    steps = {(S.INIT, S.OFFLINE), (S.OFFLINE, S.ONLINE), (S.ONLINE, S.OFFLINE), (S.OFFLINE, S.INIT)}
    for cur, (op, new) in itertools.product(S, _MOVES.items()):
        allowed = cur is new or (cur, new) in steps
        assert TABLE[cur, op] == (
            new if allowed else Refusal(errno.EINVAL, TABLE[S.INIT, ProfileOp.TO_ONLINE][1])
        )
    for cur in S:
        refused = cur is S.ONLINE
        assert isinstance(TABLE[cur, ProfileOp.CONFIGURE], Refusal) is refused
        assert TABLE[cur, ProfileOp.ADJUST] is TABLE[cur, ProfileOp.QUERY] is cur


def _reach(kind: Kind, c: verbs.Context, pid: int, state: ctl.ProfileState) -> None:
    kind.stage(c, pid)
    for step in (S.OFFLINE, S.ONLINE):
        if step <= state:
            kind.move(c, pid, step)
    assert kind.state(c, pid) is state


@pytest.mark.parametrize("kind", [FORMAT, EV, CC], ids=lambda k: k.what)
def test_every_state_and_operation_follows_the_table(ctx: verbs.Context, kind: Kind) -> None:
    if kind is EV:
        FORMAT.stage(ctx, _FMT)
        FORMAT.move(ctx, _FMT, S.OFFLINE)
        FORMAT.move(ctx, _FMT, S.ONLINE)
    pids = itertools.count(100)
    for state, op in itertools.product(S, ProfileOp):
        if op in _MOVES:
            target = _MOVES[op]
            cases: list[tuple[str, Call]] = [
                ("", lambda c, pid, t=target: kind.move(c, pid, t))  # type: ignore[misc]
            ]
        else:
            cases = kind.calls[op]
        for names, call in cases:
            pid = next(pids)
            _reach(kind, ctx, pid, state)
            after = TABLE[state, op]
            what = f"{kind.what} {pid}"
            if isinstance(after, Refusal):
                with pytest.raises(ctl.CtlError) as e:
                    call(ctx, pid)
                new = _MOVES[op].name if op in _MOVES else ""
                reason = after.reason.format(what=what, cur=state.name, new=new, names=names)
                assert (e.value.errno, e.value.reason) == (after.errno, reason), (state, op, names)
                assert kind.state(ctx, pid) is state  # a refused call changes nothing
            else:
                call(ctx, pid)
                assert kind.state(ctx, pid) is after, (state, op, names)
