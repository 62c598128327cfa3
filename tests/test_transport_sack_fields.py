"""SACKs carried by their fields (`SackTransmit`): the same bytes as a SACK `Packet` built header by header,
and the same requester state whether the SACK arrives by its fields or as a parsed `Packet`."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openmrc.transport import SackTransmit, Transmit, WcStatus
from openmrc.transport.types import sack_of_words
from openmrc.wire import BTH, SETH, CcState, Opcode, Packet, SackM, parse

from .helpers import Pair
from .test_transport_timers import run_checked
from .transport_tools import deliver_sack, statuses

_FIELDS = st.tuples(
    st.integers(0, (1 << 24) - 1),  # qp_num
    st.integers(0, (1 << 24) - 1),  # dest_qp
    st.integers(0, (1 << 24) - 1),  # cack_psn
    st.integers(-0x8000, 0x7FFF),  # ack_psn_offset
    st.integers(-0x8000, 0x7FFF),  # sack_offset
    st.integers(0, (1 << 64) - 1),  # bitmap
    st.integers(0, (1 << 32) - 1),  # echo
    st.sampled_from(list(SackM)),  # m
    st.booleans(),  # pr
    st.integers(0, 255),  # mpr
    st.integers(0, 0xFFFF),  # ts_echo
    st.integers(0, 0x7FFF),  # ooo_count
    st.integers(0, 0xFFFFFF),  # rcvd_256b
)


def header_by_header(f: tuple[Any, ...]) -> Packet:
    """A SACK as the responder built it before SACKs were carried by their fields."""
    src, dqp, cack, apo, so, bm, echo, m, pr, mpr, ts, ooo, rcvd = f
    return Packet(
        BTH(Opcode.SACK, dest_qp=dqp, psn=cack),
        seth=SETH(0, 0, m, pr, apo, echo, src & 0xFFFF, dqp & 0xFFFF, cack, 1, 0, mpr, so, bm),
        cc_state=CcState(ts, ooo, False, 0, rcvd),
    )


@given(_FIELDS)
def test_a_sack_by_its_fields_encodes_to_the_bytes_of_one_built_header_by_header(f: tuple[Any, ...]) -> None:
    t = SackTransmit(*f)
    assert not t.has_packet() and not t.is_data and t.payload_len() == 0  # told without a Packet
    assert t.qp_num == f[0]
    old = header_by_header(f)
    assert t.packet == old
    assert t.packet.encode() == old.encode()
    assert parse(t.packet.encode()) == parse(old.encode())


_SACK_NAMES = (
    "qp_num", "dest_qp", "cack_psn", "ack_psn_offset", "sack_offset", "bitmap", "echo", "m", "pr", "mpr",
    "ts_echo", "ooo_count", "rcvd_256b",
)  # fmt: skip


@given(_FIELDS)
def test_a_sack_made_again_of_its_packed_words_has_every_field_it_had(f: tuple[Any, ...]) -> None:
    t = SackTransmit(*f)
    again = sack_of_words(t.qp_num, t.psn, t.op, t.va, t.qps_word, t.sack_offset, t.pr)
    assert [getattr(again, n) for n in _SACK_NAMES] == [getattr(t, n) for n in _SACK_NAMES] == list(f)
    assert again.packet.encode() == t.packet.encode()


_BOUNDS = (1 << 55, 1 << 58, 1 << 64, 1 << 56)  # psn, op, va, qps_word (svc in its top byte)


@pytest.mark.parametrize("word", range(4), ids=["psn", "op", "va", "qps"])
@pytest.mark.parametrize("beyond", [False, True], ids=["negative", "too-wide"])
def test_a_packed_word_beyond_its_fields_is_refused(word: int, beyond: bool) -> None:
    t = SackTransmit(0x33, 0x12, 77, -3, 2, (1 << 64) - 2, 0xABCD, 1, True, 64, 5, 2, 0xFFFFFF)
    words = [t.psn, t.op, t.va, t.qps_word]
    sack_of_words(t.qp_num, *words, t.sack_offset, t.pr)  # as they are: fine
    words[word] = _BOUNDS[word] if beyond else -1
    with pytest.raises(ValueError, match="outside its fields' widths"):
        sack_of_words(t.qp_num, *words, t.sack_offset, t.pr)


def requester_state(p: Pair) -> tuple[Any, ...]:
    r = p.qp_a.requester
    rec = r.rec
    evs = p.qp_a.evs
    assert evs is not None
    return (
        p.qp_a.state,
        r.cack, sorted(r.outstanding), rec.inflight, r.next_seq, list(rec.by_order), sorted(rec.retx),
        rec.acked_order, rec.srtt, rec.rttvar, rec.rtt_min, r.peer_mpr, rec.congested_at, rec.timeouts,
        r.blocked, rec.rto_deadline, rec.check_deadline, rec.rack_order, rec.reo_learned, sorted(rec.judging),
        [(t.lost, t.suspect is not None) for t in r.outstanding.values()],
        [(e.state, e.skip_epoch, e.probe_ok, e.probe_out) for e in evs.entries],
        dataclasses.asdict(p.a.stats), p.a.get_timer(),
    )  # fmt: skip


def running_pair() -> Pair:
    p = Pair(buf_size=1 << 20)
    p.write(0, 1 << 20)
    for _ in range(3):
        p.step()
    return p


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(-1200, 1200),  # cack, relative to the requester's
    st.integers(-0x8000, 0x7FFF),
    st.integers(-200, 200),  # sack_offset
    st.integers(0, (1 << 64) - 1),
    st.integers(0, 40),  # EV index (past the rotation: an unknown entropy)
    st.sampled_from(list(SackM)),
    st.booleans(),
    st.sampled_from(["ok", "src", "dst", "seth-dst"]),  # right QP numbers, or a wrong one
    st.integers(0, 16),
    st.booleans(),  # a probe outstanding on the EV
)
def test_on_sack_by_fields_and_by_parsed_packet_reach_the_same_state(
    rel: int, apo: int, so: int, bm: int, ev: int, m: SackM, pr: bool, qps: str, mpr: int, probing: bool
) -> None:
    got = []
    for via in ("packet", "fields"):
        p = running_pair()
        r = p.qp_a.requester
        evs = p.qp_a.evs
        assert evs is not None
        entropy = evs.entries[ev].entropy if ev < len(evs.entries) else 0x12345678
        if probing and ev < len(evs.entries):
            evs.entries[ev].probe_out = True
        src, dest = p.qp_b.qp_num, p.qp_a.qp_num
        dst = dest & 0xFFFF
        if qps == "src":
            src ^= 0x0101
        elif qps == "dst":  # another QP number: no such QP at the NIC
            dest ^= 0x0101
            dst = dest & 0xFFFF
        elif qps == "seth-dst":  # the right QP, the wrong SETH number: the requester drops it
            dst ^= 0x0101
        cack = (r.cack + rel) & 0xFFFFFF
        pkt = Packet(
            BTH(Opcode.SACK, dest_qp=dest, psn=cack),
            seth=SETH(0, 0, m, pr, apo, entropy, src & 0xFFFF, dst, cack, 1, 0, mpr, so, bm),
            cc_state=CcState(),
        )
        p.now += 3_000
        deliver_sack(p, pkt, via)
        got.append(requester_state(p))
    assert got[0] == got[1]


@pytest.mark.parametrize("via", ["packet", "fields"])
def test_a_transfer_completes_with_sacks_from_either_entry_point(via: str) -> None:
    """Every SACK the responder emits crosses to the requester by one entry point: the Write completes."""
    p = Pair(buf_size=1 << 18)
    p.write(0, 1 << 18)
    sacks = 0
    fabric_send = p.fabric.send

    def send(src: Any, dst: Any, t: Transmit, now: int, name: str) -> None:
        nonlocal sacks
        if isinstance(t, SackTransmit) and via == "fields":
            sacks += 1
            assert not t.has_packet()  # nothing on the way built one
            dst.receive_transmit(t, t.port, now, False, t.entropy, src=name)  # no latency: delivered now
            return
        fabric_send(src, dst, t, now, name)

    p.fabric.send = send  # type: ignore[method-assign]
    run_checked(p, 1)
    assert statuses(p.completions()) == [(1, WcStatus.SUCCESS)] and p.dst == p.src
    assert (sacks > 0) == (via == "fields")


_NAMES = (
    "qp_num",
    "dest_qp",
    "cack_psn",
    "ack_psn_offset",
    "sack_offset",
    "bitmap",
    "echo",
    "m",
    "pr",
    "mpr",
    "ts_echo",
    "ooo_count",
    "rcvd_256b",
)


@given(_FIELDS)
def test_a_sack_keeps_every_field_at_its_full_width(f: tuple[Any, ...]) -> None:
    s = SackTransmit(*f)
    assert tuple(getattr(s, name) for name in _NAMES) == f
    assert s.size == 0 and s.tpl is None and not s.is_data  # still a control packet to the fabric


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dest_qp", 1 << 24),
        ("cack_psn", -1),
        ("ack_psn_offset", 0x8000),
        ("echo", 1 << 32),
        ("mpr", 256),
        ("ts_echo", 1 << 16),
        ("ooo_count", 0x8000),
        ("rcvd_256b", 1 << 24),
        ("m", 4),
    ],
)
def test_a_sack_field_beyond_its_width_is_refused(field: str, value: int) -> None:
    f = dict.fromkeys(_NAMES, 0) | {"pr": False, field: value}
    with pytest.raises(ValueError, match="outside its width"):
        SackTransmit(*(f[name] for name in _NAMES))


def test_a_sack_in_flight_is_at_most_two_slots_more_than_a_data_packet() -> None:
    sack = SackTransmit(1, 2, 3, 4, 5, 6, 7, 0, False, 64, 0, 0, 0)
    data = Transmit(1, 2, bytes(32), 0, None, 1, 0)
    assert sys.getsizeof(sack) <= sys.getsizeof(data) + 16
