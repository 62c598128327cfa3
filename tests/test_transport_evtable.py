"""EV behaviour: `EvTable` unit tests (rotation, planes, SKIP, ASSUMED_BAD and backups, the min_active floor,
probing, DENIED, port masks) and the same mechanisms end to end in the pair harness."""

from __future__ import annotations

import errno
import random
from collections import Counter
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openmrc.ev import EVFormatMode, EVState
from openmrc.transport import EvEntry, EvEvent, EvTable, LocalProtocolError, Nic, NicConfig, WcStatus
from openmrc.transport.evtable import _Draws, _round, shuffle
from openmrc.transport.profiles import sample_range
from openmrc.wire import EpOp, Opcode

from .helpers import Impairments, Pair
from .transport_tools import install, run_until_completions, statuses, tap_receive

GOOD, SKIP, BAD, DENIED = EVState.GOOD, EVState.SKIP, EVState.ASSUMED_BAD, EVState.DENIED
PROBE_INTERVAL = 1_000


def test_rotation_shuffle_draws_what_random_shuffle_draws() -> None:
    """The rotation's own shuffle must stay interchangeable with `random.Random.shuffle` (seeded runs)."""

    class Subclass(random.Random):
        pass

    for n in (0, 1, 2, 3, 7, 64, 96, 129, 1000):
        for seed in range(5):
            for cls in (random.Random, Subclass):
                a, b = cls(seed), cls(seed)
                xs = [EvEntry(bytes(32), 1, i) for i in range(n)]
                ys = list(xs)
                shuffle(a, xs)
                b.shuffle(ys)
                assert xs == ys and a.random() == b.random()


@given(st.integers(0, 2**32), st.lists(st.integers(0, 300), max_size=12))
def test_consecutive_shuffles_draw_what_consecutive_random_shuffles_draw(seed: int, sizes: list[int]) -> None:
    """A table's plane shuffles and its rotation's share one batch of words (`_Draws`): the same orders
    as `random.Random.shuffle` on each list in turn, and the generator left where that leaves it (a batch
    fetched ahead must never hold a word the shuffles do not use)."""
    a, b = random.Random(seed), random.Random(seed)
    draws = _Draws(a, sum(max(n - 1, 0) for n in sizes))
    for n in sizes:
        xs = [EvEntry(bytes(32), 1, i) for i in range(n)]
        ys = list(xs)
        draws.shuffle(xs)
        b.shuffle(ys)
        assert xs == ys
    assert a.getrandbits(64) == b.getrandbits(64)


@given(
    st.floats(min_value=0, allow_nan=False, allow_infinity=False)
    | st.integers(0, 10**6).map(lambda n: n / 2)  # every half, which rounds to even
    | st.tuples(st.integers(0, 300), st.floats(0, 1)).map(lambda t: t[0] * t[1])  # a plane times a fraction
)
def test_a_tables_rounding_is_round(x: float) -> None:
    """How many of a plane's EVs are active is ``round(size * fraction)``, half to even, as the builtin."""
    assert _round(x) == round(x)


@pytest.mark.parametrize(
    ("ports", "per_port", "fraction"), [(1, 1, 0.75), (4, 4, 0.75), (8, 16, 0.5), (3, 7, 1.0)]
)
def test_a_table_draws_its_rotation_as_random_shuffle_would(
    ports: int, per_port: int, fraction: float
) -> None:
    """A table built on a plain `random.Random` (the batched draws) and one built on a subclass (which
    shuffles with the subclass's own `shuffle`, one call per list) agree on every slot and backup, and
    leave their generators in one state."""

    class Subclass(random.Random):
        pass

    rows = [(bytes(32), p, (p << 16) | i) for p in range(1, ports + 1) for i in range(per_port)]
    plain, sub = random.Random(9), Subclass(9)
    x = EvTable(rows, rng=plain, min_active=1, active_fraction=fraction)
    y = EvTable(rows, rng=sub, min_active=1, active_fraction=fraction)
    assert [e.entropy for e in x.rotation] == [e.entropy for e in y.rotation]
    assert {p: [e.entropy for e in b] for p, b in x.backups.items()} == {
        p: [e.entropy for e in b] for p, b in y.backups.items()
    }
    assert plain.random() == sub.random()


