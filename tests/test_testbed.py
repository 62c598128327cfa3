"""The namespace testbed on the real kernel (root only): built from the fabric export alone, `openmrc perf`
between two hosts sprays over every spine, and a blackholed spine link is routed around and comes back."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from openmrc.testbed import Testbed, TestbedError, missing
from openmrc.testbed.experiment import FailoverResult, failover, openmrc_argv

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"testbed: {missing()}")

ROOT = Path(__file__).resolve().parent.parent
LINK = "p0-t0-0--p0-t1-1"  # host0's plane-0 uplink to the second spine

# Each run's namespaces carry its process id, so two test runs on one machine never tear down each other's
# testbeds; those a killed run left behind are removed by the next run (their process is gone).
_OURS = re.compile(r"omrct(\d+)([a-z])-")


def _prefix(tag: str) -> str:
    return f"omrct{os.getpid()}{tag}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="module", autouse=True)
def _remove_stale_testbeds(tmp_path_factory: pytest.TempPathFactory) -> None:
    stale = set()
    for name in Testbed(prefix="omrct", state_dir=tmp_path_factory.mktemp("tb-any")).namespaces():
        m = _OURS.match(name)
        if m and not _alive(int(m[1])):
            stale.add(f"omrct{m[1]}{m[2]}-")
    for prefix in stale:
        Testbed(prefix=prefix, state_dir=tmp_path_factory.mktemp("tb-stale")).down()


def _bed(tmp: Path, prefix: str, mode: str) -> Iterator[Testbed]:
    bed = Testbed(prefix=prefix, state_dir=tmp)
    bed.down()
    bed.up(2, 4, 2, mode=mode)
    try:
        yield bed
    finally:
        assert bed.down() == 12
        assert bed.namespaces() == []


@pytest.fixture(scope="module")
def srv6_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    yield from _bed(tmp_path_factory.mktemp("tb-srv6"), _prefix("s"), "srv6")


@pytest.fixture(scope="module")
def ecmp_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    yield from _bed(tmp_path_factory.mktemp("tb-ecmp"), _prefix("e"), "ecmp")


def _check_failover(r: FailoverResult, evs: int) -> None:
    assert r.hash_ok  # bit-exact through the failure
    assert r.evs == evs
    assert all(n > 200 for n in r.spine_packets.values()), r.spine_packets  # every spine carried traffic
    assert r.detect_s is not None and r.detect_s < 0.5, r.detect_s  # the failed link's EVs went ASSUMED_BAD
    assert r.max_bad < r.evs  # ... and only those
    assert r.goodput_during > 0  # traffic went on over the other paths
    assert r.recover_s is not None, "probes never brought the EVs back after the heal"
    # none of them stays bad: at the end fewer EVs are bad than the failure made bad (a software NIC can
    # still doubt an EV now and then when its own processing stalls past the loss timer; probes bring
    # such an EV back within a few RTTs, so the last report may catch one)
    assert r.intervals[-1]["evs_bad"] < r.max_bad


def test_srv6_spraying_over_every_spine_survives_a_blackholed_spine_link(srv6_bed: Testbed) -> None:
    fab = srv6_bed.fabric()
    assert fab.srv6 and srv6_bed.mode == "srv6"
    r = failover(srv6_bed, link=LINK, duration=4.0, fail_at=1.0, heal_at=2.0)
    _check_failover(r, 4)  # host0 -> host3: 2 planes x 2 spines, one uSID path each
    rows = {row["link"]: row for row in srv6_bed.status()}
    assert rows[LINK]["dropped"] > 0 and rows[LINK]["fault"] == ""  # healed, and it did drop


def test_ecmp_with_stev_flow_labels_survives_a_blackholed_spine_link(ecmp_bed: Testbed) -> None:
    assert not ecmp_bed.fabric().srv6
    r = failover(ecmp_bed, link=LINK, duration=5.0, fail_at=1.0, heal_at=2.0)
    _check_failover(r, 64)


def test_the_same_host_pair_under_one_t0_uses_no_spine(srv6_bed: Testbed) -> None:
    r = failover(srv6_bed, src=0, dst=1, duration=1.0)
    assert r.hash_ok and r.evs == 2  # one path per plane, through the shared T0
    assert all(n < 50 for n in r.spine_packets.values()), r.spine_packets


def test_faults_and_errors_name_what_is_wrong(srv6_bed: Testbed) -> None:
    with pytest.raises(TestbedError, match="no link 'p0-t0-0--p1-t1-0'"):
        srv6_bed.fail("p0-t0-0--p1-t1-0")
    with pytest.raises(TestbedError, match="a testbed is up already"):
        srv6_bed.up(2, 4, 2)
    with pytest.raises(ValueError, match="loss"):
        srv6_bed.loss(LINK, 1.5)
    srv6_bed.loss("p1-t1-0--p1-t0-1", 0.05)  # either order names the link
    assert {r["link"]: r["fault"] for r in srv6_bed.status()}["p1-t0-1--p1-t1-0"] == "loss 5%"
    assert srv6_bed.heal() == ["p1-t0-1--p1-t1-0"]
    with pytest.raises(TestbedError, match="no node 'host9'"):
        srv6_bed.exec_argv("host9", ["true"])
    out = subprocess.run(srv6_bed.exec_argv("host0", ["ip", "-6", "addr"]), capture_output=True, text=True)
    assert srv6_bed.fabric().host_address(0, 0) in out.stdout


def test_cli_up_status_down(tmp_path: Path) -> None:
    env = {**os.environ, "OPENMRC_TESTBED_PREFIX": _prefix("c"), "OPENMRC_TESTBED_DIR": str(tmp_path / "st")}
    cli = [*openmrc_argv(), "testbed"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, env=env, timeout=120)

    try:
        assert run("status").returncode == 1  # nothing up: a one-line error
        bad = run("up", "--spines", "0")
        assert bad.returncode == 2 and "--spines 0" in bad.stderr + bad.stdout
        ok = run("up", "--planes", "1", "--hosts", "2", "--spines", "1", "--mode", "ecmp")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        hint = next(x for x in ok.stdout.splitlines() if x.startswith("try: "))
        me = shlex.split(hint[len("try: ") : hint.index(" testbed exec ")])  # runs without a venv on PATH
        assert (
            subprocess.run([*me, "version"], capture_output=True, env={"PATH": "/usr/bin:/bin"}).returncode
            == 0
        )
        again = run("up")
        assert again.returncode == 1 and "already" in again.stderr  # (diagnostics on stderr)
        st = run("status")
        assert st.returncode == 0 and "host0--p0-t0-0" in st.stdout and "ecmp" in st.stdout
        ex = run("exec", "host1", "--", sys.executable, "-c", "print('inside')")
        assert ex.returncode == 0 and ex.stdout.strip() == "inside"
        assert "Traceback" not in run("fail", "nope").stdout
        left = subprocess.Popen([*cli, "exec", "host1", "--", "sleep", "300"], env=env)  # running at down
        time.sleep(1)
    finally:
        down = run("down")
    assert down.returncode == 0 and "removed 5 namespaces" in down.stdout
    assert left.wait(timeout=10) != 0  # `down` stopped what ran inside (it would outlive its namespace)
    assert run("down").stdout.strip() == "no testbed was up"


def test_a_killed_up_leaves_a_testbed_that_says_it_is_half_built(tmp_path: Path) -> None:
    prefix, state = _prefix("k"), tmp_path / "st"
    kill_midway = (  # `up` killed (SIGKILL: nothing cleans up) once its namespaces and links exist
        "import os, signal, sys\n"
        "from openmrc.testbed import Testbed\n"
        "Testbed(prefix=sys.argv[1], state_dir=sys.argv[2]).up(1, 2, 1, mode='ecmp', "
        "log=lambda _m: os.kill(os.getpid(), signal.SIGKILL))\n"
    )
    killed = subprocess.run([sys.executable, "-c", kill_midway, prefix, str(state)], timeout=120)
    assert killed.returncode == -signal.SIGKILL
    env = {**os.environ, "OPENMRC_TESTBED_PREFIX": prefix, "OPENMRC_TESTBED_DIR": str(state)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*openmrc_argv(), "testbed", *args], capture_output=True, text=True, env=env)

    try:
        assert Testbed(prefix=prefix, state_dir=state).namespaces()  # it did leave namespaces behind
        for args in (("status",), ("fail", "host0--p0-t0-0"), ("exec", "host0", "--", "true")):
            res = run(*args)
            assert res.returncode == 1 and res.stdout == "", (args, res)
            assert "half-built" in res.stderr and "testbed down" in res.stderr
            assert "Traceback" not in res.stderr
    finally:
        assert "removed" in run("down").stdout
    assert "no testbed is up" in run("status").stderr


def test_ddp_training_over_mrc_goes_on_through_a_blackholed_spine_link(
    ecmp_bed: Testbed, tmp_path: Path
) -> None:
    """examples/testbed_train.py's run on the 4 namespace hosts: the link fails at step 8 and heals 2.5 s
    later; training finishes, and steps complete while the link is down."""
    pytest.importorskip("torch")
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("testbed_train", ROOT / "examples" / "testbed_train.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = argparse.Namespace(steps=40, fail_step=8, heal_after=2.5, width=64, batch=32, timeout=180.0)
    rec = mod.run_backend(ecmp_bed, "mrc", args, tmp_path, LINK, lambda _m: None)
    assert rec["finished"], rec.get("error")
    assert rec["fail_time"] is not None and rec["heal_time"] is not None
    during = [e for e in rec["ends"] if rec["fail_time"] < e < rec["heal_time"]]
    assert len(during) >= 2, "no training step completed while the spine link was down"
    assert ecmp_bed.status() and not any(r["fault"] for r in ecmp_bed.status())  # healed afterwards
    s = mod.summarise(rec)
    assert s["steps"] == 40 and s["during_ms"] is not None
