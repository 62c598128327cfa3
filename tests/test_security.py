"""Authenticated MRC (issue "authenticated, isolated MRC"): the security trailer's codec, authenticated
transfers in both modes, an adversary who seals what it sends with a correct ICRC (replays, bit flips,
plain MRC 1.0 packets, packets sealed under a wrong key or another domain), isolation of two domains on
the same NICs, key rotation and revocation, and the attribute on the verbs mirror."""

from __future__ import annotations

import os
import random
import struct
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openmrc.provider.loopback import port_address
from openmrc.transport import (
    Access,
    LocalProtocolError,
    QpSecurity,
    QpState,
    SecurityDomain,
    SendWR,
    Sge,
    Transmit,
    WcStatus,
    WrOpcode,
)
from openmrc.transport.security import REPLAY_WINDOW, ReplayWindow, SealState
from openmrc.wire import Addressing, WireError, parse, seal
from openmrc.wire.constants import OP_WRITE_ONLY, OP_WRITE_ONLY_WITH_IMM
from openmrc.wire.security import (
    BTH_SEALED,
    DATA_SEAL_OVERHEAD,
    SEAL_OVERHEAD,
    SECH_SIZE,
    TAG_SIZE,
    pack_sech,
    trailer_length,
    unpack_sech,
)

from .helpers import Impairments, Pair

S = WcStatus
SIZE = 300_000


def secure_pair(
    *,
    encrypt: bool = False,
    seed: int = 3,
    imp: Impairments | None = None,
    wire: bool = True,
    header_tag: bool | str = "auto",
    **kw: object,
) -> tuple[Pair, SecurityDomain]:
    dom = SecurityDomain.generate(7)
    sec = QpSecurity(dom, encrypt=encrypt, header_tag=header_tag)
    p = Pair(
        seed=seed,
        wire=wire,
        imp=imp,
        security=(sec, sec),
        **kw,  # type: ignore[arg-type]
    )
    return p, dom


def transfer(p: Pair, size: int = SIZE) -> None:
    p.post_recv(1)
    p.write(0, size, imm=0x5EC)
    p.run(lambda: len(p.qp_a.send_cq) >= 1 and len(p.qp_b.recv_cq) >= 1)


def auth_counts(p: Pair) -> dict[str, int]:
    out: dict[str, int] = {}
    for side, nic in (("a", p.a), ("b", p.b)):
        for k, v in nic.stats.as_dict().items():
            if k.startswith("rx_auth") and v:
                out[f"{side}.{k}"] = v
    return out


# -- the codec -----------------------------------------------------------------------------------------------


@given(
    st.booleans(),
    st.integers(0, 255),
    st.integers(1, 2**32 - 1),
    st.integers(1, 2**32 - 1),
    st.integers(1, 2**40 - 1),
)
def test_sech_round_trips(encrypted: bool, epoch: int, sdi: int, ssi: int, counter: int) -> None:
    for htag in (False, True):
        for wants in (False, True):
            raw = pack_sech(encrypted, epoch, sdi, ssi, counter, htag, wants)
            assert len(raw) == SECH_SIZE
            assert tuple(unpack_sech(raw)) == (encrypted, epoch, sdi, ssi, counter, htag, wants)


@given(st.binary(min_size=SECH_SIZE, max_size=SECH_SIZE))
def test_any_sixteen_bytes_decode_or_raise_wire_error(raw: bytes) -> None:
    try:
        h = unpack_sech(raw)
    except WireError:
        return
    assert pack_sech(*h) == raw  # what decodes is exactly what encodes


@pytest.mark.parametrize(
    "raw",
    [
        pack_sech(False, 0, 1, 1, 1)[:15],
        bytes([0x20]) + pack_sech(False, 0, 1, 1, 1)[1:],  # version 2
        bytes([0x18]) + pack_sech(False, 0, 1, 1, 1)[1:],  # an unknown flag
        pack_sech(False, 0, 1, 1, 1)[:10] + b"\x01" + pack_sech(False, 0, 1, 1, 1)[11:],  # reserved
        pack_sech(False, 0, 1, 1, 1)[:11] + bytes(5),  # counter 0
    ],
)
def test_malformed_sech_is_refused(raw: bytes) -> None:
    with pytest.raises(WireError):
        unpack_sech(raw)


def test_epoch_keys_differ_by_epoch_and_domain_and_the_key_never_prints() -> None:
    key = bytes(range(32))
    k = SecurityDomain.epoch_key
    assert len({k(key, 1, 0), k(key, 1, 1), k(key, 2, 0), k(bytes(32), 1, 0)}) == 4
    d = SecurityDomain(5, key)
    assert key.hex() not in repr(d)
    assert SecurityDomain.from_spec(d.spec()).spec() == d.spec()
    for bad in ("5", "x:00", f"0:{key.hex()}", f"5:{key.hex()[:-2]}", f"5:{key.hex()}:256"):
        with pytest.raises(ValueError):
            SecurityDomain.from_spec(bad)


