"""The UDP device: real sockets on loopback, one per plane, with the transport core inside.

Every transfer here goes through the kernel: sealed with the real ICRC, sprayed over source ports (and
IPv6 flow labels), impaired by the in-process fault injector, and compared byte for byte at the end.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from openmrc.ev import EVField, EVFormatMode, EVFormatProfile, EVProfile, EVProfileMode, EVState
from openmrc.provider import Peer, UdpDevice, parse_endpoint
from openmrc.provider.udp import gso_burst
from openmrc.transport import (
    Access,
    LocalProtocolError,
    NicConfig,
    QpSecurity,
    RecvWR,
    SecurityDomain,
    SendWR,
    Sge,
    WcStatus,
    WrOpcode,
)
from openmrc.wire import BTH, METH, RETH, Addressing, Opcode, parse, seal, service_time_ns
from openmrc.wire.packet import data_packet
from tests.helpers import has_ipv6_loopback

_RNG = random.Random()


needs_ipv6 = pytest.mark.skipif(not has_ipv6_loopback(), reason="this host has no IPv6 loopback (::1)")


def _v4_endpoints(n: int) -> tuple[list[str], list[str]]:
    """Two sets of ``n`` loopback addresses no other test uses."""
    x, y = _RNG.randrange(1, 255), _RNG.randrange(0, 250)
    return [f"127.{x}.{y}.{p}" for p in range(1, n + 1)], [f"127.{x}.{y + 1}.{p}" for p in range(1, n + 1)]


def _v6_endpoints(n: int) -> tuple[list[str], list[str]]:
    """Two sets of ``n`` endpoints on ::1, one UDP port per plane."""
    base = _RNG.randrange(20000, 30000, 100)
    return [f"[::1]:{base + p}" for p in range(n)], [f"[::1]:{base + 50 + p}" for p in range(n)]


class Link:
    """Two devices with one connected QP each and a registered buffer on each side."""

    def __init__(
        self,
        a: UdpDevice,
        b: UdpDevice,
        size: int,
        *,
        profile: EVProfile | None = None,
        security: QpSecurity | None = None,
    ) -> None:
        self.a, self.b = a, b
        self.src = bytearray(random.Random(7).randbytes(size))
        self.dst = bytearray(size)
        self.mr_a = a.register(self.src, Access.LOCAL_WRITE)
        self.mr_b = b.register(self.dst)
        self.qa, self.qb = a.create_qp(), b.create_qp()
        pid = 0
        if profile is not None:
            pid = 5
            a.nic.add_ev_profile(pid, profile)
            b.nic.add_ev_profile(pid, profile)
        a.connect(self.qa, Peer.of(b.endpoints()), self.qb.qp_num, ev_profile_id=pid, security=security)
        b.connect(self.qb, Peer.of(a.endpoints()), self.qa.qp_num, ev_profile_id=pid, security=security)

    def write(self, wr_id: int = 1, length: int | None = None, imm: int | None = None) -> None:
        n = len(self.src) if length is None else length
        op = WrOpcode.RDMA_WRITE if imm is None else WrOpcode.RDMA_WRITE_WITH_IMM
        wr = SendWR(wr_id, op, [Sge(self.mr_a.addr, n, self.mr_a.lkey)], self.mr_b.addr, self.mr_b.rkey, imm)
        self.a.post_send(self.qa, wr)

    def run(self, timeout: float = 60.0) -> list[Any]:
        """Progress both devices until the Write completes; its completions."""
        done: list[Any] = []

        def finished() -> bool:
            self.b.progress(0)
            done.extend(self.qa.send_cq.poll(16))
            return bool(done)

        assert self.a.run_until(finished, timeout), "transfer did not complete"
        return done


@contextmanager
def devices(n: int = 4, *, v6: bool = False, **kw: Any) -> Iterator[tuple[UdpDevice, UdpDevice]]:
    ea, eb = (_v6_endpoints if v6 else _v4_endpoints)(n)
    a = UdpDevice(ea, seed=1, **kw)
    b = UdpDevice(eb, seed=2, **kw)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_a_write_over_four_planes_arrives_bit_exact_sprayed_over_every_port() -> None:
    with devices(4) as (a, b):
        link = Link(a, b, 1 << 20)
        seen: Counter[tuple[int, int]] = Counter()
        b.rx_tap = lambda port, src, flow, tos, data: seen.update([(port, src[1])])
        link.write()
        (wc,) = link.run()
        assert wc.status is WcStatus.SUCCESS and wc.byte_len == 1 << 20
        assert link.dst == link.src
        ports = Counter(p for p, _ in seen.elements())
        assert set(ports) == {1, 2, 3, 4}
        # spraying: the data came from many EVs (source ports), each within the dynamic range; the device
        # sprays in bursts of one GSO datagram, so 256 packets take at least 256 / burst EVs
        burst = a.config.spray_burst
        assert burst == gso_burst(4096) > 1
        sports = {s for _, s in seen}
        assert len(sports) >= 256 // burst and min(sports) >= 0xC000
        assert a.stats.tx_gso_batches >= 256 // burst // 2
        assert a.nic.stats.rx_bad_icrc == b.nic.stats.rx_bad_icrc == 0
        assert all(s.state is EVState.GOOD for s in link.qa.ev_states())


def test_per_packet_spraying_when_bursts_are_off() -> None:
    cfg = NicConfig(default_ev_sports=(0xC000, 0x10000), spray_burst=1)
    with devices(4, config=cfg) as (a, b):
        link = Link(a, b, 1 << 20)
        sports: set[int] = set()
        b.rx_tap = lambda port, src, flow, tos, data: sports.add(src[1])
        link.write()
        (wc,) = link.run()
        assert wc.status is WcStatus.SUCCESS and link.dst == link.src
        assert len(sports) > 50  # 256 packets over the 96 EVs of the rotation: each one used
        assert a.stats.tx_gso_batches == 0  # no two consecutive packets share a source port


def test_write_with_immediate_completes_on_the_receiver() -> None:
    with devices(2) as (a, b):
        link = Link(a, b, 64 << 10)
        b.post_recv(link.qb, RecvWR(9))
        link.write(imm=0xABCD)
        link.run()
        assert b.run_until(lambda: len(link.qb.recv_cq) > 0, 10)
        (wc,) = b.poll_cq(link.qb.recv_cq, 4)
        assert wc.wr_id == 9 and wc.imm_data == 0xABCD and link.dst == link.src


def _stev_profile(n: int = 16) -> EVProfile:
    fields = (
        EVField(16, min_val=1, max_val=0xFFFF, mask=0xFFFF),
        EVField(16, min_val=0xC000, max_val=0xFFFF, mask=0xFFFF),
    )
    return EVProfile(EVProfileMode.GEN, EVFormatProfile(EVFormatMode.STEV, (16, 16)), fields, n, 1)


@needs_ipv6
def test_stev_evs_carry_their_high_half_in_the_ipv6_flow_label() -> None:
    with devices(2, v6=True) as (a, b):
        link = Link(a, b, 1 << 20, profile=_stev_profile())
        seen: set[tuple[int, int]] = set()
        b.rx_tap = lambda port, src, flow, tos, data: seen.add((flow, src[1]))
        link.write()
        link.run()
        assert link.dst == link.src
        sent = {((s.entropy >> 16), s.entropy & 0xFFFF) for s in link.qa.ev_states()}
        assert seen <= sent and len(seen) >= 8  # every (flow label, source port) pair is one of the QP's EVs
        assert all(flow for flow, _ in seen)
        assert all(s.state is EVState.GOOD for s in link.qa.ev_states())
        assert a.nic.stats.rx_bogus_ack == 0


def test_a_mode_the_addresses_cannot_carry_is_refused_when_the_qp_connects() -> None:
    with devices(2) as (a, b):
        a.nic.add_ev_profile(5, _stev_profile())
        qa = a.create_qp()
        with pytest.raises(LocalProtocolError, match="need IPv6") as exc:
            a.connect(qa, Peer.of(b.endpoints()), 0x123, ev_profile_id=5)
        assert exc.value.errno == errno.EAFNOSUPPORT
        assert qa.state.name == "RESET"  # nothing half-done


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "authenticated"])
def test_ecn_marks_and_trimmed_packets_reach_the_transport(secure: bool) -> None:
    """Trimmed packets (the DSCP mark) are NACKed. Authenticated with header tags "auto": the first ones
    (no header tag: unverifiable) are recovered as losses, the receiver asks for header tags, and the
    sender's data packets carry them from then on; every trimmed packet is one or the other."""
    security = QpSecurity(SecurityDomain.generate(4)) if secure else None
    with devices(4) as (a, b):
        link = Link(a, b, 4 << 20, security=security)
        a.impair(ecn=0.1, trim=0.05)
        link.write()
        link.run()
        assert link.dst == link.src
        trimmed = a.stats.fault_trimmed
        assert trimmed > 0 and a.stats.fault_ecn > 0
        unverified = b.nic.stats.rx_auth_unsealed
        assert b.nic.stats.trims_seen + unverified == trimmed  # the DSCP mark said "trimmed"
        assert a.nic.stats.trims_received == trimmed - unverified  # each one NACKed
        assert a.nic.stats.retransmits >= trimmed
        if secure:
            assert unverified > 0 and a.nic.secure[link.qa.qp_num].header_tag
        else:
            assert unverified == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_loss_duplication_reordering_and_corruption_are_survived(seed: int) -> None:
    with devices(4) as (a, b):
        link = Link(a, b, 1 << 20)
        a._injector.rng.seed(seed)
        a.impair(loss=0.02, dup=0.02, reorder_ns=200_000, corrupt=0.02)
        b.impair(loss=0.02, corrupt=0.02)
        link.write()
        (wc,) = link.run(120)
        assert wc.status is WcStatus.SUCCESS and link.dst == link.src
        assert a.stats.fault_dropped and a.stats.fault_duplicated and a.stats.fault_delayed
        # every corrupted datagram is caught by the ICRC (none that the variant byte 4 absorbs is harmful)
        assert b.nic.stats.rx_bad_icrc + a.nic.stats.rx_bad_icrc > 0
        assert b.nic.stats.duplicates > 0


