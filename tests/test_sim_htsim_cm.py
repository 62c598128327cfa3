"""htsim connection matrices: the shipped samples, triggers, failures, every error, and round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openmrc.sim.htsim_cm import (
    DEFAULT_PRIO,
    SWITCH_TYPES,
    TRIGGER_KINDS,
    CmError,
    Connection,
    ConnectionMatrix,
    LinkFailure,
    Trigger,
    load_cm,
    parse_cm,
)

SAMPLES = Path(__file__).parents[1] / "src" / "openmrc" / "sim" / "scenarios" / "data"  # copies of htsim's
INT32_MAX = 2**31 - 1

# -- shipped samples ---------------------------------------------------------------------------------


def test_perm_1024_has_ids_and_reproduces_the_file() -> None:
    path = SAMPLES / "perm_1024n_1024c_0u_2000000b.cm"
    m = load_cm(path)
    assert m.nodes == 1024
    assert len(m.connections) == 1024
    assert m.triggers == () and m.failures == ()
    # First and last lines: "334->395 id 1 start 0 size 2000000", "530->825 id 1024 start 0 size 2000000".
    assert m.connections[0] == Connection(src=334, dst=395, size=2_000_000, start_us=0, id=1)
    assert m.connections[-1] == Connection(src=530, dst=825, size=2_000_000, start_us=0, id=1024)
    assert [c.id for c in m.connections] == list(range(1, 1025))
    assert all(c.trigger is None and c.prio == DEFAULT_PRIO and c.msg is None for c in m.connections)
    assert sorted(c.dst for c in m.connections) == list(range(1024))  # a permutation
    assert m.to_text() == path.read_text()


def test_incast_has_no_ids() -> None:
    path = SAMPLES / "incast.cm"
    m = load_cm(str(path))
    assert m.nodes == 16
    assert len(m.connections) == 15
    assert [(c.src, c.dst) for c in m.connections] == [(s, 15) for s in range(15)]
    assert all(c.id is None and c.start_us == 0 and c.start_ns == 0 for c in m.connections)
    assert {c.size for c in m.connections} == {2_000_000}
    # The sample has no final newline; to_text always ends with one.
    assert m.to_text() == path.read_text().rstrip("\n") + "\n"


@pytest.mark.parametrize("name", ["perm_128n_128c_2MB.cm", "perm_16n_16c_2MB.cm"])
def test_other_samples_parse_and_round_trip(name: str) -> None:
    path = SAMPLES / name
    m = load_cm(path)
    first = path.read_text().splitlines()[2]
    src, dst = first.split(" ")[0].split("->")
    assert (m.connections[0].src, m.connections[0].dst) == (int(src), int(dst))
    assert len(m.connections) == m.nodes
    assert parse_cm(m.to_text()) == m


def test_every_sample_loads() -> None:
    paths = sorted(SAMPLES.glob("*.cm"))
    assert len(paths) >= 4
    for path in paths:
        assert load_cm(path).connections


# -- triggers, failures, other keywords ---------------------------------------------------------------

CHAIN = """\
# a chain: 0->1 then 1->2 when it has been sent, then a barrier on both
Nodes 4
Connections 4
Triggers 3
Failures 2
0->1 id 1 start 5.9 size 1000 send_done_trigger 1
1->2 id 2 trigger 1 size 2000 recv_done_trigger 2 prio 7
2->3 size 3000 id 3 start 1e3 recv_done_trigger 2
3->0 id 4 trigger 2 size 4000 send_done_trigger 3