# -- authenticated transfers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("encrypt", [False, True])
@pytest.mark.parametrize(
    "imp", [None, Impairments(loss=0.03, dup=0.02, reorder_ns=20_000), Impairments(trim=0.05)], ids=str
)
def test_an_authenticated_transfer_is_bit_exact(encrypt: bool, imp: Impairments | None) -> None:
    p, _ = secure_pair(encrypt=encrypt, imp=imp, header_tag=True)
    on_wire: list[bytes] = []
    p.fabric.observers.append(lambda dst, obj, port, now, kw: on_wire.append(bytes(obj)))  # type: ignore[arg-type]
    transfer(p)
    assert [c.status for c in p.completions()] == [S.SUCCESS]
    assert [(c.status, c.imm_data) for c in p.recv_completions()] == [(S.SUCCESS, 0x5EC)]
    assert p.dst[:SIZE] == p.src[:SIZE]
    assert on_wire and all(x[8] & BTH_SEALED for x in on_wire)  # every packet sealed, trimmed ones too
    plaintext_seen = any(p.src[i : i + 64] in x for x in on_wire for i in range(0, SIZE - 64, 50_000))
    assert plaintext_seen is not encrypt  # encrypted: no payload crosses the wire in clear
    counts = auth_counts(p)
    if imp is not None and imp.dup:
        assert counts.get("b.rx_auth_replayed", 0) + counts.get("a.rx_auth_replayed", 0) > 0
    else:
        assert counts == {}
    if imp is not None and imp.trim:  # trimmed packets keep their trailer: verified, and NACKed at once
        assert p.b.stats.trims_seen == p.fabric.trimmed > 0


def test_without_header_tags_a_trimmed_packet_is_recovered_as_a_loss() -> None:
    """``header_tag=False`` (a fabric that never trims): data packets carry 32 bytes of trailer, not 48; a
    trimmed one cannot be verified, is counted unsealed and recovered like a lost packet."""
    dom = SecurityDomain.generate(3)
    sec = (QpSecurity(dom, header_tag=False), QpSecurity(dom, header_tag=False))
    p = Pair(seed=3, wire=True, imp=Impairments(trim=0.05), security=sec)
    sizes: list[int] = []
    p.fabric.observers.append(
        lambda dst, obj, port, now, kw: sizes.append(len(obj)) if not kw["trim"] and obj[0] == 0xC7 else None  # type: ignore[index,arg-type]
    )
    transfer(p)
    assert [c.status for c in p.completions()] == [S.SUCCESS] and p.dst[:SIZE] == p.src[:SIZE]
    assert set(sizes) == {12 + 4 + 16 + 4096 + SEAL_OVERHEAD + 4}  # WRITE_MIDDLE: BTH METH RETH, payload
    assert p.b.stats.rx_auth_unsealed == p.fabric.trimmed > 0 and p.b.stats.trims_seen == 0


def test_auto_header_tags_start_at_the_first_trimmed_packet_the_receiver_could_not_verify() -> None:
    """``header_tag="auto"`` (the default): no header tags while nothing is trimmed; the receiver of a
    trimmed packet without one (unverifiable: recovered as a loss) sets W in what it seals, and the
    sender's data packets carry header tags from the first of those it verifies: later trimmed packets
    are verified and NACKed at once. A QP with ``header_tag=False`` does not follow W."""
    BIG = 2 << 20  # (the first window leaves before the first W comes back)
    htag = 12 + 4 + 16 + 4096 + DATA_SEAL_OVERHEAD + 4  # WRITE_MIDDLE: BTH METH RETH, payload
    plain = htag - TAG_SIZE
    for imp, mode in ((None, "auto"), (Impairments(trim=0.05), "auto"), (Impairments(trim=0.05), False)):
        p, _ = secure_pair(imp=imp, header_tag=mode, buf_size=BIG)
        sizes: list[int] = []
        wants: list[bool] = []

        def seen(dst, obj, port, now, kw, sizes=sizes, wants=wants) -> None:  # type: ignore[no-untyped-def]
            if not kw["trim"] and obj[0] == 0xC7:
                sizes.append(len(obj))
            if kw["src"] == "b":
                wants.append(unpack_sech(obj[-4 - SEAL_OVERHEAD : -4 - TAG_SIZE]).wants_header_tag)

        p.fabric.observers.append(seen)
        transfer(p, BIG)
        assert [c.status for c in p.completions()] == [S.SUCCESS] and p.dst[:BIG] == p.src[:BIG]
        b = p.b.stats
        if imp is None:  # nothing trimmed: no header tag, none asked for
            assert set(sizes) == {plain} and wants and not any(wants)
            assert auth_counts(p) == {}
            continue
        assert any(wants) and not wants[0]  # asked for once a trimmed packet came in
        assert b.rx_auth_unsealed + b.trims_seen == p.fabric.trimmed and b.rx_auth_unsealed > 0
        if mode == "auto":
            assert sizes[0] == plain and sizes[-1] == htag and set(sizes) == {plain, htag}
            assert b.trims_seen > b.rx_auth_unsealed  # most trimmed packets verified by their header tag
        else:
            assert set(sizes) == {plain} and b.trims_seen == 0