def test_a_blackholed_port_is_routed_around() -> None:
    with devices(4) as (a, b):
        link = Link(a, b, 2 << 20)
        a.blackhole_port(3)
        link.write()
        (wc,) = link.run(60)
        assert wc.status is WcStatus.SUCCESS and link.dst == link.src

        def bad_ports() -> set[int]:
            return {s.port for s in link.qa.ev_states() if s.state is EVState.ASSUMED_BAD}

        def settled() -> bool:  # an EV of a sound plane marked by a late SACK is probed back to GOOD
            b.progress(0)
            return bad_ports() == {3}

        assert a.run_until(settled, 10), bad_ports()  # ... and the blackholed plane's EVs stay bad


def test_forged_and_malformed_datagrams_are_dropped_and_counted() -> None:
    with devices(2) as (a, b):
        link = Link(a, b, 64 << 10)
        target = b.endpoints()[0]
        attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        attacker.bind((a.endpoints()[0][0], 0))
        sport = attacker.getsockname()[1]
        rng = random.Random(3)
        # random bytes, empty, truncated, a valid ICRC around a forged Write to the QP (bad R_Key)
        forged = data_packet(
            BTH(Opcode.WRITE_ONLY, dest_qp=link.qb.qp_num, psn=5),
            METH(0, 0),
            None,
            RETH(link.mr_b.addr, 0xDEAD, 4),
            None,
            memoryview(b"EVIL"),
        )
        junk = [rng.randbytes(rng.randrange(0, 200)) for _ in range(50)] + [b"", b"\xca"]
        sealed = seal(forged, Addressing(a.endpoints()[0][0], target[0], sport, target[1]))
        for d in [*junk, sealed, sealed[:-1]]:
            attacker.sendto(d, target)
        attacker.close()
        for _ in range(20):
            b.progress(0.01)
        s = b.nic.stats
        assert s.rx_bad_icrc + s.rx_malformed >= len(junk)
        assert s.access_errors >= 1 or s.rx_dropped_state >= 1 or s.protocol_errors >= 1
        assert bytes(link.dst[:4]) == bytes(4)  # nothing written
        link.write()
        link.run()
        assert link.dst == link.src


