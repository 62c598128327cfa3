"""Regenerate the fuzz seed corpus (tests/fuzz/corpus/) from the packets of a real impaired transfer.

    .venv/bin/python scripts/make_fuzz_corpus.py          # rewrite tests/fuzz/corpus/{parse,frame,nic}/

A fuzzer starting from real packets reaches deep code at once: random bytes almost never get past the
opcode, length and ICRC checks. The transfer runs on the fuzz target's own pair (`make_live`: the same QP
numbers and keys, so the ``nic`` seeds hit live QPs and regions) over a fabric with loss, trimming,
duplication and reordering, plus an EV probe, a port status update and a Write with a bad R_Key, so every
packet kind appears: data (with and without immediate, trimmed), SACK, NACK, probe, AETH NAK, endpoint
request and response. Deterministic: running it twice gives the same files.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzz.targets import MTU, NicInput, Record, make_live  # noqa: E402
from tests.transport_tools import Sent, install  # noqa: E402

from openmrc.provider.loopback import Impairments  # noqa: E402
from openmrc.transport import TrimMark  # noqa: E402
from openmrc.wire import (  # noqa: E402
    BTH,
    DATA_OPCODES,
    METH,
    RETH,
    TSETH,
    Addressing,
    EpOp,
    ImmDt,
    Opcode,
    Packet,
    SRv6Encap,
    encapsulate,
    seal,
    trim_datagram,
)

CORPUS = ROOT / "tests" / "fuzz" / "corpus"
DATA = frozenset(int(o) for o in DATA_OPCODES)
ADDR = Addressing("2001:db8::a", "2001:db8::b", 0xC001)


def capture() -> list[Sent]:
    """Every packet two NICs sent during an impaired transfer, then during a Write with a bad R_Key."""
    live = make_live(Impairments(loss=0.08, trim=0.1, dup=0.02, reorder_ns=2_000, data_only=True))
    p = live.p
    hook = install(p)
    p.post_recv(8)
    p.a.ep_request(EpOp.EV_PROBE, "b", now=p.now)
    p.b.ep_request(EpOp.EV_PROBE, "a", now=p.now)
    for rnd in range(4):  # MTU-sized packets are few: several rounds for enough losses and trims
        p.write(0, 10 * MTU + 7)
        p.write(11 * MTU, 100, imm=rnd)
        p.write(12 * MTU, 4 * MTU, imm=rnd + 10)
        if rnd == 1:
            p.a.port_down(3, now=p.now)  # a port status update to the peer
        if rnd == 2:
            p.a.port_up(3, now=p.now)
        done = 0
        while done < 3:
            assert p.step(), "the capture's transfer stalled"
            done += len(p.completions())
    p.run(max_steps=100_000)
    log = list(hook.log)
    bad = make_live()  # an access error: the responder answers with an AETH NAK
    hook = install(bad.p)
    bad.p.write(0, 100, rkey=bad.remote["b"].rkey ^ 1)
    bad.p.run(max_steps=10_000)
    return log + hook.log


def pick(log: list[Sent]) -> list[Sent]:
    """A handful of packets of every kind (first, middle, last, retransmitted...), in sending order."""
    seen: dict[tuple[int, bool, str], int] = {}
    out = []
    for s in log:
        k = (s.opcode, s.rtx, s.src)
        if seen.get(k, 0) < 2:
            seen[k] = seen.get(k, 0) + 1
            out.append(s)
    return out


def crafted() -> list[Packet]:
    """Header variants the transfer does not send: TSETH, a zero-length Write, odd payload padding."""
    return [
        Packet(
            BTH(Opcode.WRITE_ONLY, dest_qp=0x123456, psn=7, ack_req=True, ts=True),
            METH(1, 2),
            TSETH(0x1234, 1, 3),
            RETH(0x1000_0000, 0xCAFE, 5),
            payload=b"hello",
        ),
        Packet(BTH(Opcode.WRITE_ONLY, dest_qp=0x123456, psn=8), METH(1, 3), None, RETH(0x1000, 1, 0)),
        Packet(
            BTH(Opcode.WRITE_ONLY_WITH_IMM, dest_qp=0x123456, psn=9),
            METH(2, 4),
            None,
            RETH(0x1000, 1, 3),
            ImmDt(0xDEADBEEF),
            payload=b"abc",
        ),
    ]


def write(target: str, files: Iterable[tuple[str, bytes]]) -> int:
    d = CORPUS / target
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    n = 0
    for name, data in files:
        (d / name).write_bytes(data)
        n += 1
    return n


def name(s: Sent | Packet, i: int) -> str:
    op = s.opcode if isinstance(s, Sent) else s.bth.opcode
    return f"{i:02d}-{Opcode(op).name.lower()}"


def parse_seeds(chosen: list[Sent]) -> Iterable[tuple[str, bytes]]:
    pkts: list[Sent | Packet] = [*chosen, *crafted()]
    for i, s in enumerate(pkts):
        pkt = s.packet if isinstance(s, Sent) else s
        raw = seal(pkt, ADDR)
        yield name(s, i), b"\x00" + raw
        if pkt.bth.opcode in DATA and i % 2 == 0:
            yield name(s, i) + "-trimmed", b"\x01" + trim_datagram(raw)


def frame_seeds(chosen: list[Sent]) -> Iterable[tuple[str, bytes]]:
    srv6 = [
        SRv6Encap("fc00:0:1::1", "fc00:0:101:202:303:404::"),
        SRv6Encap("fc00:0:1::1", "fc00:0:101:202::", ("fc00:0:303:404::",), hop_limit=17, flow_label=0x12345),
        SRv6Encap("fc00:0:1::1", "fc00:0:101::", ("fc00:0:303::", "fc00:0:202::"), traffic_class=0x2E),
    ]
    kinds: list[Sent | Packet] = [s for s in chosen if not s.rtx]
    kinds += crafted()
    for i, s in enumerate(kinds):
        pkt = s.packet if isinstance(s, Sent) else s
        v = i % 6
        ether = i % 3 == 0
        if v == 0:
            fr = encapsulate(
                pkt, src="192.0.2.1", dst="192.0.2.2", sport=0xC000 + i, traffic_class=2, ether=ether
            )
        elif v == 1:
            fr = encapsulate(
                pkt, src="2001:db8::1", dst="2001:db8::2", sport=0xC000 + i, flow_label=i, ether=ether
            )
        else:
            fr = encapsulate(
                pkt, src="2001:db8::1", dst="2001:db8::2", sport=0xC000 + i, srv6=srv6[v % 3], ether=ether
            )
        flags = 2 | ether  # check the ICRC
        yield name(s, i) + f"-v{v}", bytes((flags,)) + fr
    # an 802.1Q-tagged frame, a frame of a trimmed packet, and one with no UDP checksum
    first = next(s.packet for s in chosen if s.opcode in DATA)
    fr = encapsulate(first, src="2001:db8::1", dst="2001:db8::2", sport=0xC123, ether=True)
    yield "vlan", b"\x03" + fr[:12] + b"\x81\x00\x00\x05" + fr[12:]
    raw = trim_datagram(seal(first, ADDR))
    yield "trimmed", b"\x06" + encapsulate(raw, src="192.0.2.1", dst="192.0.2.2", sport=0xC124)
    plain = bytearray(encapsulate(chosen[1].packet, src="192.0.2.1", dst="192.0.2.2", sport=0xC125))
    plain[26:28] = b"\0\0"  # IPv4: a zero UDP checksum means none
    yield "no-udp-checksum", b"\x02" + bytes(plain)


def nic_seeds(log: list[Sent]) -> Iterable[tuple[str, bytes]]:
    """Records handing the captured packets to the NIC that received them, alone and in runs."""
    live = make_live()
    qpns = {live.p.qp_a.qp_num, live.p.qp_b.qp_num, 2}
    assert {s.packet.bth.dest_qp for s in log} <= qpns, "the capture ran on other QPs than the fuzz pair"

    def rec(s: Sent, steps: int = 0) -> Record:
        to = "b" if s.src == "a" else "a"
        ep = s.opcode == Opcode.EP_REQUEST
        return Record(s.packet.encode(), to=to, port=s.port, as_peer=ep, steps=steps)

    chosen = pick(log)
    for i, s in enumerate(chosen):
        yield name(s, i), NicInput(records=(rec(s, steps=1),)).encode()
    data = [s for s in chosen if s.opcode in DATA and s.src == "a"]
    for i, s in enumerate(data[:4]):
        raw = trim_datagram(s.packet.encode())
        r = Record(raw, to="b", port=s.port, trim=TrimMark(1 + i % 2), sealed=False, steps=1)
        yield f"trimmed-{i}", NicInput(packets=2, records=(r,)).encode()
    for key in (1, 2, 3):  # forged Writes at the edges of each region kind, on both NICs
        for i, (to, off) in enumerate((("a", -4), ("b", 4 * MTU), ("a", 15 * MTU + 4))):
            s = data[i % len(data)]
            r = Record(s.packet.encode(), to=to, port=s.port, qp=1, key=key, va_offset=off, steps=i)
            yield f"key{key}-{to}{i}", NicInput(packets=1 + i, imm=bool(i & 1), records=(r,)).encode()
    for j, start in enumerate(range(0, min(len(log), 240), 40)):  # runs of the conversation as it happened
        recs = tuple(rec(s, steps=1 if k % 3 == 0 else 0) for k, s in enumerate(log[start : start + 10]))
        yield f"run-{j}", NicInput(packets=4, imm=bool(j & 1), short=j * 37, records=recs).encode()


def main() -> None:
    log = capture()
    ops = {Opcode(s.opcode) for s in log}
    want = {Opcode.SACK, Opcode.NACK, Opcode.ACK, Opcode.EP_REQUEST, Opcode.EP_RESPONSE, Opcode.PROBE}
    missing = want - ops
    if missing:
        raise SystemExit(f"the capture has no {sorted(o.name for o in missing)}: change the impairments")
    chosen = pick(log)
    counts = {
        "parse": write("parse", parse_seeds(chosen)),
        "frame": write("frame", frame_seeds(chosen)),
        "nic": write("nic", nic_seeds(log)),
    }
    size = sum(f.stat().st_size for f in CORPUS.rglob("*") if f.is_file())
    print(f"{len(log)} packets captured ({', '.join(sorted(o.name for o in ops))})")
    print(", ".join(f"{k}: {v} files" for k, v in counts.items()) + f"; {size} bytes in all")


if __name__ == "__main__":
    main()