def test_a_forged_request_for_header_tags_is_not_followed() -> None:
    """W in a packet whose tag does not verify (a genuine SACK sealed again under an attacker's key, live QP
    numbers, the peer's SSI, a new counter, a correct ICRC) is dropped with the packet: the sender's header
    tags stay off. The same SACK sealed with W under the domain's key turns them on."""
    p, dom = secure_pair()
    from_b: list[tuple[bytes, int, dict[str, object]]] = []
    p.fabric.observers.append(
        lambda dst, obj, port, now, kw: (
            from_b.append((bytes(obj), port, dict(kw))) if kw["src"] == "b" else None
        )  # type: ignore[arg-type]
    )
    transfer(p, 4 * 4096)
    raw, port, kw = from_b[-1]
    inner = raw[: -4 - trailer(raw)]
    a_state, b_state = p.a.secure[p.qp_a.qp_num], p.b.secure[p.qp_b.qp_num]
    assert not a_state.header_tag
    for key in (bytes(32), None):  # the attacker's, then the domain's
        state = SealState(
            p.qp_b.qp_num, QpSecurity(dom if key is None else SecurityDomain(dom.sdi, key), ssi=b_state.ssi)
        )
        state.sent = b_state.sent + 100
        state.wants_header_tag = True
        t = Transmit(1, None, bytes(32), 0, parse(inner + bytes(4)), p.qp_b.qp_num)
        assert state.seal(t, 0)
        failed = p.a.stats.rx_auth_failed
        addr = addressing(kw, port)
        p.a.receive_datagram(seal(bytes(t.body) + bytes(4), addr), port, p.now, addr, src="b")
        if key is not None:
            assert p.a.stats.rx_auth_failed == failed + 1 and not a_state.header_tag
        else:
            assert p.a.stats.rx_auth_failed == failed and a_state.header_tag


def trailer(raw: bytes | bytearray) -> int:
    """The security trailer's length of the sealed datagram ``raw`` (ICRC included)."""
    return trailer_length(raw[:-4])


@given(
    st.lists(
        st.one_of(
            st.integers(1, 40),  # just ahead of the highest counter: reordering across paths
            st.integers(-80, 0),  # behind it: late, or replayed
            st.integers(REPLAY_WINDOW - 8, REPLAY_WINDOW + 8),  # a jump of about the window
            st.integers(-REPLAY_WINDOW - 8, -REPLAY_WINDOW + 8),  # about the window behind
        ),
        max_size=300,
    )
)
def test_the_replay_window_takes_each_counter_once_and_nothing_too_old(steps: list[int]) -> None:
    """Against a model (every counter taken, the highest of them): a counter is refused exactly when it
    was taken before, or is `REPLAY_WINDOW` or more behind the highest taken, however counters arrive."""
    w, taken, top = ReplayWindow(), set(), 0
    for step in steps:
        c = top + step
        if c < 1:
            continue
        refused = c <= top and (top - c >= REPLAY_WINDOW or c in taken)
        assert w.refuses(c) == refused, (c, top)
        if not refused:
            w.mark(c)
            taken.add(c)
            top = max(top, c)
            assert w.top == top and w.refuses(c)  # taken: a copy of it is a replay


# -- the adversary -------------------------------------------------------------------------------------------


def addressing(kw: dict[str, object], port: int) -> Addressing:
    src = str(kw["src"])
    dst = "b" if src == "a" else "a"
    return Addressing(port_address(src, port), port_address(dst, port), int(kw["entropy"]) & 0xFFFF)  # type: ignore[call-overload]


def forge_sealed(
    plain: bytes, key: bytes, sdi: int, epoch: int, ssi: int, sender_qpn: int, counter: int
) -> bytes:
    """An attacker's own sealing of the MRC packet ``plain`` (BTH through pad): the sealing a genuine QP
    does (`SealState`), authentication only with header tags, under a key it holds for the domain's SDI."""
    seal_state = SealState(sender_qpn, QpSecurity(SecurityDomain(sdi, key, epoch=epoch), ssi=ssi))
    seal_state.sent = counter - 1
    t = Transmit(1, None, bytes(32), 0, parse(plain + bytes(4)), sender_qpn)
    assert seal_state.seal(t, 0)
    return bytes(t.body)


def flip(raw: bytes, rng: random.Random) -> bytes:
    """``raw`` (BTH through the ICRC) with one bit flipped before the ICRC."""
    b = bytearray(raw)
    i = rng.randrange(len(b) - 4)
    b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