def test_progress_thread_and_asyncio_completions() -> None:
    with devices(2) as (a, b):
        link = Link(a, b, 1 << 20)
        a.start()
        b.start()
        with pytest.raises(LocalProtocolError, match="progress thread"):
            a.progress(0)

        async def main() -> list[Any]:
            link.write()
            return await asyncio.wait_for(a.wait_completions(link.qa.send_cq), 30)

        (wc,) = asyncio.run(main())
        assert wc.status is WcStatus.SUCCESS and link.dst == link.src


def test_close_flushes_pending_work_and_leaks_nothing() -> None:
    fds_before = len(os.listdir("/proc/self/fd"))
    with devices(2) as (a, b):
        link = Link(a, b, 4 << 20)
        a.blackhole_port(1)
        a.blackhole_port(2)  # nothing can arrive: the Write stays pending
        a.start()
        link.write(1)
        link.write(2)
        assert a.open_sockets() > 2
    assert a.closed and a.open_sockets() == 0 and not a.threaded
    wcs = link.qa.send_cq.poll(8)
    assert [w.status for w in wcs] == [WcStatus.WR_FLUSH_ERR] * 2
    assert len(os.listdir("/proc/self/fd")) == fds_before
    with pytest.raises(LocalProtocolError, match="closed"):
        a.post_send(link.qa, SendWR(3, WrOpcode.RDMA_WRITE, [], 0, 0))


