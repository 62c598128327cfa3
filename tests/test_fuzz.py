"""The fuzz targets of `tests.fuzz` as part of the suite: the seed corpus replayed in-process (no atheris
needed), a short coverage-guided atheris run of each target (skipped when atheris is not installed), checks
that the targets' invariants do catch planted bugs, and a reproducer per known bug they found in src/.

The long run is ``make fuzz`` (``python -m tests.fuzz.run --seconds 600``: ten minutes per target).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from openmrc import _native
from openmrc.provider.loopback import Pair
from openmrc.transport import WcStatus
from openmrc.wire import BTH, METH, PETH, RETH, Opcode, Packet, parse

from .fuzz import targets
from .fuzz.run import main as run_main
from .fuzz.targets import TARGETS, NicInput, Record, iter_corpus, nic_case
from .transport_tools import feed_bytes

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(targets.__file__).parent / "corpus"

#: Executions of the bounded atheris runs (on top of the seed corpus): a few seconds each on one core;
#: the three run at once.
RUNS = {"parse": 30_000, "frame": 30_000, "nic": 1_000}


# -- the seed corpus, in-process -----------------------------------------------------------------------------


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_seed_corpus_replays_clean(target: str) -> None:
    seeds = list(iter_corpus(target))
    assert 20 <= len(seeds) <= 60
    for name, data in seeds:
        try:
            TARGETS[target](data)
        except BaseException as exc:
            raise AssertionError(f"corpus/{target}/{name}: {exc}") from exc


def test_seed_corpus_is_small_and_reaches_every_packet_kind() -> None:
    files = [f for f in CORPUS.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) < 1 << 20
    kinds = {parse(data[1:], trimmed=bool(data[0] & 1)).bth.opcode for _, data in iter_corpus("parse")}
    assert kinds == {int(o) for o in Opcode}
    outcomes = [nic_case(NicInput.decode(data)) for _, data in iter_corpus("nic")]
    delivered = set().union(*(o.opcodes for o in outcomes))
    assert delivered == {int(o) for o in Opcode}  # every kind reached the NIC past the ICRC and the parser
    strict = [o for o in outcomes if not o.potent and not o.known]
    assert any(o.status is WcStatus.SUCCESS for o in strict)  # (c) checked in full...
    assert any(o.potent and o.status is not WcStatus.SUCCESS for o in outcomes)  # ...and relaxed


def test_nic_input_layout_round_trips() -> None:
    rec = Record(b"\x01" * 300, to="a", steps=2, sealed=False, ecn=True, as_peer=True, port=3, qp=2, key=3)
    inp = NicInput(
        packets=4, imm=True, short=9, records=(rec, Record(b"xy"), Record(b"", key=1, va_offset=-4))
    )
    assert NicInput.decode(inp.encode()) == inp


def test_runner_replays_files_without_atheris(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(["parse", "frame", "--replay", str(CORPUS / "parse"), str(CORPUS / "frame")]) == 0
    assert "replayed clean" in capsys.readouterr().out


# -- short coverage-guided runs ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """The three bounded atheris runs, started together (each target is one process: atheris.Fuzz exits)."""
    try:
        import atheris  # noqa: F401
    except ImportError as exc:  # not installed (no wheel for this platform), or it does not load
        pytest.skip(f"atheris unavailable ({exc}); `pip install atheris` (wheels: Linux x86-64)")
    work = tmp_path_factory.mktemp("fuzz")
    env = {**os.environ, "OPENMRC_PURE": "1", "PYTHONWARNINGS": "ignore::RuntimeWarning"}
    procs = {
        t: subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.run", t, "--runs", str(n), "--seed", "1", "--work", str(work)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for t, n in RUNS.items()
    }
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("target", sorted(RUNS))
def test_bounded_fuzz_run(target: str, fuzz_runs: dict[str, subprocess.Popen[str]]) -> None:
    proc = fuzz_runs[target]
    try:
        out, _ = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"fuzz run of {target} did not finish:\n{out[-3000:]}")
    log = "\n".join(line for line in out.splitlines() if not line.startswith("INFO: Instrumenting"))
    crash = re.search(r"Test unit written to (\S+)", log)
    hint = f"\nreproduce: python -m tests.fuzz.run {target} --replay {crash.group(1)}" if crash else ""
    assert proc.returncode == 0, f"fuzzing {target} found a failure:\n{log[-4000:]}{hint}"
    runs = re.search(r"stat::number_of_executed_units: (\d+)", log)
    assert runs is not None and int(runs.group(1)) >= RUNS[target], log[-2000:]


# -- the invariants catch planted bugs (interpreted build: compiled classes cannot be patched) ---------------

interpreted = pytest.mark.skipif(
    bool(_native.compiled), reason="planting a bug needs the interpreted sources (OPENMRC_PURE=1)"
)


@interpreted
def test_parse_target_sees_exceptions_behind_wire_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    import openmrc.wire.packet as packet

    def broken(data: object, trimmed: bool) -> Packet:
        raise KeyError("planted")

    monkeypatch.setattr(packet, "_parse", broken)
    with pytest.raises(AssertionError, match="codec bug behind a WireError"):
        targets.target_parse(b"\x00" + bytes(20))


def _forged_write(psn: int, n: int = 8) -> bytes:
    return Packet(
        BTH(Opcode.WRITE_ONLY, psn=psn), METH(0, 1), None, RETH(0, 0, n), payload=b"\x5a" * n
    ).encode()


@interpreted
def test_nic_target_sees_writes_to_a_local_only_region(monkeypatch: pytest.MonkeyPatch) -> None:
    from openmrc.transport.mr import MrTable

    inp = NicInput(records=(Record(_forged_write(psn=1), to="b", qp=1, key=2, va_offset=16),))
    nic_case(inp)  # refused: the region allows no remote writes
    monkeypatch.setattr(MrTable, "_remote", lambda self, rkey: self._by_rkey.get(rkey))  # access ignored
    with pytest.raises(AssertionError, match="local-only region"):
        nic_case(inp)


@interpreted
def test_nic_target_sees_a_transfer_broken_by_a_harmless_packet(monkeypatch: pytest.MonkeyPatch) -> None:
    from openmrc.transport.responder import Responder

    probe = Packet(BTH(Opcode.PROBE, psn=0), peth=PETH(probe_id=1)).encode()
    inp = NicInput(records=(Record(probe, to="b", qp=1),))
    assert nic_case(inp).status is WcStatus.SUCCESS
    monkeypatch.setattr(
        Responder, "on_probe", lambda self, pkt, now, *a: self.qp.set_error(now, WcStatus.REM_OP_ERR)
    )
    with pytest.raises(AssertionError, match="failed"):
        nic_case(inp)


# -- bugs the targets found in src/, fixed: their reproducers stay as regression tests ----------------------
# (A bug found and not yet fixed goes into KNOWN_BUGS in tests/fuzz/targets.py with an xfail reproducer.)


def test_found_w1_trimmed_packet_round_trip() -> None:
    pkt = Packet(BTH(Opcode.WRITE_ONLY, dest_qp=0x123456, psn=7), METH(1, 0), None, RETH(0x1000, 1, 5))
    raw = pkt.encode_headers(trimmed=True) + b"\xfa" + bytes(4)  # one payload byte left after trimming
    once = parse(raw, trimmed=True)
    assert bytes(once.payload) == b"\xfa"
    again = parse(once.encode(trimmed=True), trimmed=True)
    assert bytes(again.payload) == b"\xfa"  # fails: b"\xfa\x00\x00\x00"


@pytest.mark.parametrize("psn", [5, 1], ids=["beyond", "next"])
def test_found_k3_a_forged_write_at_an_unsent_psn_ends_the_qp_with_a_reason_not_a_hang(psn: int) -> None:
    """K3: QP b takes a forged Write at a PSN QP a never sent (in its window; RDMA has no authentication):
    from then on QP b's SACKs acknowledge a PSN never sent (its bitmap, or, at the next PSN, its cumulative
    PSN once PSN 0 arrives). Believing them would have QP a take lost or unsent data for delivered; they
    are refused and counted, and QP a, hearing nothing it can believe, fails with RETRY_EXC_ERR after its
    retries (it once hung, then believed the SACKs' true part: issue "authenticated, isolated MRC")."""
    p = Pair(seed=1, timeout=6, retry_linear=3, retry_exp=2)
    wr = p.write(0, 100)  # one packet, PSN 0
    forged = Packet(  # placed outside the Write's bytes
        BTH(Opcode.WRITE_ONLY, dest_qp=p.qp_b.qp_num, psn=psn),
        METH(0, 1),
        None,
        RETH(p.mr_b.addr + 8192, p.mr_b.rkey, 4),
        payload=b"evil",
    )
    feed_bytes(p.b, forged, 1, p.now, src="a")
    p.run(lambda: len(p.qp_a.send_cq) > 0, max_steps=100_000)
    assert [(w.wr_id, w.status) for w in p.completions()] == [(wr, WcStatus.RETRY_EXC_ERR)]
    assert p.a.stats.rx_bogus_ack >= 1 and "timeouts in a row" in p.qp_a.error_detail