class Adversary:
    """Sees every datagram the fabric delivers and, beside each, delivers its own, sealed with the right
    ICRC for the addresses it claims: replays of what it saw, bit-flipped copies, the plain MRC 1.0 packet
    inside a sealed one (what an unauthenticated QP would have taken), and packets sealed under a key of
    its own for the same SDI."""

    def __init__(self, p: Pair, seed: int, per_packet: int = 3) -> None:
        self.p = p
        self.rng = random.Random(seed)
        self.seen: list[tuple[bytes, int, dict[str, object]]] = []
        self.sent = 0
        self.per_packet = per_packet
        self.own_key = bytes(self.rng.randbytes(32))
        p.fabric.observers.append(self.observe)

    def observe(self, dst, obj, port, now, kw) -> None:  # type: ignore[no-untyped-def]
        if not isinstance(obj, bytes) or kw["trim"]:
            return
        self.seen.append((obj, port, dict(kw)))
        rng = self.rng
        for _ in range(self.per_packet):
            raw, rport, rkw = self.seen[rng.randrange(len(self.seen))]
            addr = addressing(rkw, rport)
            kind = rng.randrange(4)
            if kind == 0:
                forged = raw  # a replay
            elif kind == 1:
                forged = seal(flip(raw, rng), addr)
            elif kind == 2:  # the plain packet (maybe with its payload changed), no trailer
                body = bytearray(raw[: -4 - trailer(raw)])
                if len(body) > 80:
                    body[70] ^= 0xFF
                forged = seal(bytes(body) + bytes(4), addr)
            else:  # sealed under a key of the attacker's, for the domain's SDI and a live epoch
                body = raw[: -4 - trailer(raw)]
                h = unpack_sech(raw[-4 - SEAL_OVERHEAD : -4 - SEAL_OVERHEAD + SECH_SIZE])
                qpn = self.p.qp_a.qp_num if rkw["src"] == "a" else self.p.qp_b.qp_num
                forged = seal(
                    forge_sealed(body, self.own_key, h.sdi, h.epoch, h.ssi, qpn, h.counter + 1_000)
                    + bytes(4),
                    addr,
                )
            target = self.p.b if rkw["src"] == "a" else self.p.a
            target.receive_datagram(
                forged, rport, now, addr, flow_label=int(rkw["entropy"]) >> 16, src=rkw["src"]
            )
            self.sent += 1