@given(
    st.integers(0, 2**32),
    st.integers(0, 70_000),
    st.integers(0, 20_000),
    st.integers(0, 1100),
    st.booleans(),
)
def test_sample_range_draws_what_random_sample_draws(
    seed: int, start: int, n: int, k: int, subclass: bool
) -> None:
    """A NIC's default EVs come from `sample_range`, which must stay interchangeable with
    `random.Random.sample` of a range (both branches: a pool when the range is small, a set otherwise): the
    same values, the source left in the same state, the same error when ``k`` does not fit."""

    class Subclass(random.Random):
        pass

    cls = Subclass if subclass else random.Random
    a, b = cls(seed), cls(seed)
    try:
        want = b.sample(range(start, start + n), k)
    except ValueError:
        with pytest.raises(ValueError):
            sample_range(a, start, start + n, k)
        return
    assert sample_range(a, start, start + n, k) == want
    assert a.getrandbits(64) == b.getrandbits(64)


@given(
    st.lists(st.integers(0, 0xFFFFFFFF) | st.integers(0, 40) | st.integers(0xC000, 0xC03F), min_size=1),
    st.lists(st.integers(0, 0xFFFFFFFF), max_size=20),
)
def test_find_answers_as_a_dict_of_the_echo_values(echoes: list[int], others: list[int]) -> None:
    """`EvTable.find` (an open-addressing index) finds what a dict by echo value would: the later EV of
    a repeated value, nothing for a value no EV has, whatever collides."""
    t = EvTable([(bytes(32), 1 + i % 3, v) for i, v in enumerate(echoes)], rng=random.Random(1), min_active=1)
    by_value = {e.entropy: e for e in t.entries}
    assert t.by_entropy == by_value
    for v in echoes + others:
        assert t.find(v) is by_value.get(v)


def test_find_in_a_table_of_hundreds_of_evs() -> None:
    """From 255 EVs on the index takes two bytes a slot: every EV is still found, and nothing else."""
    rng = random.Random(7)
    for n in (254, 255, 700):
        values = [rng.getrandbits(32) for _ in range(n - 20)] + [rng.randrange(64) for _ in range(20)]
        t = EvTable([(bytes(32), 1, v) for v in values], rng=random.Random(1), min_active=1)
        by_value = {e.entropy: e for e in t.entries}
        for v in [*values, *(rng.getrandbits(32) for _ in range(200))]:
            assert t.find(v) is by_value.get(v)


def entries(ports: int = 4, per_port: int = 8) -> list[tuple[bytes, int, int]]:
    """``ports * per_port`` EVs, the ports interleaved as a NIC's default profile lays them out."""
    out = []
    for i in range(ports * per_port):
        entropy = 0x1000 + i
        out.append((entropy.to_bytes(2, "big") + bytes(30), 1 + i % ports, entropy))
    return out


def table(
    ports: int = 4, per_port: int = 8, *, seed: int = 0, min_active: int = 1, **kw: Any
) -> tuple[EvTable, list[EvEvent]]:
    events: list[EvEvent] = []
    kw.setdefault("probe_interval", PROBE_INTERVAL)
    t = EvTable(
        entries(ports, per_port),
        rng=random.Random(seed),
        min_active=min_active,
        emit=events.append,
        qp_num=0x42,
        profile_id=3,
        **kw,
    )
    return t, events


def picks_by_epoch(t: EvTable, n: int) -> dict[int, list[EvEntry]]:
    """``n`` picks grouped by the rotation (epoch) each picked EV was read from."""
    groups: dict[int, list[EvEntry]] = {}
    for _ in range(n):
        e = t.pick()
        assert e is not None
        groups.setdefault(t.epoch, []).append(e)
    return groups


def same_port_backup(t: EvTable, e: EvEntry) -> list[EvEntry]:
    return [b for b in t.backups.get(e.port, []) if b.state is GOOD]