def test_an_endpoint_in_use_is_named() -> None:
    ea, _ = _v4_endpoints(2)
    with UdpDevice(ea), pytest.raises(LocalProtocolError, match=r"port 1: cannot bind 127\..*:4791"):
        UdpDevice(ea)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.1", ("10.0.0.1", 4791)),
        ("10.0.0.1:5000", ("10.0.0.1", 5000)),
        ("::1", ("::1", 4791)),
        ("[::1]:4792", ("::1", 4792)),
        ("[fe80::1]", ("fe80::1", 4791)),
    ],
)
def test_parse_endpoint(text: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize(
    "text", ["10.0.0.300", "host", "10.0.0.1:0", "10.0.0.1:99999", "[::1]x", "1.2.3.4:ab"]
)
def test_parse_endpoint_rejects_with_a_reason(text: str) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        parse_endpoint(text)


def test_device_arguments_are_checked() -> None:
    with pytest.raises(LocalProtocolError, match=r"1\.\.32"):
        UdpDevice([])
    with pytest.raises(LocalProtocolError, match="twice"):
        UdpDevice(["127.0.0.1", "127.0.0.1"])
    with pytest.raises(LocalProtocolError, match="DSCP"):
        UdpDevice(["127.0.0.1"], trim_dscp=64)
    with UdpDevice([f"127.9.{_RNG.randrange(250)}.1"]) as d:
        with pytest.raises(LocalProtocolError, match="outside"):
            d.impair(port=2, loss=0.1)
        with pytest.raises(ValueError, match="probability"):
            d.impair(loss=1.5)


@needs_ipv6
def test_srv6_evs_go_to_their_usid_address_with_the_icrc_of_the_final_one() -> None:
    fmt = EVFormatProfile(EVFormatMode.SRV6, (32, 16, 16, 16, 16))
    fields = (EVField(32, 0xFC000000),) + (EVField(16, mask=0xFFFF),) * 4
    evs = tuple(struct.pack("!4H", 0xE000 + i, 0xF000, 0xE001, 0xF001) for i in range(4))
    prof = EVProfile(EVProfileMode.EXP, fmt, fields, len(evs), 1, 0, evs)
    ea, eb = _v6_endpoints(2)
    with UdpDevice(ea, seed=1) as a, UdpDevice(eb, seed=2) as b:
        a.nic.add_ev_profile(5, prof)
        qa = a.create_qp()
        a.connect(qa, Peer.of(b.endpoints()), 0x42, ev_profile_id=5)
        a.post_send(qa, SendWR(1, WrOpcode.RDMA_WRITE, [], 0x1000, 1))
        a.progress(0)  # zero-length Write: one packet, sent towards its uSID address (unroutable here)
        routes = [r for k, r in a._sender.routes.items() if k[0] in (1, 2)]
        assert routes
        for sock, dest, addr, _peer in routes:
            assert dest[0].startswith("fc00:0:e00")  # the uSID path
            # the ICRC: the address the last shift leaves (the last uSID), not the first hop's
            assert addr.dst == socket.inet_pton(socket.AF_INET6, "fc00:0:f001::")
            assert sock.getsockopt(17, 101) == 1  # UDP_NO_CHECK6_TX


def test_nic_config_override_is_used() -> None:
    cfg = NicConfig(default_ev_count=8, default_ev_sports=(0xD000, 0xD100))
    with devices(2, config=cfg) as (a, b):
        link = Link(a, b, 64 << 10)
        assert {s.entropy for s in link.qa.ev_states()} <= set(range(0xD000, 0xD100))
        link.write()
        link.run()
        assert link.dst == link.src


class _RefusesGso(socket.socket):
    """A socket on a host whose kernel refuses UDP segmentation offload (no checksum offload: EIO)."""

    def sendmsg(self, buffers: Any, ancdata: Any = (), flags: int = 0, address: Any = None) -> int:
        if any(kind == 103 for _level, kind, _data in ancdata):  # UDP_SEGMENT
            raise OSError(errno.EIO, "Input/output error")
        return super().sendmsg(buffers, ancdata, flags, address)


def test_a_host_that_refuses_gso_sends_datagram_by_datagram() -> None:
    """The first GSO send that fails with EIO turns GSO off for the device; that run and everything after
    it leave one datagram per call, and the Write arrives bit-exact."""
    with devices(2) as (a, b):
        link = Link(a, b, 1 << 20)
        for key, s in list(a._sockets.tx.items()):
            if s is not None:
                twin = _RefusesGso(s.family, s.type, s.proto, fileno=os.dup(s.fileno()))
                a._sockets.tx[key] = twin
                for port in a._sockets.ports:
                    if port.sock is s:
                        port.sock = twin
                s.close()
        link.write()
        assert [wc.status for wc in link.run()] == [WcStatus.SUCCESS]
        assert link.dst == link.src
        assert not a.gso and a.stats.tx_gso_batches == 0 and a.stats.tx_errors == 0


class _Capture(socket.socket):
    """A socket that keeps a copy of every datagram it sends (a GSO send split at its segment size)."""

    sent: list[bytes]

    def sendmsg(self, buffers: Any, ancdata: Any = (), flags: int = 0, address: Any = None) -> int:
        raw = b"".join(buffers)
        seg = next((struct.unpack("H", d)[0] for _level, kind, d in ancdata if kind == 103), len(raw))
        self.sent.extend(raw[i : i + seg] for i in range(0, len(raw), seg))
        return super().sendmsg(buffers, ancdata, flags, address)


def test_data_datagrams_are_the_bytes_of_their_packets_built_header_by_header() -> None:
    """What the device sends for a Write, first transmissions (the requester's records of its packets) and
    retransmissions alike, is byte for byte the packet built header by header from the Write (the ICRC
    aside, which the receiver checks): the RTX bit is all that tells a retransmission apart."""
    sent: list[bytes] = []
    with devices(2) as (a, b):
        link = Link(a, b, 256 << 10)
        for key, s in list(a._sockets.tx.items()):
            if s is not None:
                twin = _Capture(s.family, s.type, s.proto, fileno=os.dup(s.fileno()))
                twin.sent = sent
                a._sockets.tx[key] = twin
                for port in a._sockets.ports:
                    if port.sock is s:
                        port.sock = twin
                s.close()
        a._injector.rng.seed(3)
        a.impair(loss=0.05)
        link.write()
        assert [wc.status for wc in link.run()] == [WcStatus.SUCCESS]
        assert link.dst == link.src
        mtu, total = a.nic.config.mtu, len(link.src)
        npkts = total // mtu
        data = [(d, parse(d)) for d in sent]
        data = [(d, pkt) for d, pkt in data if pkt.reth is not None]
        first_psn = link.qa.attr.sq_psn or 0
        assert a.nic.stats.retransmits > 0 and any(pkt.bth.rtx for _d, pkt in data)
        for d, pkt in data:
            i = (pkt.bth.psn - first_psn) & 0xFFFFFF
            assert 0 <= i < npkts
            last = i == npkts - 1
            op = Opcode.WRITE_FIRST if i == 0 else Opcode.WRITE_LAST if last else Opcode.WRITE_MIDDLE
            want = data_packet(
                BTH(op, dest_qp=link.qb.qp_num, psn=pkt.bth.psn, ack_req=last, rtx=pkt.bth.rtx),
                METH(0, 1),
                None,
                RETH(link.mr_b.addr + i * mtu, link.mr_b.rkey, total),
                None,
                memoryview(link.src[i * mtu : (i + 1) * mtu]),
            )
            assert d[:-4] == want.encode()[:-4]
        assert {(pkt.bth.psn - first_psn) & 0xFFFFFF for _d, pkt in data} == set(range(npkts))


def test_a_sack_reports_how_long_its_trigger_waited_in_the_responders_host() -> None:
    """The responder's device reads a one-packet Write 30 ms after the kernel received it (its process was
    busy): the SACK that leaves says so in SETH ``svc``, from the kernel's receive timestamp, and the
    requester keeps it out of the RTT its congestion control sees and allows for it before a tail probe."""
    with devices(1) as (a, b):
        link = Link(a, b, 4096)
        sacks: list[int] = []

        def tap(port: int, src: Any, flow: int, tos: int, data: memoryview) -> None:
            pkt = parse(bytes(data))
            if pkt.seth is not None:
                sacks.append(pkt.seth.svc)

        a.rx_tap = tap
        link.write()
        a.progress(0)  # the packet leaves
        time.sleep(0.03)  # ... and waits in b's socket
        b.progress(0)  # read 30 ms late; the SACK leaves now
        assert a.run_until(lambda: bool(link.qa.send_cq.poll(4)), 10)
        assert sacks, "a SACK came back"
        held = service_time_ns(max(sacks))
        assert 25_000_000 <= held <= 60_000_000, held  # (30 ms, and what a slow interpreted round adds)
        rec = link.qa.requester.rec
        assert rec.peer_delay >= held  # remembered for the tail probe's wait
        assert rec.probe_wait(a.now()) >= rec.srtt + held


def test_a_busy_host_is_not_a_lossy_network() -> None:
    """A process busy-loops beside the transfer (a shared machine: the devices are descheduled for
    milliseconds, their sockets read late): 64 MiB over 4 planes arrive intact with almost nothing sent
    twice and no EV blamed (lateness is not loss)."""
    # a plain subprocess (multiprocessing's would leave its resource tracker a child of the test process)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with devices(4) as (a, b):
            link = Link(a, b, 64 << 20)
            b.start()  # the responder on its own thread, the requester on this one: three busy threads
            link.write()
            done: list[Any] = []
            assert a.run_until(lambda: bool(done.extend(link.qa.send_cq.poll(4)) or done), 60)
            assert done[0].status is WcStatus.SUCCESS and link.dst == link.src
            sent = a.nic.stats.tx_data
            assert a.nic.stats.retransmits <= 0.005 * sent, (a.nic.stats.retransmits, sent)
            assert all(s.state is not EVState.ASSUMED_BAD for s in link.qa.ev_states())
    finally:
        busy.kill()
        busy.wait(10)


def test_an_address_in_use_is_refused_with_what_to_do() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.9.1", 0))
        taken = f"127.0.9.1:{s.getsockname()[1]}"
    first = UdpDevice([taken])
    try:
        with pytest.raises(LocalProtocolError, match="another process has it") as exc:
            UdpDevice(["127.0.9.2", taken])
        assert exc.value.errno == errno.EADDRINUSE and f"port 2: cannot bind {taken}" in str(exc.value)
    finally:
        first.close()