trigger id 1 oneshot
trigger barrier count 2 id 2
trigger id 3 multishot
failure switch_type TOR switch_id 3 link_id 0
failure link_id 5 switch_id 1 switch_type CORE
"""


def test_triggers_failures_and_keywords() -> None:
    m = parse_cm(CHAIN)
    assert m.nodes == 4
    c0, c1, c2, c3 = m.connections
    assert c0 == Connection(src=0, dst=1, size=1000, start_us=5, id=1, send_done_trigger=1)
    assert c0.start_ns == 5000
    assert c1 == Connection(src=1, dst=2, size=2000, id=2, trigger=1, recv_done_trigger=2, prio=7)
    assert c1.start_us is None and c1.start_ns is None
    assert c2.start_us == 1000 and c2.id == 3
    assert c3.trigger == 2 and c3.send_done_trigger == 3
    assert m.triggers == (
        Trigger(id=1, kind="oneshot", count=1),
        Trigger(id=2, kind="barrier", count=2),
        Trigger(id=3, kind="multishot", count=1),
    )
    assert m.failures == (LinkFailure("TOR", 3, 0), LinkFailure("CORE", 1, 5))
    assert parse_cm(m.to_text()) == m


def test_triggers_may_precede_connections_and_header_counts_of_zero() -> None:
    text = (
        "Nodes 2\nConnections 1\nTriggers 1\nFailures 0\ntrigger id 9 oneshot\n1->0 id 1 trigger 9 size 1\n"
    )
    m = parse_cm(text)
    assert m.triggers == (Trigger(9, "oneshot"),) and m.connections[0].trigger == 9


def test_reused_connection_messages() -> None:
    # As in htsim's conn_reuse examples: a bare msg, and numbered ones, on connection 1.
    text = (
        "Nodes 2\nConnections 4\n"
        "0->1 id 1 msg start 0 size 4086\n"
        "0->1 id 1 msg start 0 size 4086\n"
        "0->1 id 1 msg 7 start 3 size 10\n"
        "0->1 start 0 size 5 id 2 msg\n"
    )
    m = parse_cm(text)
    assert [c.msg for c in m.connections] == [0, 0, 7, 0]
    assert m.connections[0].to_line() == "0->1 id 1 msg start 0 size 4086"
    assert parse_cm(m.to_text()) == m


def test_lenient_whitespace_and_comments() -> None:
    text = "Nodes 3 \r\n\r\n# comment\nConnections 1\t\n  \n0->2 start 0 size 9   \r\n# trailing comment"
    m = parse_cm(text)
    assert m == ConnectionMatrix(nodes=3, connections=(Connection(0, 2, 9, start_us=0),))


def test_empty_matrix() -> None:
    m = parse_cm("Nodes 1\nConnections 0\n")
    assert m == ConnectionMatrix(nodes=1, connections=())
    assert m.to_text() == "Nodes 1\nConnections 0\n"


def test_load_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "perm.cm"
    path.write_text("Nodes 2\nConnections 1\n\n\n\n\n0->1 start 0 size abc\n")
    with pytest.raises(CmError) as ei:
        load_cm(path)
    assert str(ei.value) == f"{path}:7: size: 'abc' is not an integer"
    assert (ei.value.source, ei.value.line, ei.value.field) == (str(path), 7, "size")
    assert isinstance(ei.value, ValueError)


def test_load_rejects_non_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.cm"
    path.write_bytes(b"Nodes 2\nConnections 0\n\xff\n")
    with pytest.raises(CmError, match=r"bad\.cm:3: encoding: "):
        load_cm(path)


# -- errors -------------------------------------------------------------------------------------------

HEAD = "Nodes 4\nConnections 1\n"  # the connection under test is on line 3
TRIG = HEAD + "Triggers 1\n0->1 start 0 size 1\n"  # the trigger under test is on line 5
FAIL = HEAD + "Failures 1\n0->1 start 0 size 1\n"  # the failure under test is on line 5
DUP = "Nodes 4\nConnections 2\n0->1 id 3 start 0 size 1\n"  # the second use of id 3 is on line 4

ERRORS = [
    # header
    ("Connections 0\n", 1, "Nodes", "missing"),
    ("Nodes 4\n0->1 start 0 size 1\n", 2, "Connections", "missing"),
    ("", 1, "Nodes", "missing"),
    ("Nodes\nConnections 0\n", 1, "Nodes", "keyword without a value"),
    ("Nodes x\nConnections 0\n", 1, "Nodes", "'x' is not an integer"),
    ("Nodes 0\nConnections 0\n", 1, "Nodes", "out of range"),
    ("Nodes 4 5\nConnections 0\n", 1, "Nodes", "unexpected '5'"),
    ("Nodes 4\nNodes 4\nConnections 0\n", 2, "Nodes", "given twice (first on line 1)"),
    ("Nodes 4\nConnections -1\n", 2, "Connections", "out of range"),
    ("Nodes 4\nTiers 3\nConnections 0\n", 2, "Tiers", "unknown keyword"),
    (HEAD + "0->1 start 0 size 1\nNodes 4\n", 4, "Nodes", "header line after the first"),
    ("Nodes 4\nConnections 2\n0->1 start 0 size 1\n", 2, "Connections", "header says 2 but the file has 1"),
    (HEAD + "0->1 start 0 size 1\n1->2 start 0 size 1\n", 2, "Connections", "says 1 but the file has 2"),
    (HEAD + "Triggers 2\n1->0 id 1 trigger 1 size 1\ntrigger id 1 oneshot\n", 3, "Triggers", "header says 2"),
    (HEAD + "1->0 id 1 trigger 1 size 1\ntrigger id 1 oneshot\n", 4, "Triggers", "no 'Triggers 1' header"),
    (FAIL, 3, "Failures", "header says 1 but the file has 0"),
    (HEAD + "0->1 start 0 size 1\nfailure switch_type TOR switch_id 0 link_id 0\n", 4, "Failures", "no"),
    # connection endpoints
    (HEAD + "a->1 start 0 size 1\n", 3, "src", "'a' is not an integer"),
    (HEAD + "0-> start 0 size 1\n", 3, "dst", "'' is not an integer"),
    (HEAD + "-1->2 start 0 size 1\n", 3, "src", "out of range"),
    (HEAD + "4->1 start 0 size 1\n", 3, "src", "host 4 does not exist"),
    (HEAD + "0->4 start 0 size 1\n", 3, "dst", "host 4 does not exist"),
    (HEAD + "2->2 start 0 size 1\n", 3, "dst", "sends to itself"),
    # connection keywords
    (HEAD + "0->1 start 0\n", 3, "size", "missing"),
    (HEAD + "0->1 start 0 size 0\n", 3, "size", "out of range (1..2147483647)"),
    (HEAD + "0->1 start 0 size -5\n", 3, "size", "out of range"),
    (HEAD + "0->1 start 0 size 2147483648\n", 3, "size", "out of range"),
    (HEAD + "0->1 start 0 size 1.5\n", 3, "size", "'1.5' is not an integer"),
    (HEAD + "0->1 start 0 size\n", 3, "size", "keyword without a value"),
    (HEAD + "0->1 size 1 start\n", 3, "start", "keyword without a value"),
    (HEAD + "0->1 size 1\n", 3, "start", "missing: give start T or trigger K"),
    (TRIG + "0->1 id 1 start 0 trigger 1 size 1\n", 5, "start", "not both"),
    (HEAD + "0->1 start soon size 1\n", 3, "start", "'soon' is not a number"),
    (HEAD + "0->1 start -1 size 1\n", 3, "start", "out of range"),
    (HEAD + "0->1 start nan size 1\n", 3, "start", "'nan' is not a number"),
    (HEAD + "0->1 start 4294967296 size 1\n", 3, "start", "out of range"),
    (HEAD + "0->1 start 0 size 1 colour red\n", 3, "colour", "unknown connection keyword"),
    (HEAD + "0->1 start 0 size 1 size 2\n", 3, "size", "given twice"),
    (HEAD + "0->1 start 0  size 1\n", 3, "syntax", "empty token"),
    (HEAD + " 0->1 start 0 size 1\n", 3, "syntax", "empty token"),
    (HEAD + "0->1\tstart 0 size 1\n", 3, "dst", "is not an integer"),
    (HEAD + "0->1 id 0 start 0 size 1\n", 3, "id", "out of range"),
    (HEAD + "0->1 id x start 0 size 1\n", 3, "id", "'x' is not an integer"),
    (HEAD + "0->1 start 0 size 1 prio 2147483648\n", 3, "prio", "out of range"),
    (HEAD + "0->1 start 0 size 1 msg 0\n", 3, "msg", "out of range"),
    (HEAD + "0->1 start 0 size 1 msg\n", 3, "msg", "needs the connection's id"),
    (HEAD + "0->1 id 1 trigger 0 size 1\n", 3, "trigger", "out of range"),
    (TRIG + "1->0 trigger 1 size 1\ntrigger id 1 oneshot\n", 5, "trigger", "needs the connection's id"),
    (TRIG + "1->0 trigger 1 id 2 size 1\ntrigger id 1 oneshot\n", 5, "trigger", "id before it"),
    # trigger references
    (HEAD + "0->1 id 1 trigger 5 size 1\n", 3, "trigger", "trigger 5 is never defined"),
    (HEAD + "0->1 start 0 size 1 send_done_trigger 6\n", 3, "send_done_trigger", "trigger 6 is never"),
    (HEAD + "0->1 start 0 size 1 recv_done_trigger 7\n", 3, "recv_done_trigger", "trigger 7 is never"),
    # duplicate connection ids
    (DUP + "2->3 id 3 start 0 size 1\n", 4, "id", "duplicate connection id 3 (first on line 3)"),
    (DUP + "2->3 id 3 msg 2 start 0 size 1\n", 4, "id", "connection 3 is 0->1 (line 3)"),
    # trigger lines
    (TRIG + "trigger id 1 roundrobin\n", 5, "kind", "'roundrobin' is not a trigger kind"),
    (TRIG + "trigger id 1\n", 5, "kind", "missing"),
    (TRIG + "trigger id 1 oneshot barrier\n", 5, "kind", "given twice"),
    (TRIG + "trigger oneshot\n", 5, "id", "missing"),
    (TRIG + "trigger id 0 oneshot\n", 5, "id", "out of range"),
    (TRIG + "trigger oneshot id\n", 5, "id", "keyword without a value"),
    (TRIG + "trigger id 1 id 2 oneshot\n", 5, "id", "given twice"),
    (TRIG + "trigger id 1 barrier\n", 5, "count", "a barrier needs count"),
    (TRIG + "trigger id 1 barrier count 0\n", 5, "count", "out of range (1.."),
    (TRIG + "trigger id 1 oneshot count 2\n", 5, "count", "only a barrier"),
    (TRIG.replace("Triggers 1", "Triggers 2") + "trigger id 1 oneshot\ntrigger id 1 multishot\n", 6, "id",
     "duplicate trigger id 1 (first on line 5)"),
    # failure lines
    (FAIL + "failure switch_type SPINE switch_id 0 link_id 0\n", 5, "switch_type", "'SPINE'"),
    (FAIL + "failure switch_type TOR switch_id 0\n", 5, "link_id", "missing"),
    (FAIL + "failure switch_type TOR switch_id 0 link_id\n", 5, "link_id", "without a value"),
    (FAIL + "failure switch_type TOR switch_id -1 link_id 0\n", 5, "switch_id", "out of range"),
    (FAIL + "failure switch_type TOR switch_id 0 link_id z\n", 5, "link_id", "'z' is not an integer"),
    (FAIL + "failure switch_type TOR port 1 switch_id 0 link_id 0\n", 5, "port", "unknown failure keyword"),
    (FAIL + "failure switch_type TOR switch_type AGG\n", 5, "switch_type", "given twice"),
    # unknown line
    (HEAD + "0->1 start 0 size 1\nflow 0 1\n", 4, "flow", "unknown keyword"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "field", "reason"), ERRORS)
def test_errors_name_line_and_field(text: str, line: int, field: str, reason: str) -> None:
    with pytest.raises(CmError) as ei:
        parse_cm(text, source="t.cm")
    err = ei.value
    assert (err.source, err.line, err.field) == ("t.cm", line, field), str(err)
    assert str(err).startswith(f"t.cm:{line}: {field}: "), str(err)
    assert reason in err.reason, str(err)


def test_default_source_name() -> None:
    with pytest.raises(CmError, match=r"^<string>:1: Nodes: "):
        parse_cm("Nodes -1\nConnections 0\n")


# -- properties ---------------------------------------------------------------------------------------

ids = st.integers(1, INT32_MAX)


@st.composite
def matrices(draw: st.DrawFn) -> ConnectionMatrix:
    nodes = draw(st.integers(2, 1 << 20))
    trigger_ids = draw(st.lists(ids, unique=True, max_size=4))
    triggers = []
    for tid in trigger_ids:
        kind = draw(st.sampled_from(TRIGGER_KINDS))
        count = draw(ids) if kind == "barrier" else 1
        triggers.append(Trigger(tid, kind, count))
    refs = st.sampled_from(trigger_ids) if trigger_ids else st.nothing()
    conn_ids = iter(draw(st.lists(ids, unique=True, min_size=10, max_size=10)))
    connections: list[Connection] = []
    for _ in range(draw(st.integers(0, 10))):
        with_id = [c for c in connections if c.id is not None]
        if draw(st.booleans()) and with_id:  # another message on an earlier connection
            prev = draw(st.sampled_from(with_id))
            src, dst, cid = prev.src, prev.dst, prev.id
            msg: int | None = draw(st.integers(0, INT32_MAX))
        else:
            src = draw(st.integers(0, nodes - 1))
            dst = draw(st.integers(0, nodes - 2))
            dst += dst >= src
            cid = next(conn_ids) if draw(st.booleans()) else None
            msg = draw(st.none() | st.integers(0, INT32_MAX)) if cid is not None else None
        trigger = draw(st.none() | refs) if cid is not None else None
        connections.append(
            Connection(
                src=src,
                dst=dst,
                size=draw(ids),
                start_us=None if trigger is not None else draw(st.integers(0, 2**32 - 1)),
                id=cid,
                trigger=trigger,
                send_done_trigger=draw(st.none() | refs),
                recv_done_trigger=draw(st.none() | refs),
                prio=draw(st.just(DEFAULT_PRIO) | st.integers(-(2**31), INT32_MAX)),
                msg=msg,
            )
        )
    failure = st.builds(
        LinkFailure, st.sampled_from(SWITCH_TYPES), st.integers(0, INT32_MAX), st.integers(0, INT32_MAX)
    )
    return ConnectionMatrix(
        nodes=nodes,
        connections=tuple(connections),
        triggers=tuple(triggers),
        failures=tuple(draw(st.lists(failure, max_size=3))),
    )


@settings(max_examples=100, deadline=None)
@given(matrices())
def test_round_trip(m: ConnectionMatrix) -> None:
    text = m.to_text()
    assert parse_cm(text) == m
    assert parse_cm(text).to_text() == text


WORDS = [
    "Nodes", "Connections", "Triggers", "Failures", "0->1", "1->0", "2->2", "trigger", "failure", "id",
    "start", "size", "msg", "prio", "send_done_trigger", "recv_done_trigger", "oneshot", "barrier", "count",
    "switch_type", "TOR", "switch_id", "link_id", "0", "1", "2", "-1", "1.5", "x", "", "#", "\n", "\n", "\n",
]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=40))
def test_any_text_parses_or_raises_cm_error(words: list[str]) -> None:
    try:
        parse_cm(" ".join(words))
    except CmError as e:
        assert e.line >= 1