# -- rotation and planes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("reshuffle", [1, 3])
def test_rotation_visits_every_active_ev_once_per_epoch(reshuffle: int) -> None:
    t, _ = table(seed=5, reshuffle_rotations=reshuffle)
    n = len(t.rotation)
    orders = []
    for epoch, group in sorted(picks_by_epoch(t, 6 * n).items()):
        assert len(group) == n and set(group) == set(t.rotation), epoch
        orders.append([e.entropy for e in group])
    changes = [i for i in range(1, len(orders)) if orders[i] != orders[i - 1]]
    assert changes and all(i % reshuffle == 0 for i in changes)  # re-shuffled exactly at epoch multiples


def test_bursts_keep_new_data_on_one_ev_and_still_visit_the_whole_rotation() -> None:
    t, _ = table(seed=5, burst=4)
    n = len(t.rotation)
    picks = [t.pick() for _ in range(4 * n)]
    runs = [picks[i : i + 4] for i in range(0, len(picks), 4)]
    assert all(r[0] is not None and r.count(r[0]) == 4 for r in runs)  # four in a row on each EV
    assert {r[0] for r in runs} == set(t.rotation)  # one burst per EV of the rotation
    assert t.epoch == 0


def test_a_burst_ends_when_its_ev_turns_unusable_and_retransmissions_leave_it() -> None:
    t, _ = table(seed=6, burst=8)
    first = t.pick()
    assert first is not None and t.pick() is first
    retx = t.pick(first)  # a retransmission avoids its old EV and does not end the burst
    assert retx is not None and retx is not first and t.pick() is first
    ctrl = t.pick(None, port=first.port % 4 + 1)  # a control packet on another plane: nor does it
    assert ctrl is not None and t.pick() is first
    t.skip(first)  # ECN on the burst's EV: the next packet takes the next EV
    nxt = t.pick()
    assert nxt is not None and nxt is not first and t.pick() is nxt
    t.mark_bad(nxt, 0)
    after = t.pick()
    assert after is not None and after is not nxt and after.state is GOOD
    t.port_mask = ~(1 << (after.port - 1)) & 0xF  # its plane goes down
    last = t.pick()
    assert last is not None and last.port != after.port


def test_active_set_is_drawn_equally_from_every_plane() -> None:
    t, _ = table(ports=4, per_port=16, active_fraction=0.75)
    assert Counter(e.port for e in t.rotation) == {1: 12, 2: 12, 3: 12, 4: 12}
    assert {p: len(b) for p, b in t.backups.items()} == {1: 4, 2: 4, 3: 4, 4: 4}
    assert all(b.port == p and b.slot == -1 for p, bs in t.backups.items() for b in bs)
    assert sorted(e.slot for e in t.rotation) == list(range(48))
    assert set(t.rotation).isdisjoint(b for bs in t.backups.values() for b in bs)


def test_active_set_depends_on_the_injected_rng() -> None:
    def order(seed: int) -> list[int]:
        return [e.entropy for e in table(seed=seed)[0].rotation]

    assert order(1) == order(1) and order(1) != order(2)


