"""htsim connection matrices (``.cm``/``.tm``): the workload files htsim's datacenter simulators take.

openmrc reads them so the packet-level simulator can replay the same flows as an htsim run (permutation,
incast, trigger-chained collectives) and compare completion times; `ConnectionMatrix.to_text` writes
matrices htsim accepts, so a workload built in openmrc can be run on htsim too. This module only reads
and writes the format; it schedules nothing.

The format (htsim ``datacenter/connection_matrix.cpp``), one record a line, fields separated by single
spaces::

    Nodes 16                  header, any order, before the first record: Nodes and Connections
    Connections 2             required, Triggers and Failures optional (absent means 0); every count
    Triggers 1                is checked against the records that follow
    0->15 id 1 start 0 size 2000000 send_done_trigger 1
    1->15 id 2 trigger 1 size 2000000 prio 100
    trigger id 1 oneshot      kinds: oneshot, multishot, barrier (a barrier takes count n, its arrivals)
    failure switch_type TOR switch_id 3 link_id 0

A connection is ``SRC->DST`` and keyword/value pairs in any order: ``size`` (bytes, required), exactly one
of ``start`` (microseconds) and ``trigger``, and optionally ``id``, ``send_done_trigger``,
``recv_done_trigger``, ``prio`` (default 2000000) and ``msg``. htsim reads ``start`` as a float and
truncates it to whole microseconds, so ``start 2.9`` starts at 2 µs; openmrc keeps the truncated
integer. ``msg M`` marks one message of several sent over one connection (htsim ``-conn_reuse``): such
lines repeat the connection's ``id``. A bare ``msg`` (no number), which htsim's own examples use, is kept
as ``msg=0``.

Checks htsim makes (some only by ``assert`` or not at all, then crashing later) are errors here:
an ``id`` must come before ``trigger`` on its line, ``msg`` needs an ``id``, a barrier needs ``count``,
a trigger id that is referenced must be defined, a connection id is not repeated except by ``msg``
lines with the same ``SRC->DST``. Where openmrc is stricter than htsim: unknown header keywords,
repeated keywords, extra tokens on a header line and ``count`` on a non-barrier trigger (all silently
accepted by htsim) are errors. Where it is more lenient: trailing whitespace and ``\\r`` are stripped
from every line (so whitespace-only lines are blank), and blank and ``#`` comment lines are skipped
everywhere, where htsim skips comments only in the header. htsim parses ``start`` in single precision,
so it would round starts above 2**24 µs (about 16.8 s); openmrc keeps the exact value.

Every error is a `CmError` naming the source, the 1-based line and the field, e.g.
``perm.cm:7: size: 'abc' is not an integer``.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_PRIO",
    "SWITCH_TYPES",
    "TRIGGER_KINDS",
    "CmError",
    "Connection",
    "ConnectionMatrix",
    "LinkFailure",
    "Trigger",
    "load_cm",
    "parse_cm",
]

DEFAULT_PRIO = 2_000_000
"""Priority of a connection without ``prio`` (htsim's default)."""
TRIGGER_KINDS = ("oneshot", "multishot", "barrier")
SWITCH_TYPES = ("TOR", "AGG", "CORE")

# htsim reads every integer with std::stoi (a C int) and casts start to uint32_t microseconds.
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
_UINT32_MAX = 2**32 - 1

_HEADER_KEYS = ("Nodes", "Connections", "Triggers", "Failures")
_CONN_KEYS = ("id", "msg", "start", "trigger", "size", "send_done_trigger", "recv_done_trigger", "prio")
_FAILURE_KEYS = ("switch_type", "switch_id", "link_id")
_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class CmError(ValueError):
    """A connection matrix htsim would reject or misread. Names the source, the line and the field."""

    def __init__(self, source: str, line: int, field: str, reason: str) -> None:
        self.source = source
        self.line = line
        self.field = field
        self.reason = reason
        super().__init__(f"{source}:{line}: {field}: {reason}")


@dataclass(frozen=True, slots=True)
class Connection:
    """One flow (or, with ``msg``, one message on a reused connection)."""

    src: int
    """Sending host, 0 ≤ src < nodes."""
    dst: int
    """Receiving host, 0 ≤ dst < nodes, ≠ src."""
    size: int
    """Bytes to transfer, > 0."""
    start_us: int | None = None
    """Start time in whole microseconds; None when a trigger starts the connection."""
    id: int | None = None
    """Flow id (> 0); needed by ``trigger`` and ``msg``."""
    trigger: int | None = None
    """Start when this trigger fires (then ``start_us`` is None)."""
    send_done_trigger: int | None = None
    """Trigger fired when the sender has sent everything."""
    recv_done_trigger: int | None = None
    """Trigger fired when the receiver has got everything."""
    prio: int = DEFAULT_PRIO
    """Priority."""
    msg: int | None = None
    """Message id on a reused connection; 0 for a bare ``msg``."""

    @property
    def start_ns(self) -> int | None:
        """Start time in nanoseconds, or None when started by a trigger."""
        return None if self.start_us is None else self.start_us * 1000

    def to_line(self) -> str:
        """The connection as a ``.cm`` line (``id`` first, as htsim needs it before ``trigger``)."""
        parts = [f"{self.src}->{self.dst}"]
        if self.id is not None:
            parts += ("id", str(self.id))
        if self.msg is not None:
            # A bare msg must be followed by a token: htsim reads one past it unchecked.
            parts += ("msg",) if self.msg == 0 else ("msg", str(self.msg))
        if self.trigger is not None:
            parts += ("trigger", str(self.trigger))
        else:
            parts += ("start", str(self.start_us))
        parts += ("size", str(self.size))
        if self.send_done_trigger is not None:
            parts += ("send_done_trigger", str(self.send_done_trigger))
        if self.recv_done_trigger is not None:
            parts += ("recv_done_trigger", str(self.recv_done_trigger))
        if self.prio != DEFAULT_PRIO:
            parts += ("prio", str(self.prio))
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Trigger:
    """A trigger that starts connections once arrivals (``*_done_trigger``) fire it."""

    id: int
    """Trigger id, > 0."""
    kind: str
    """``oneshot``, ``multishot`` or ``barrier``."""
    count: int = 1
    """Arrivals needed before it fires: a barrier's count, 1 for the other kinds."""

    def to_line(self) -> str:
        """The trigger as a ``.cm`` line."""
        line = f"trigger id {self.id} {self.kind}"
        return f"{line} count {self.count}" if self.kind == "barrier" else line


@dataclass(frozen=True, slots=True)
class LinkFailure:
    """A fat-tree link that is down for the whole run."""

    switch_type: str
    """``TOR``, ``AGG`` or ``CORE``."""
    switch_id: int
    """Switch index within its tier."""
    link_id: int
    """Link index on that switch."""

    def to_line(self) -> str:
        """The failure as a ``.cm`` line."""
        return f"failure switch_type {self.switch_type} switch_id {self.switch_id} link_id {self.link_id}"


@dataclass(frozen=True, slots=True)
class ConnectionMatrix:
    """A parsed ``.cm`` file: hosts, connections in file order, triggers and link failures."""

    nodes: int
    """Number of hosts (ids 0..nodes-1)."""
    connections: tuple[Connection, ...]
    triggers: tuple[Trigger, ...] = ()
    failures: tuple[LinkFailure, ...] = ()

    def to_text(self) -> str:
        """A ``.cm`` file htsim accepts; ``parse_cm(m.to_text()) == m`` for any matrix parse_cm returns."""
        lines = [f"Nodes {self.nodes}", f"Connections {len(self.connections)}"]
        if self.triggers:
            lines.append(f"Triggers {len(self.triggers)}")
        if self.failures:
            lines.append(f"Failures {len(self.failures)}")
        lines.extend(c.to_line() for c in self.connections)
        lines.extend(t.to_line() for t in self.triggers)
        lines.extend(f.to_line() for f in self.failures)
        return "\n".join(lines) + "\n"


def load_cm(path: str | os.PathLike[str]) -> ConnectionMatrix:
    """Read and check a ``.cm`` file; errors name the path as given."""
    source = os.fspath(path)
    data = Path(source).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise CmError(source, line, "encoding", f"byte {data[e.start]:#04x} is not UTF-8 text") from None
    return parse_cm(text, source=source)


def parse_cm(text: str, *, source: str = "<string>") -> ConnectionMatrix:
    """Parse and check the text of a ``.cm`` file; ``source`` names it in errors."""
    return _Parser(source).parse(text)


@dataclass(slots=True)
class _Line:
    source: str
    number: int
    tokens: list[str]

    def error(self, field: str, reason: str) -> CmError:
        return CmError(self.source, self.number, field, reason)

    def integer(self, field: str, token: str, lo: int, hi: int) -> int:
        if not _INT_RE.fullmatch(token):
            raise self.error(field, f"{token!r} is not an integer")
        value = int(token)
        if not lo <= value <= hi:
            raise self.error(field, f"{value} is out of range ({lo}..{hi})")
        return value

    def pairs(self, start: int, keys: tuple[str, ...], what: str) -> dict[str, str]:
        """``keyword value`` pairs from ``tokens[start:]``, each keyword from ``keys`` at most once."""
        out: dict[str, str] = {}
        i = start
        while i < len(self.tokens):
            key = self.tokens[i]
            if key not in keys:
                raise self.error(key, f"unknown {what} keyword (expected {', '.join(keys)})")
            if key in out:
                raise self.error(key, "given twice")
            if i + 1 >= len(self.tokens):
                raise self.error(key, "keyword without a value")
            out[key] = self.tokens[i + 1]
            i += 2
        return out


class _Parser:
    __slots__ = (
        "conn_ids",
        "connections",
        "failure_lines",
        "failures",
        "header",
        "in_header",
        "refs",
        "source",
        "trigger_lines",
        "triggers",
    )

    def __init__(self, source: str) -> None:
        self.source = source
        self.header: dict[str, tuple[int, int]] = {}  # keyword -> (value, line)
        self.in_header = True
        self.connections: list[Connection] = []
        self.conn_ids: dict[int, tuple[int, Connection]] = {}  # id -> (line, first connection)
        self.triggers: dict[int, tuple[int, Trigger]] = {}  # id -> (line, trigger)
        self.refs: dict[int, tuple[int, str]] = {}  # trigger id -> (line, field) of its first use
        self.failures: list[LinkFailure] = []
        self.trigger_lines: list[int] = []
        self.failure_lines: list[int] = []

    def parse(self, text: str) -> ConnectionMatrix:
        last = 1
        for number, raw in enumerate(text.split("\n"), start=1):
            stripped = raw.rstrip()
            if not stripped or stripped.startswith("#"):
                continue
            last = number
            line = _Line(self.source, number, stripped.split(" "))
            if "" in line.tokens:
                raise line.error("syntax", "empty token: fields are separated by single spaces")
            first = line.tokens[0]
            if first in _HEADER_KEYS:
                self._header(line)
            elif "->" in first:
                self._start_body(line)
                self._connection(line)
            elif first == "trigger":
                self._start_body(line)
                self._trigger(line)
            elif first == "failure":
                self._start_body(line)
                self._failure(line)
            else:
                raise line.error(
                    first,
                    "unknown keyword (expected Nodes, Connections, Triggers, Failures, SRC->DST, "
                    "trigger or failure)",
                )
        if self.in_header:
            self._start_body(_Line(self.source, last, []))
        self._check_counts()
        for tid, (number, field) in sorted(self.refs.items(), key=lambda kv: kv[1]):
            if tid not in self.triggers:
                raise CmError(self.source, number, field, f"trigger {tid} is never defined")
        return ConnectionMatrix(
            nodes=self.header["Nodes"][0],
            connections=tuple(self.connections),
            triggers=tuple(t for _, t in self.triggers.values()),
            failures=tuple(self.failures),
        )

    def _header(self, line: _Line) -> None:
        key = line.tokens[0]
        if not self.in_header:
            raise line.error(key, "header line after the first connection, trigger or failure line")
        if key in self.header:
            raise line.error(key, f"given twice (first on line {self.header[key][1]})")
        if len(line.tokens) < 2:
            raise line.error(key, "keyword without a value")
        if len(line.tokens) > 2:
            raise line.error(key, f"unexpected {line.tokens[2]!r} after the value")
        lo = 1 if key == "Nodes" else 0
        self.header[key] = (line.integer(key, line.tokens[1], lo, _INT32_MAX), line.number)

    def _start_body(self, line: _Line) -> None:
        if not self.in_header:
            return
        for key in ("Nodes", "Connections"):
            if key not in self.header:
                raise line.error(key, f"missing: the header must give '{key} N' before the first record")
        self.in_header = False

    def _ref(self, line: _Line, field: str, token: str) -> int:
        tid = line.integer(field, token, 1, _INT32_MAX)
        self.refs.setdefault(tid, (line.number, field))
        return tid

    def _connection(self, line: _Line) -> None:
        nodes = self.header["Nodes"][0]
        src_tok, _, dst_tok = line.tokens[0].partition("->")
        src = line.integer("src", src_tok, 0, _INT32_MAX)
        dst = line.integer("dst", dst_tok, 0, _INT32_MAX)
        for field, host in (("src", src), ("dst", dst)):
            if host >= nodes:
                raise line.error(field, f"host {host} does not exist (Nodes {nodes}: hosts 0..{nodes - 1})")
        if src == dst:
            raise line.error("dst", f"{src}->{dst} sends to itself")

        values: dict[str, str] = {}
        order: list[str] = []
        msg: int | None = None
        tokens = line.tokens
        i = 1
        while i < len(tokens):
            key = tokens[i]
            if key not in _CONN_KEYS:
                raise line.error(key, f"unknown connection keyword (expected {', '.join(_CONN_KEYS)})")
            if key in order:
                raise line.error(key, "given twice")
            order.append(key)
            if key == "msg":
                # htsim takes the next token as the message id only when it is a number.
                if i + 1 < len(tokens) and _INT_RE.fullmatch(tokens[i + 1]):
                    msg = line.integer("msg", tokens[i + 1], 1, _INT32_MAX)
                    i += 2
                else:
                    msg = 0
                    i += 1
                continue
            if i + 1 >= len(tokens):
                raise line.error(key, "keyword without a value")
            values[key] = tokens[i + 1]
            i += 2

        if "size" not in values:
            raise line.error("size", "missing: every connection needs size B")
        size = line.integer("size", values["size"], 1, _INT32_MAX)
        cid = line.integer("id", values["id"], 1, _INT32_MAX) if "id" in values else None
        start_us: int | None = None
        trigger: int | None = None
        if "start" in values and "trigger" in values:
            raise line.error("start", "a connection starts at a time or by a trigger, not both")
        if "start" in values:
            start_us = self._start(line, values["start"])
        elif "trigger" in values:
            if cid is None or order.index("id") > order.index("trigger"):
                raise line.error("trigger", "needs the connection's id before it (SRC->DST id I trigger K)")
            trigger = self._ref(line, "trigger", values["trigger"])
        else:
            raise line.error("start", "missing: give start T or trigger K")
        if msg is not None and cid is None:
            raise line.error("msg", "needs the connection's id (the connection the message reuses)")
        conn = Connection(
            src=src,
            dst=dst,
            size=size,
            start_us=start_us,
            id=cid,
            trigger=trigger,
            send_done_trigger=(
                self._ref(line, "send_done_trigger", values["send_done_trigger"])
                if "send_done_trigger" in values
                else None
            ),
            recv_done_trigger=(
                self._ref(line, "recv_done_trigger", values["recv_done_trigger"])
                if "recv_done_trigger" in values
                else None
            ),
            prio=line.integer("prio", values["prio"], _INT32_MIN, _INT32_MAX)
            if "prio" in values
            else DEFAULT_PRIO,
            msg=msg,
        )
        if cid is not None:
            if cid in self.conn_ids:
                first_line, first = self.conn_ids[cid]
                if msg is None:
                    reason = f"duplicate connection id {cid} (first on line {first_line})"
                    raise line.error("id", f"{reason}; only msg lines may reuse a connection")
                if (first.src, first.dst) != (src, dst):
                    raise line.error(
                        "id",
                        f"connection {cid} is {first.src}->{first.dst} (line {first_line}), "
                        f"a message on it cannot go {src}->{dst}",
                    )
            else:
                self.conn_ids[cid] = (line.number, conn)
        self.connections.append(conn)

    @staticmethod
    def _start(line: _Line, token: str) -> int:
        if not _FLOAT_RE.fullmatch(token):
            raise line.error("start", f"{token!r} is not a number")
        value = float(token)
        if value < 0 or not math.isfinite(value):
            raise line.error("start", f"{token} is out of range (0..{_UINT32_MAX} µs)")
        start_us = math.trunc(value)
        if start_us > _UINT32_MAX:
            raise line.error("start", f"{token} is out of range (0..{_UINT32_MAX} µs)")
        return start_us

    def _trigger(self, line: _Line) -> None:
        values: dict[str, str] = {}
        kind: str | None = None
        tokens = line.tokens
        i = 1
        while i < len(tokens):
            tok = tokens[i]
            if tok in ("id", "count"):
                if tok in values:
                    raise line.error(tok, "given twice")
                if i + 1 >= len(tokens):
                    raise line.error(tok, "keyword without a value")
                values[tok] = tokens[i + 1]
                i += 2
            elif tok in TRIGGER_KINDS:
                if kind is not None:
                    raise line.error("kind", f"given twice ({kind} and {tok})")
                kind = tok
                i += 1
            else:
                raise line.error(
                    "kind",
                    f"{tok!r} is not a trigger kind or keyword (oneshot, multishot, barrier; id K, count n)",
                )
        if "id" not in values:
            raise line.error("id", "missing: every trigger needs id K")
        tid = line.integer("id", values["id"], 1, _INT32_MAX)
        if kind is None:
            raise line.error("kind", "missing: oneshot, multishot or barrier")
        if kind == "barrier":
            if "count" not in values:
                raise line.error("count", "missing: a barrier needs count n (arrivals before it fires)")
            count = line.integer("count", values["count"], 1, _INT32_MAX)
        elif "count" in values:
            raise line.error("count", f"only a barrier takes a count, not a {kind} trigger")
        else:
            count = 1
        if tid in self.triggers:
            raise line.error("id", f"duplicate trigger id {tid} (first on line {self.triggers[tid][0]})")
        self.triggers[tid] = (line.number, Trigger(id=tid, kind=kind, count=count))
        self.trigger_lines.append(line.number)

    def _failure(self, line: _Line) -> None:
        values = line.pairs(1, _FAILURE_KEYS, "failure")
        for key in _FAILURE_KEYS:
            if key not in values:
                raise line.error(key, "missing: a failure needs switch_type, switch_id and link_id")
        switch_type = values["switch_type"]
        if switch_type not in SWITCH_TYPES:
            raise line.error("switch_type", f"{switch_type!r} is not TOR, AGG or CORE")
        self.failures.append(
            LinkFailure(
                switch_type=switch_type,
                switch_id=line.integer("switch_id", values["switch_id"], 0, _INT32_MAX),
                link_id=line.integer("link_id", values["link_id"], 0, _INT32_MAX),
            )
        )
        self.failure_lines.append(line.number)

    def _check_counts(self) -> None:
        declared, number = self.header["Connections"]
        if declared != len(self.connections):
            raise CmError(
                self.source,
                number,
                "Connections",
                f"header says {declared} but the file has {len(self.connections)} connection lines",
            )
        for key, what, lines in (
            ("Triggers", "trigger", self.trigger_lines),
            ("Failures", "failure", self.failure_lines),
        ):
            if key in self.header:
                declared, number = self.header[key]
                if declared != len(lines):
                    raise CmError(
                        self.source,
                        number,
                        key,
                        f"header says {declared} but the file has {len(lines)} {what} lines",
                    )
            elif lines:
                raise CmError(
                    self.source,
                    lines[0],
                    key,
                    f"the file has {len(lines)} {what} lines but no '{key} {len(lines)}' header line",
                )