@pytest.mark.parametrize("encrypt", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
def test_forged_replayed_and_modified_packets_have_no_effect(encrypt: bool, seed: int) -> None:
    """Against the same transfer without the adversary (same seeds): the same completions at the same
    simulated time, the same retransmissions, the same bytes: every forged packet was dropped, counted,
    and changed nothing."""
    imp = Impairments(loss=0.02)
    ref, _ = secure_pair(encrypt=encrypt, seed=seed, imp=imp)
    transfer(ref)
    p, _ = secure_pair(encrypt=encrypt, seed=seed, imp=imp)
    adv = Adversary(p, seed)
    transfer(p)
    assert adv.sent > 200
    assert [c.status for c in p.completions()] == [S.SUCCESS]
    assert p.dst[:SIZE] == p.src[:SIZE] == ref.dst[:SIZE]
    assert p.now == ref.now
    for k in ("retransmits", "timeouts", "losses_inferred", "sacks_sent", "tx_packets"):
        assert getattr(p.a.stats, k) == getattr(ref.a.stats, k), k
        assert getattr(p.b.stats, k) == getattr(ref.b.stats, k), k
    refused = sum(auth_counts(p).values())
    other = sum(
        getattr(n.stats, k)
        for n in (p.a, p.b)
        for k in ("rx_bad_icrc", "rx_malformed", "rx_dropped_no_qp", "rx_dropped_port")
    )
    assert refused + other == adv.sent  # every one dropped, and counted where it was
    counts = auth_counts(p)
    for k in ("b.rx_auth_replayed", "b.rx_auth_failed", "a.rx_auth_failed"):
        assert counts.get(k, 0) > 0, k


def test_an_unsealed_peer_is_refused_and_the_qp_fails_rather_than_stalls() -> None:
    """One end authenticated, the other not (set up wrong): nothing the plain end sends is taken, and its
    Write ends in RETRY_EXC_ERR, not in silence."""
    dom = SecurityDomain.generate(9)
    p = Pair(seed=5, security=(None, QpSecurity(dom)), timeout=4, retry_linear=2, retry_exp=2)  # type: ignore[arg-type]
    transfer(p, 8192)
    assert [c.status for c in p.completions()] == [S.RETRY_EXC_ERR]
    assert p.b.stats.rx_auth_unsealed > 0 and not any(p.dst)


# -- isolation of two domains on the same NICs ---------------------------------------------------------------


def test_two_domains_on_the_same_nics_cannot_place_bytes_in_each_others_memory() -> None:
    """Domains 1 and 2 each have a QP pair on NICs a and b. An outsider holding domain 1's key aims Writes
    at domain 2's QP with its real R_Key and live PSNs: sealed under domain 1's key (with its SDI or domain
    2's), or as plain MRC. And domain 1's own application names domain 2's region through its QP (a guessed
    R_Key): the protection domain refuses it. Not a byte lands in domain 2's memory."""
    from openmrc.provider.bringup import connect_qp

    p, d1 = secure_pair(seed=11)
    d2 = SecurityDomain.generate(8)
    qa2, qb2 = p.a.create_qp(_init(p.a)), p.b.create_qp(_init(p.b))
    connect_qp(qa2, "b", qb2.qp_num, security=QpSecurity(d2), mpr=8, mpr_dest=8, timeout=8)
    connect_qp(qb2, "a", qa2.qp_num, security=QpSecurity(d2), mpr=8, mpr_dest=8, timeout=8)
    mem2 = bytearray(1 << 16)
    mr2 = p.b.register(mem2, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    mr2.pd, p.mr_b.pd = "pd2", "pd1"  # each domain's regions in its protection domain (verbs sets these)
    qb2.pd, p.qp_b.pd = "pd2", "pd1"
    template = _genuine_write(p)  # a real Write of domain 1 (its bytes, BTH through pad)
    assert p.dst[:256] == p.src[:256] and [c.status for c in p.completions()] == [S.SUCCESS]  # domain 1 works

    addr = Addressing(port_address("a", 1), port_address("b", 1), 0xC000)
    before = dict(p.b.stats.as_dict())
    for psn in range(8):  # qb2 expects PSN 0 onwards
        for sdi in (1, 2):
            w = _retarget(template, qb2.qp_num, psn, mr2.rkey, mr2.addr)
            sealed = forge_sealed(w, _key(d1), sdi, 0, 77, qa2.qp_num, 1000 + psn)
            p.b.receive_datagram(seal(sealed + bytes(4), addr), 1, p.now, addr)
            p.b.receive_datagram(seal(w + bytes(4), addr), 1, p.now, addr)
    after = p.b.stats.as_dict()
    # (a plain packet's last 32 bytes are taken for a trailer, which does not verify)
    assert after["rx_auth_failed"] - before["rx_auth_failed"] == 32

    wr = p.write(0, 4096, remote_addr=mr2.addr, rkey=mr2.rkey)  # domain 1's QP, domain 2's region
    p.run(lambda: len(p.qp_a.send_cq) >= 1)
    assert [(c.wr_id, c.status) for c in p.completions()] == [(wr, S.REM_ACCESS_ERR)]
    assert p.b.stats.access_errors == 1
    assert not any(mem2), "a byte of domain 1's traffic landed in domain 2's memory"


def _init(nic):  # type: ignore[no-untyped-def]
    from openmrc.transport import QpInitAttr

    return QpInitAttr(send_cq=nic.create_cq(), recv_cq=nic.create_cq())


def _key(d: SecurityDomain) -> bytes:
    return bytes.fromhex(d.spec().split(":")[1])


def _genuine_write(p: Pair) -> bytes:
    """The MRC bytes (no trailer, no ICRC) of a Write-only packet a sends: one 256-byte Write captured."""
    got: list[bytes] = []

    def grab(dst, obj, port, now, kw):  # type: ignore[no-untyped-def]
        if isinstance(obj, bytes) and obj[0] in (OP_WRITE_ONLY, OP_WRITE_ONLY_WITH_IMM) and not got:
            got.append(obj[: -4 - trailer(obj)])

    p.fabric.observers.append(grab)
    transfer(p, 256)
    p.fabric.observers.remove(grab)
    assert got
    return got[0]


def _retarget(w: bytes, qpn: int, psn: int, rkey: int, va: int) -> bytes:
    """The Write ``w`` aimed at QP ``qpn``, PSN ``psn``, region ``rkey`` at ``va``."""
    b = bytearray(w)
    b[5:8] = qpn.to_bytes(3, "big")
    b[9:12] = psn.to_bytes(3, "big")
    struct.pack_into("!QI", b, 16, va, rkey)  # RETH after BTH and METH
    return bytes(b)


# -- rotation and revocation ---------------------------------------------------------------------------------


def test_rotating_the_key_mid_transfer_costs_no_packet() -> None:
    """The sender's side rotates twice during a transfer (the receiver, in another process, not yet):
    the next epoch is taken without coordination; the run is the same as without rotation."""
    imp = Impairments(loss=0.01)
    ref, _ = secure_pair(seed=21, imp=imp)
    transfer(ref)
    key = bytes(range(32))
    da, db = SecurityDomain(3, key), SecurityDomain(3, key)
    p = Pair(seed=21, wire=True, imp=imp, security=(QpSecurity(da), QpSecurity(db)))
    rotated: list[int] = []

    def rotate(dst, obj, port, now, kw):  # type: ignore[no-untyped-def]
        if len(rotated) < 1 and p.a.stats.tx_data > 20:
            rotated.append(da.rotate())
        elif len(rotated) == 1 and p.a.stats.tx_data > 50:
            db.rotate()  # the receiver's side catches up; the sender's next rotation is then taken too
            rotated.append(da.rotate())

    p.fabric.observers.append(rotate)
    transfer(p)
    assert rotated == [1, 2]
    assert [c.status for c in p.completions()] == [S.SUCCESS] and p.dst[:SIZE] == p.src[:SIZE]
    assert p.a.stats.retransmits == ref.a.stats.retransmits and p.now == ref.now
    assert auth_counts(p) == {}


def test_a_key_two_epochs_behind_is_refused() -> None:
    key = bytes(range(32))
    da, db = SecurityDomain(3, key), SecurityDomain(3, key, epoch=2)
    p = Pair(
        seed=2, wire=True, security=(QpSecurity(da), QpSecurity(db)), timeout=4, retry_linear=1, retry_exp=1
    )
    transfer(p, 8192)
    assert [c.status for c in p.completions()] == [S.RETRY_EXC_ERR]
    assert p.b.stats.rx_auth_epoch > 0 and not any(p.dst)


def test_revoking_a_domain_stops_its_traffic_at_once() -> None:
    p, dom = secure_pair(seed=4)
    p.post_recv(1)
    wr = p.write(0, SIZE, imm=1)
    while p.a.stats.tx_data < 10:
        p.step()
    assert p.a.revoke_domain(dom, p.now) == 1
    sent = p.a.stats.tx_packets
    received = p.b.stats.rx_data
    p.run(max_time=p.now + 10**10)
    assert next((c.wr_id, c.status) for c in p.completions()) == (wr, S.LOC_PROT_ERR)
    assert p.qp_a.state is QpState.ERROR and "revoked" in (p.qp_a.error_detail or "")
    assert p.a.stats.tx_packets == sent  # nothing more left a
    assert p.b.stats.rx_data == received  # and b took nothing more (its domain object is the same)
    with pytest.raises(LocalProtocolError):
        dom.rotate()
    qp = p.a.create_qp(_init(p.a))
    with pytest.raises(LocalProtocolError, match="revoked"):
        qp.modify(QpState.INIT, ev_profile_id=0, cc_profile_id=0, security=QpSecurity(dom))


def test_security_is_an_init_attribute_checked_at_once() -> None:
    p = Pair(seed=1)
    qp = p.a.create_qp(_init(p.a))
    with pytest.raises(LocalProtocolError, match="QpSecurity"):
        qp.modify(QpState.INIT, ev_profile_id=0, cc_profile_id=0, security="domain 7")
    with pytest.raises(LocalProtocolError, match="not allowed"):
        p.qp_a.modify(QpState.RTS, security=QpSecurity(SecurityDomain.generate(1)))
    with pytest.raises(LocalProtocolError):
        QpSecurity(SecurityDomain.generate(1), ssi=0)
    with pytest.raises(LocalProtocolError):
        SecurityDomain(0, bytes(32))
    with pytest.raises(LocalProtocolError):
        SecurityDomain(1, bytes(16))


def test_a_post_send_to_an_authenticated_qp_over_verbs_shapes() -> None:
    """`SendWR`s are the same for an authenticated QP (nothing changes for the application)."""
    p, _ = secure_pair(seed=6)
    p.qp_a.post_send(
        SendWR(
            99,
            WrOpcode.RDMA_WRITE,
            [Sge(p.mr_a.addr, 4096, p.mr_a.lkey)],
            remote_addr=p.mr_b.addr,
            rkey=p.mr_b.rkey,
        )
    )
    p.run(lambda: len(p.qp_a.send_cq) >= 1)
    assert [(c.wr_id, c.status) for c in p.completions()] == [(99, S.SUCCESS)]
    assert p.dst[:4096] == p.src[:4096]


# -- over real sockets ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("encrypt", [False, True])
def test_over_udp_replayed_and_forged_datagrams_change_nothing(encrypt: bool) -> None:
    """Two software NICs on loopback sockets, one authenticated QP pair. Everything b received is sent to it
    again from an attacker's socket, each datagram re-sealed with the ICRC of the attacker's addresses:
    as it was (replay), with a bit flipped, and as the plain MRC packet inside (payload changed). All
    refused and counted; b's memory keeps exactly what a wrote; a second Write still goes through."""
    import socket

    from .test_provider_udp import Link, devices

    dom = SecurityDomain.generate(4)
    with devices(2, gro=False) as (a, b):  # (the tap then sees each datagram on its own)
        link = Link(a, b, 1 << 20, security=QpSecurity(dom, encrypt=encrypt))
        captured: list[tuple[int, bytes]] = []
        b.rx_tap = lambda port, src, flow, tos, data: captured.append((port, bytes(data)))
        link.write()
        (wc,) = link.run()
        assert wc.status is S.SUCCESS and link.dst == link.src
        b.rx_tap = None
        assert len(captured) >= 256
        plain_seen = any(
            link.src[i : i + 64] in d for _, d in captured[:50] for i in range(0, 1 << 20, 1 << 16)
        )
        assert plain_seen is not encrypt
        rng = random.Random(5)
        sent = 0
        for port, data in captured[:400]:
            target = b.endpoints()[port - 1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
                attacker.bind((a.endpoints()[port - 1][0], 0))
                addr = Addressing(a.endpoints()[port - 1][0], target[0], attacker.getsockname()[1], target[1])
                body = data[:-4]
                plain = bytearray(body[: -trailer_length(body)])
                plain[-8:] = b"EVILEVIL"
                for forged in (body, flip(data, rng)[:-4], bytes(plain)):
                    attacker.sendto(seal(forged + bytes(4), addr), target)
                    sent += 1
        before = dict(b.nic.stats.as_dict())
        for _ in range(50):
            b.progress(0.01)
            s = b.nic.stats
            if s.rx_auth_replayed + s.rx_auth_failed + s.rx_auth_epoch >= sent:
                break
        s = b.nic.stats
        # (a flipped copy of a packet seen is refused as a replay before its tag is checked)
        assert s.rx_auth_replayed >= 256 and s.rx_auth_failed >= 256
        assert s.rx_auth_replayed + s.rx_auth_failed + s.rx_auth_epoch + s.rx_dropped_no_qp == sent
        assert before["rx_data"] == s.rx_data  # not one reached the responder
        assert link.dst == link.src
        link.src[:] = random.Random(9).randbytes(len(link.src))
        link.write(2)
        (wc,) = link.run()
        assert wc.status is S.SUCCESS and link.dst == link.src


# -- in the simulator ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auth", "encrypt"])
def test_the_simulator_runs_authenticated_qps(mode: str) -> None:
    """Every flow QP of a simulated fabric authenticated (the same core, packets sealed and opened with
    real AES-GCM): every flow completes, each packet 32 or 48 bytes longer on the wire, no packet refused
    (trimmed ones are verified by their header tag and NACKed), the flows barely slower."""
    from .sim_tools import all_succeeded, clos

    times = {}
    for sec in ("none", mode):
        sim = clos(security=sec)
        flows = [sim.add_flow(s, (s + 5) % 16, 300_000) for s in range(16)] + [
            sim.add_flow(s, 0, 300_000)
            for s in range(1, 6)  # an incast: full buffers trim
        ]
        sealed: list[bool] = []

        def tap(_h: object, t: Transmit, sent: bool, sealed: list[bool] = sealed) -> None:
            if sent:
                sealed.append(t.body is not None)

        sim.host(3).node.tap = tap
        sim.run(until=10**9)
        assert all_succeeded(flows)
        stats = [sim.host(h).nic.stats for h in range(16)]
        if sec == "none":
            assert not any(sealed)
        else:
            assert sealed and all(sealed)
            assert sum(sum(auth_counts_of(s).values()) for s in stats) == 0
            assert sum(s.trims_seen for s in stats) > 0  # trimmed packets verified by their header tag
        times[sec] = sum(f.finish - f.start for f in flows) / len(flows)  # type: ignore[operator]
    assert times[mode] <= times["none"] * 1.03  # (the mean: an incast's last flow moves with event order)


def auth_counts_of(stats: object) -> dict[str, int]:
    return {k: v for k, v in stats.as_dict().items() if k.startswith("rx_auth") and v}  # type: ignore[attr-defined]


# -- the endpoint --------------------------------------------------------------------------------------------


def test_a_secured_endpoint_takes_no_forged_port_status_update() -> None:
    """Both NICs' endpoints secured in the domain (`Nic.secure_endpoint`): a real port status update
    arrives sealed and is applied; a forged one (plain, or sealed under another key), with a correct ICRC,
    claiming every port of "a" down, is refused and counted, and b keeps spraying over every plane."""
    from openmrc.wire import BTH, ERTH, RESERVED_QP_ENDPOINT, EpOp, Opcode, Packet, parse

    dom = SecurityDomain.generate(4)
    p = Pair(seed=3, wire=True, ports=2, security=(QpSecurity(dom), QpSecurity(dom)))
    for nic in (p.a, p.b):
        nic.secure_endpoint(dom)
    p.a.port_down(2, now=0)
    p.run(max_time=100_000)
    assert p.b.peer_ports["a"] == 0b01  # the sealed update was taken
    p.a.port_up(2, now=p.now)
    p.run(max_time=p.now + 100_000)
    assert p.b.peer_ports["a"] == 0b11
    update = Packet(
        BTH(Opcode.EP_REQUEST, dest_qp=RESERVED_QP_ENDPOINT, psn=77),
        erth=ERTH(op=EpOp.PORT_STATUS_UPDATE, port_status=0),
    ).encode()
    addr = Addressing(port_address("a", 1), port_address("b", 1), 0xC000)
    before = sum(auth_counts_of(p.b.stats).values())
    p.b.receive_datagram(seal(update, addr), 1, p.now, addr, src="a")
    forged = forge_sealed(update[:-4], bytes(32), dom.sdi, dom.epoch, 5, RESERVED_QP_ENDPOINT, 1)
    p.b.receive_datagram(seal(forged + bytes(4), addr), 1, p.now, addr, src="a")
    assert sum(auth_counts_of(p.b.stats).values()) == before + 2
    assert p.b.peer_ports["a"] == 0b11  # nothing changed
    p.b.receive(parse(update), 1, p.now, src="a")  # (a decoded packet carries no seal)
    assert p.b.peer_ports["a"] == 0b11 and p.b.stats.rx_auth_unsealed >= 1


def test_perf_keygen_writes_a_secret_domain_and_perf_checks_its_options(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from openmrc.cli.main import app

    runner = CliRunner()
    key = tmp_path / "d.key"
    made = runner.invoke(app, ["perf", "keygen", str(key), "--sdi", "9"])
    assert made.exit_code == 0 and key.stat().st_mode & 0o777 == 0o600
    dom = SecurityDomain.from_spec(key.read_text())
    assert dom.sdi == 9 and dom.fingerprint() in made.output
    assert runner.invoke(app, ["perf", "keygen", str(key)]).exit_code == 2  # exists: --force
    key.chmod(0o644)
    assert runner.invoke(app, ["perf", "keygen", str(key), "--force"]).exit_code == 0
    assert key.stat().st_mode & 0o777 == 0o600 and SecurityDomain.from_spec(key.read_text()).sdi == 1
    for args in (["--encrypt"], ["--no-header-tag"], ["--header-tag"], ["--secure", str(tmp_path / "none")]):
        assert runner.invoke(app, ["perf", "client", "127.0.0.1", *args]).exit_code == 2, args
    # a symbolic link is never written through: refused as existing (dangling or not), replaced by --force
    target, link = tmp_path / "target", tmp_path / "link.key"
    link.symlink_to(target)
    assert runner.invoke(app, ["perf", "keygen", str(link)]).exit_code == 2 and not target.exists()
    target.write_text("precious\n")
    assert runner.invoke(app, ["perf", "keygen", str(link), "--force"]).exit_code == 0
    assert target.read_text() == "precious\n" and not link.is_symlink()
    assert SecurityDomain.load(link).sdi == 1
    for bad in ("", str(tmp_path)):
        out = runner.invoke(app, ["perf", "keygen", bad])
        assert out.exit_code == 2 and "a directory" in " ".join(out.output.replace("│", " ").split()), bad


def test_a_key_file_is_read_with_care(tmp_path: Path) -> None:
    """`SecurityDomain.load` refuses what is not a key file before reading much of it (a FIFO would block,
    /dev/zero would never end, a binary file is no key) and takes a key file others may read with a
    warning: a domain key is a secret."""
    from openmrc.transport import KeyFileWarning

    spec = SecurityDomain.generate(4).spec() + "\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    binary, big, shared, private = (tmp_path / n for n in ("binary", "big", "shared", "private"))
    binary.write_bytes(bytes(range(256)))
    big.write_text(spec * 100)
    for path, why in (
        (fifo, "not a regular file"),
        (Path("/dev/zero"), "not a regular file"),
        (binary, "not a key file"),
        (big, "larger than a key file"),
        (tmp_path, "not a regular file|Is a directory"),
    ):
        with pytest.raises(ValueError, match=why):
            SecurityDomain.load(path)
    shared.write_text(spec)
    shared.chmod(0o644)
    with pytest.warns(KeyFileWarning, match="others may read this key file"):
        assert SecurityDomain.load(shared).sdi == 4
    private.write_text(spec)
    private.chmod(0o600)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SecurityDomain.load(private).sdi == 4


def test_a_sealed_transmit_is_counted_and_refused_on_a_port_that_is_down() -> None:
    """The simulator hands a sealed packet over as its `Transmit` (`Nic.receive_transmit`): like every other
    arrival it is counted, and on a port that is down it is dropped there, not opened and placed."""
    p, _ = secure_pair(wire=False)
    p.post_recv(1)
    p.write(0, 4096, imm=1)
    sent = [t for t in p.a.datagrams_to_send(p.now) if t.body is not None]
    assert sent, "an authenticated QP's data leaves sealed"
    t = sent[0]
    p.b.port_down(t.port, now=p.now)
    before = p.b.stats.as_dict()
    p.b.receive_transmit(t, t.port, p.now, src="a")
    after = p.b.stats.as_dict()
    assert after["rx_packets"] == before["rx_packets"] + 1
    assert after["rx_dropped_port"] == before["rx_dropped_port"] + 1
    assert not any(p.dst[:4096]), "nothing placed"
    p.b.port_up(t.port, now=p.now)
    p.b.receive_transmit(t, t.port, p.now, src="a")  # the same packet on a port that is up is placed
    assert (
        p.b.stats.rx_packets == after["rx_packets"] + 1
        and p.b.stats.rx_dropped_port == after["rx_dropped_port"]
    )
    assert len(t.payload) > 0 and bytes(p.dst[: len(t.payload)]) == bytes(p.src[: len(t.payload)])


def test_damage_in_transit_is_told_apart_from_forgery_and_a_damaged_icrc_alone_loses_nothing() -> None:
    """A NIC leaves a sealed packet's ICRC to its tag (which covers every byte the ICRC does) and checks the
    ICRC only of a packet the seal refuses: a bit flipped in transit counts in ``rx_bad_icrc``, the same
    flip with the ICRC recomputed (a forgery) in ``rx_auth_failed``, and a packet whose only damage is its
    ICRC is placed (the tag proves its bytes are the sender's), once: a copy of it is a replay."""
    p, _ = secure_pair(wire=False)
    p.post_recv(1)
    p.write(0, 3 * 4096, imm=1)
    t = next(t for t in p.a.datagrams_to_send(p.now) if t.body is not None and t.tpl is not None)
    addr = Addressing(port_address("a", t.port), port_address("b", t.port), t.entropy & 0xFFFF)
    good = seal(bytes(t.body) + bytes(4), addr)
    start, end = 32, len(good) - 4 - trailer(good)  # the payload: no flip there changes where it goes
    rng = random.Random(5)

    def deliver(raw: bytes) -> dict[str, int]:
        before = p.b.stats.as_dict()
        p.b.receive_datagram(raw, t.port, p.now, addr, src="a")
        return {k: v - before[k] for k, v in p.b.stats.as_dict().items() if v != before[k]}

    for _ in range(10):
        b = bytearray(good)
        b[rng.randrange(start, end)] ^= 1 << rng.randrange(8)
        assert deliver(bytes(b)) == {"rx_packets": 1, "rx_bad_icrc": 1}
        assert deliver(seal(bytes(b), addr)) == {"rx_packets": 1, "rx_auth_failed": 1}
    assert not any(p.dst[: 3 * 4096]), "nothing placed"
    b = bytearray(good)
    b[-1] ^= 0x10  # the ICRC alone
    got = deliver(bytes(b))
    assert "rx_bad_icrc" not in got and not any(k.startswith("rx_auth") for k in got)
    n = len(t.payload)
    at = t.va - p.mr_b.addr
    assert n > 0 and bytes(p.dst[at : at + n]) == bytes(t.payload) == bytes(p.src[at : at + n])
    assert deliver(good) == {"rx_packets": 1, "rx_auth_replayed": 1}