# -- SKIP ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "where",
    [
        "first",
        "middle",
        "last",
    ],
)
def test_skip_excludes_for_the_rest_of_the_rotation_only(where: str) -> None:
    t, events = table(seed=2)
    n = len(t.rotation)
    e = t.rotation[{"first": 0, "middle": n // 2, "last": n - 1}[where]]
    t.skip(e)
    assert e.state is SKIP
    groups = picks_by_epoch(t, 3 * n)
    assert e not in groups[0] and len(groups[0]) == n - 1
    assert groups[1].count(e) == 1 and e.state is GOOD
    assert not events  # SKIP is internal, never reported


def test_skip_does_not_touch_bad_or_denied() -> None:
    t, _ = table()
    a, b = t.rotation[0], t.rotation[1]
    t.mark_bad(a, 0)
    t.set_state(b, DENIED, 0)
    t.skip(a)
    t.skip(b)
    assert (a.state, b.state) == (BAD, DENIED)


# -- ASSUMED_BAD, backups, the floor ----------------------------------------------------------------------


def test_mark_bad_replaces_from_the_same_plane_and_emits() -> None:
    t, events = table(seed=1)
    e = t.rotation[7]
    slot, backups_before = e.slot, len(t.backups[e.port])
    expected = same_port_backup(t, e)[0]
    t.mark_bad(e, 1234)
    assert e.state is BAD and e in t.bad and e.slot == -1
    assert t.rotation[slot] is expected and expected.slot == slot and expected.port == e.port
    assert len(t.backups[e.port]) == backups_before - 1
    assert Counter(x.port for x in t.rotation) == {1: 6, 2: 6, 3: 6, 4: 6}  # planes stay balanced
    assert events == [EvEvent(1234, 0x42, 3, e.port, e.expanded, e.entropy, BAD)]
    assert all(t.pick() is not e for _ in range(3 * len(t.rotation)))


def test_mark_bad_without_backup_keeps_the_slot_but_never_picks_it() -> None:
    t, events = table(active_fraction=1.0)
    e = t.rotation[3]
    t.mark_bad(e, 5)
    assert e.state is BAD and e.slot == 3 and t.rotation[3] is e
    assert [ev.state for ev in events] == [BAD]
    assert all(t.pick() is not e for _ in range(3 * len(t.rotation)))


def test_mark_bad_twice_emits_once() -> None:
    t, events = table()
    e = t.rotation[0]
    t.mark_bad(e, 1)
    t.mark_bad(e, 2)
    assert len(events) == 1


def test_never_below_min_active() -> None:
    t, events = table(ports=2, per_port=4, active_fraction=1.0, min_active=5)
    for i, e in enumerate(list(t.rotation)):
        t.mark_bad(e, i)
        assert t.usable_count() >= 5
        if i < 3:
            assert e.state is BAD
        else:  # at the floor: only rested for this rotation
            assert e.state is SKIP and e not in t.bad
    assert t.usable_count() == 5
    assert [ev.state for ev in events] == [BAD] * 3


def test_bad_backup_is_dropped_from_the_backups() -> None:
    t, events = table()
    b = t.backups[2][0]
    t.mark_bad(b, 9)
    assert b.state is BAD and b not in t.backups[2] and len(events) == 1
    for e in [x for x in t.rotation if x.port == 2]:  # every slotted EV of the plane fails too
        t.mark_bad(e, 10)
    assert b.slot == -1 and b not in t.rotation  # a bad backup never takes a slot


# -- probing ------------------------------------------------------------------------------------------------


def test_probes_are_scheduled_every_interval() -> None:
    t, _ = table()
    e = t.rotation[0]
    t.mark_bad(e, 100)
    assert t.next_probe_time() == 100 + PROBE_INTERVAL
    assert t.due_probes(100 + PROBE_INTERVAL - 1) == []
    assert t.due_probes(100 + PROBE_INTERVAL) == [e]
    assert t.due_probes(100 + PROBE_INTERVAL) == []  # not twice for one interval
    assert t.next_probe_time() == 100 + 2 * PROBE_INTERVAL


def test_probes_are_not_repeated_before_an_answer_can_come() -> None:
    t, _ = table()
    e = t.rotation[0]
    t.mark_bad(e, 0)
    slow = 7 * PROBE_INTERVAL  # the QP's probe timeout, longer than the interval
    assert t.due_probes(PROBE_INTERVAL, slow) == [e]
    assert t.next_probe_time() == PROBE_INTERVAL + slow
    assert t.due_probes(PROBE_INTERVAL + slow - 1, slow) == []
    assert t.due_probes(PROBE_INTERVAL + slow, PROBE_INTERVAL // 2) == [e]  # a shorter one: the interval
    assert t.next_probe_time() == 2 * PROBE_INTERVAL + slow


@pytest.mark.parametrize("restore", [1, 2, 4])
def test_probe_answered_n_times_restores_good(restore: int) -> None:
    t, events = table(probes_to_restore=restore)
    e = t.rotation[0]
    t.mark_bad(e, 0)
    for k in range(restore - 1):
        t.probe_answered(e, k, True)
        assert e.state is BAD
    t.probe_answered(e, 50, False)  # an answer with M != NONE starts the count again
    for k in range(restore - 1):
        t.probe_answered(e, 60 + k, True)
        assert e.state is BAD
    t.probe_answered(e, 99, True)
    assert e.state is GOOD and e not in t.bad and t.next_probe_time() is None
    assert [(ev.state, ev.time) for ev in events] == [(BAD, 0), (GOOD, 99)]
    assert e in t.backups[e.port]  # its slot went to a backup; it becomes one


def test_restored_ev_keeps_its_slot_when_no_backup_took_it() -> None:
    t, _ = table(active_fraction=1.0, probes_to_restore=1)
    e = t.rotation[2]
    t.mark_bad(e, 0)
    t.probe_answered(e, 1, True)
    assert e.state is GOOD and t.rotation[2] is e
    assert e in picks_by_epoch(t, len(t.rotation))[0]


def test_probe_answer_for_a_good_ev_changes_nothing() -> None:
    t, events = table()
    e = t.rotation[0]
    t.probe_answered(e, 0, True)
    assert e.state is GOOD and not events


# -- DENIED -------------------------------------------------------------------------------------------------


def test_denied_is_never_picked_nor_probed_nor_auto_recovered() -> None:
    t, events = table(probes_to_restore=1)
    slotted, backup, bad = t.rotation[0], t.backups[1][0], t.rotation[1]
    t.mark_bad(bad, 0)
    for e in (slotted, backup, bad):
        t.set_state(e, DENIED, 10)
        assert e.state is DENIED and e not in t.bad
    for _ in range(4 * len(t.rotation)):
        assert t.pick() not in (slotted, backup, bad)
    assert t.due_probes(10**9) == [] and t.next_probe_time() is None
    for e in (slotted, backup, bad):
        t.probe_answered(e, 20, True)
        t.mark_bad(e, 30)
        assert e.state is DENIED
    assert [ev.state for ev in events] == [BAD, DENIED, DENIED, DENIED]
    # Every other EV of a plane failing does not resurrect a denied backup either.
    for e in [x for x in t.entries if x.port == backup.port and x.state is GOOD]:
        t.mark_bad(e, 40)
    assert backup.state is DENIED and backup.slot == -1


def test_denied_without_backup_keeps_its_slot_unused() -> None:
    t, events = table(active_fraction=1.0, probes_to_restore=1)
    e, bad = t.rotation[4], t.rotation[5]
    t.mark_bad(bad, 0)
    t.set_state(e, DENIED, 1)
    t.set_state(bad, DENIED, 2)
    assert t.rotation[4] is e and t.rotation[5] is bad  # no backup to take the slots
    for _ in range(4 * len(t.rotation)):
        assert t.pick() not in (e, bad)
    assert t.usable_count() == len(t.rotation) - 2
    t.probe_answered(bad, 3, True)
    assert bad.state is DENIED and [ev.state for ev in events] == [BAD, DENIED, DENIED]


def test_controller_good_lifts_a_denial() -> None:
    t, events = table()
    e = t.rotation[0]
    t.set_state(e, DENIED, 1)
    t.set_state(e, GOOD, 2)
    assert e.state is GOOD and [ev.state for ev in events] == [DENIED, GOOD]
    with pytest.raises(ValueError):
        t.set_state(e, SKIP, 3)


# -- port mask ----------------------------------------------------------------------------------------------


def test_port_mask_excludes_a_planes_evs() -> None:
    t, _ = table(ports=4)
    t.port_mask = 0b1011  # port 3 unusable
    picked = [t.pick() for _ in range(3 * len(t.rotation))]
    assert all(e is not None and e.port != 3 for e in picked)
    assert {e.port for e in picked if e is not None} == {1, 2, 4}
    assert t.usable_count() == 18
    assert t.pick(port=3) is None
    e3 = next(e for e in t.rotation if e.port == 3)
    t.mark_bad(e3, 0)
    assert t.due_probes(10**9) == [] and t.next_probe_time() is None  # not probed while unusable
    t.port_mask = 0b1111
    assert t.due_probes(10**9) == [e3]


def test_pick_on_a_port_and_avoid() -> None:
    t, _ = table(ports=2, per_port=2, active_fraction=0.5)
    only = {e.port: e for e in t.rotation}
    assert all(t.pick(port=2) is only[2] for _ in range(4))
    assert t.pick(avoid=only[1]) is only[2]
    t.mark_bad(only[2], 0)  # a backup takes its place
    t.port_mask = 0b01
    assert t.pick(avoid=only[1]) is only[1]  # the only usable EV is still better than none


# -- end to end ----------------------------------------------------------------------------------------------

T_FAIL = 20_000
MiB = 1 << 20


def transfer_pair(imp: Impairments | None = None, seed: int = 5) -> tuple[Pair, Any]:
    p = Pair(seed=seed, buf_size=4 * MiB, imp=imp or Impairments())
    return p, install(p)


def write_all(p: Pair) -> list[int]:
    return [p.write(i * MiB, MiB) for i in range(4)]


def check_done(p: Pair, ids: list[int]) -> None:
    assert statuses(p.completions()) == [(i, WcStatus.SUCCESS) for i in ids]
    assert p.dst == p.src


def ev_history(p: Pair, entropy: int) -> list[tuple[int, EVState]]:
    return [(x.time, x.state) for x in p.a.ev_events if x.entropy == entropy and x.qp_num == p.qp_a.qp_num]


def test_failing_ev_is_abandoned_once_its_first_loss_is_confirmed() -> None:
    """An inferred loss holds the EV at once (out of the rotation, no event); the retransmission is
    acknowledged, no duplicate of the original follows within the judging grace, and the EV is ASSUMED_BAD
    then."""
    p, hook = transfer_pair()
    assert p.qp_a.evs is not None
    e = p.qp_a.evs.rotation[3].entropy
    p.fabric.imp.ev_fail = {e: (T_FAIL, None)}
    ids = write_all(p)
    run_until_completions(p, 4)
    check_done(p, ids)
    rec = p.qp_a.requester.rec
    p.run(lambda: not rec.judging, max_time=p.now + 10**7)
    history = ev_history(p, e)
    assert [s for _, s in history] == [BAD]
    t_bad = history[0][0]
    lost = hook.select(src="a", entropy=e, since=T_FAIL, data=True)
    assert lost, "the EV carried data after it failed"
    first_retx = min(s.time for s in hook.select(src="a", data=True) if s.rtx and s.psn == lost[0].psn)
    # blamed a judging grace (the loss wait and the SACK delay) after the retransmission's answer came
    rtt = max(rec.srtt, rec.base_rtt)
    assert T_FAIL < first_retx < t_bad <= first_retx + 2 * rtt + rec.tlp_wait(t_bad) + rtt
    assert not hook.select(src="a", entropy=e, since=t_bad, data=True)
    assert p.a.stats.spurious_losses == 0  # the original was lost, not late
    p.run(max_time=t_bad + 3 * p.a.config.probe_interval_ns)  # the EV stays failed: probed, never used
    counts = hook.opcode_counts(src="a", entropy=e, since=t_bad)
    assert set(counts) == {Opcode.PROBE} and counts[Opcode.PROBE] >= 2


def test_failed_ev_returns_to_good_once_probes_succeed() -> None:
    recover = 150_000
    p, hook = transfer_pair()
    assert p.qp_a.evs is not None
    e = p.qp_a.evs.rotation[3].entropy
    p.fabric.imp.ev_fail = {e: (T_FAIL, recover)}
    ids = write_all(p)
    run_until_completions(p, 4)
    check_done(p, ids)
    p.run(lambda: len(ev_history(p, e)) >= 2, max_time=p.now + 10**7, max_steps=100_000)
    history = ev_history(p, e)
    assert [s for _, s in history] == [BAD, GOOD]
    assert p.qp_a.evs.by_entropy[e].state is GOOD and not p.qp_a.evs.bad
    probes = [s.time for s in hook.select(src="a", entropy=e) if s.opcode == Opcode.PROBE]
    answered = [t for t in probes if t >= recover]
    assert len(answered) >= p.a.config.probes_to_restore and history[1][0] > answered[-1]
    p.run(max_steps=10_000)  # nothing left to probe: the pair goes idle
    assert p.a.get_timer() is None


def test_a_slow_path_is_probed_once_per_probe_timeout_and_every_answer_counts() -> None:
    """RTTs far above the probe interval (a software NIC, a loaded peer): a bad EV's next probe waits for
    the answer to its last one, so probes do not pile up on a slow path nor go unmatched."""
    cfg = NicConfig(probe_interval_ns=50_000, base_rtt_ns=400_000)
    # RTT 0.4 ms: 8 probe intervals (and an ACK timeout of 1 ms: above it)
    p = Pair(seed=3, buf_size=4 * MiB, config=cfg, latency_ns=200_000, timeout=10)
    hook = install(p)
    assert p.qp_a.evs is not None
    fail = [p.qp_a.evs.rotation[i].entropy for i in (1, 4, 9)]
    p.fabric.imp.ev_fail = {e: (0, 3_000_000) for e in fail}  # (the whole transfer leaves at once)
    ids = write_all(p)
    run_until_completions(p, 4)
    check_done(p, ids)
    p.run(lambda: all(len(ev_history(p, e)) >= 2 for e in fail), max_time=p.now + 10**8, max_steps=200_000)
    for e in fail:
        assert [s for _, s in ev_history(p, e)] == [BAD, GOOD]
        probes = [s.time for s in hook.select(src="a", entropy=e) if s.opcode == Opcode.PROBE]
        assert len(probes) >= cfg.probes_to_restore
        # one probe at a time: the next leaves once the last one's answer can have come (the first answer
        # after a silence is confirmed at once, one RTT later)
        assert min(b - a for a, b in pairwise(probes)) >= cfg.base_rtt_ns
    assert p.a.stats.rx_bogus_ack == 0  # every answer matched the probe it answers


def test_denied_evs_never_carry_a_packet() -> None:
    p, hook = transfer_pair(Impairments(loss=0.03, reorder_ns=2_000))
    evs = p.qp_a.evs
    assert evs is not None
    denied = [evs.rotation[i].entropy for i in range(0, len(evs.rotation), 5)]
    denied += [bs[0].entropy for bs in evs.backups.values()]
    for d in denied:
        p.a.modify_ev_state(p.qp_a, d, DENIED, now=p.now)
    ids = write_all(p)
    run_until_completions(p, 4)
    check_done(p, ids)
    assert p.a.stats.retransmits > 0 and evs.bad  # backups were needed
    assert not [s for s in hook.select(src="a") if s.entropy in denied]
    assert all(evs.by_entropy[d].state is DENIED for d in denied)
    assert not [x for x in p.a.ev_events if x.entropy in denied and x.state is GOOD]


def test_modify_ev_state_unknown_entropy_raises() -> None:
    p = Pair()
    with pytest.raises(LocalProtocolError, match="no EV") as info:
        p.a.modify_ev_state(p.qp_a, 0xDEADBEEF, DENIED, now=0)
    assert info.value.errno == errno.ENOENT


def test_failed_port_is_abandoned_ev_by_ev() -> None:
    port = 2
    p, hook = transfer_pair(Impairments(port_fail={port: (T_FAIL, None)}))
    ids = write_all(p)
    run_until_completions(p, 4)
    check_done(p, ids)
    p.run(lambda: not p.qp_a.requester.rec.judging, max_time=p.now + 10**7)  # every loss judged
    assert p.qp_a.evs is not None
    bad_at = {x.entropy: x.time for x in p.a.ev_events if x.state is BAD and x.port == port}
    # every port-2 EV that lost a packet's first transmission was marked bad (a lost retransmission is
    # judged with its original)
    used_after = {s.entropy for s in hook.select(src="a", port=port, since=T_FAIL, data=True) if not s.rtx}
    assert used_after and used_after <= set(bad_at)
    for entropy, t_bad in bad_at.items():
        assert not hook.select(src="a", entropy=entropy, since=t_bad, data=True)
    last = max(bad_at.values())
    assert not hook.select(src="a", port=port, since=last, data=True)


def test_port_down_stops_all_traffic_on_it_and_tells_the_peer() -> None:
    port = 3
    p, hook = transfer_pair()
    rx_b = tap_receive(p, p.b)
    ids = write_all(p)
    p.run(lambda: p.now >= T_FAIL)
    t_down = p.now
    p.a.port_down(port, now=t_down)
    run_until_completions(p, 4)
    check_done(p, ids)
    assert not hook.select(src="a", port=port, since=t_down)  # no packet of any kind
    assert p.b.peer_ports["a"] == 0b1111 & ~(1 << (port - 1))
    psu = [r for r in rx_b if r.packet.erth is not None and r.packet.erth.op == EpOp.PORT_STATUS_UPDATE]
    assert len(psu) == 1
    assert not hook.select(src="b", port=port, since=psu[0].time)  # the peer stopped using the plane
    p.a.port_up(port, now=p.now)
    assert p.b.peer_ports["a"] != 0b1111  # the update is still in flight
    p.run(max_steps=10_000)
    assert p.b.peer_ports["a"] == 0b1111


def test_an_ev_keeps_port_slot_and_skip_epoch_apart() -> None:
    e = EvEntry(bytes(32), 255, 0xFFFFFFFF)
    assert (e.port, e.slot, e.skip_epoch) == (255, -1, -1)
    e.slot, e.skip_epoch = 0xFFFD, 10**12
    assert (e.port, e.slot, e.skip_epoch, e.entropy) == (255, 0xFFFD, 10**12, 0xFFFFFFFF)
    e.slot = -1
    assert (e.port, e.slot, e.skip_epoch) == (255, -1, 10**12)
    e.skip_epoch = 3
    assert (e.port, e.slot, e.skip_epoch) == (255, -1, 3)
    with pytest.raises(ValueError, match="port 256"):
        EvEntry(bytes(32), 256, 0)


# -- installing expanded profiles ------------------------------------------------------------------------


def test_expanded_profile_rows_and_columns_install_the_same_binding() -> None:
    evs = [bytes([i]) * 32 for i in range(6)]
    ports = [1, 2, 3, 4, 1, 2]
    a, b = Nic(4, rng=random.Random(1)), Nic(4, rng=random.Random(1))
    x = a.profiles.add_expanded_profile(7, EVFormatMode.SRV6, list(zip(evs, ports, strict=True)), 2, 0)
    y = b.profiles.add_expanded_columns(7, EVFormatMode.SRV6, evs, ports, 2, 0)
    assert x.entries == y.entries and len(x.entries) == 6 and (x.min_active, y.min_active) == (2, 2)


@pytest.mark.parametrize(
    ("evs", "ports", "min_active", "message"),
    [
        ([bytes(32)] * 2, [1], 1, "2 EVs but 1 ports"),
        ([bytes(32), bytes(31)], [1, 2], 1, "EV 1: 31 bytes"),
        ([bytes(32)] * 3, [1, 5, 2], 1, "EV 1: port 5 outside 1..4"),
        ([bytes(32)] * 2, [1, 0], 1, "EV 1: port 0 outside 1..4"),
        ([bytes(32)] * 2, [1, 2], 3, "min_active: 3 outside 0..2"),
        ([], [], 0, "min_active: 0 outside 0..0"),
    ],
)
def test_expanded_columns_that_do_not_fit_raise_and_install_nothing(
    evs: list[bytes], ports: list[int], min_active: int, message: str
) -> None:
    nic = Nic(4, rng=random.Random(1))
    with pytest.raises(LocalProtocolError, match=message) as err:
        nic.profiles.add_expanded_columns(3, EVFormatMode.SRV6, evs, ports, min_active, 0)
    assert err.value.errno == errno.EINVAL and 3 not in nic.profiles.ev


def test_an_expanded_profile_keeps_its_own_copy_of_a_callers_buffer() -> None:
    buf = bytearray(32)
    nic = Nic(2, rng=random.Random(1))
    b = nic.profiles.add_expanded_columns(1, EVFormatMode.SRV6, [buf], [2], 1, 0)
    buf[0] = 0xFF
    assert b.entries == ((bytes(32), 2, b.entries[0][2]),) and type(b.entries[0][0]) is bytes
