"""What crosses between the ranks of a split run (`openmrc.sim.parallel`), and how.

A port whose peer runs on another rank (a cut port) hands each packet it delivers to that rank's lane
(`network.Crossing`, `_Shipper`) instead of scheduling its arrival (a port into a shared switch, to the
lane of the rank that runs the port the packet leaves the switch by: `_Splitter`), and the lane packs it
at once, while it is still in the cache: one byte string per window (`struct`), each packet its kind's
fields in a row (a data packet's Write template as an index, a SACK as its header fields, any other
packet as its wire bytes), which crosses as it is and is read back (`_Cut.decode`) straight into the
engine's wheel. What does not fit a row (a template the receiver has not seen, wire bytes, a field beyond
64 bits) travels beside it in the window's message, pickled (`_dumps`) with payloads as their lengths: a
flow's bytes are zeros.
"""

from __future__ import annotations

import bisect
import copyreg
import dataclasses
import io
import pickle
import struct
from collections.abc import Callable
from typing import Any, Final, NamedTuple, cast

from openmrc.fabric.clos import MultiPlaneClos
from openmrc.sim.engine import Simulator
from openmrc.sim.fabric_sim import FabricSim, shared_switches
from openmrc.sim.network import Crossing, Port, Switch
from openmrc.transport import SackTransmit, Transmit
from openmrc.transport.types import data_transmit, sack_of_words
from openmrc.wire import headers
from openmrc.wire.buffer import WireError
from openmrc.wire.packet import DataTemplate, Packet, parse

_NEVER: Final = 1 << 62
"""No event: later than any time a run reaches."""
_TPL_CACHE = 1 << 17
"""Templates remembered per pair of ranks (a Write's packets share one) before the tables start over."""
_ZEROS = memoryview(bytes(1 << 16))
"""The payload a shipped data packet carries: a flow's bytes are zeros (one shared buffer, never written
with anything else), so only their number crosses."""


_ZERO_VIEWS: Final[dict[int, memoryview]] = {}


def _zeros(n: int) -> memoryview:
    """``n`` bytes of `_ZEROS`, one view per length."""
    z = _ZERO_VIEWS.get(n)
    if z is None:
        z = _ZERO_VIEWS[n] = _ZEROS[:n] if n <= len(_ZEROS) else memoryview(bytes(n))
    return z


def _zeros_reduce(m: memoryview) -> tuple[Callable[[int], memoryview], tuple[int]]:
    return _zeros, (len(m),)


def _fields_reduce(o: Any) -> tuple[type, tuple[Any, ...]]:
    """A compiled dataclass (a packet, a header) rebuilt by its constructor: compiled classes do not
    unpickle field by field."""
    return type(o), tuple(getattr(o, f.name) for f in dataclasses.fields(o))


_DISPATCH = copyreg.dispatch_table.copy()
_DISPATCH[memoryview] = _zeros_reduce
_DISPATCH[Packet] = _fields_reduce
for _cls in vars(headers).values():
    if isinstance(_cls, type) and dataclasses.is_dataclass(_cls):
        _DISPATCH[_cls] = _fields_reduce


def _dumps(obj: Any) -> bytes:
    """Pickle what crosses to another rank; a payload (a memoryview) crosses as its length."""
    buf = io.BytesIO()
    p = pickle.Pickler(buf, pickle.HIGHEST_PROTOCOL)
    p.dispatch_table = _DISPATCH
    p.dump(obj)
    return buf.getvalue()


_HEAD: Final = 5
"""Fields every crossing packet ships first, packed by their widths into words (each field would cost an
int made at either end): its kind, flags (ECN, and a data packet's AckReq and retransmission bits, a
SACK's probe-reply bit), trim, plane and wire size (the row's first byte is the kind); its time; its origin
and target (one word made once per cut port: `_Shipper`); its entropy; its ECMP flow hash (+1) and epoch.
Its kind's tail follows, then its addressing (`_ADDR_FMT` or `_ADDR_EV_FMT`), last: a kind's fields sit at
the same places whichever addressing a packet has. Only a sender reads a packet's EV (it has made the
packet's addresses of it): a packet routed by a plain address crosses without it. A packet with a field
beyond its place in a word goes wide (`_WIDE`)."""
_HEAD_FMT: Final = "<QqQIq"
_ADDR_FMT: Final = "QQQQ"
"""A packet's address and its segment (an IPv6 one is 128 bits), each as two 64-bit halves."""
_ADDR_EV_FMT: Final = "16sQ"
"""A packet routed by its EV (`Transmit.route_by_ev`, kind ``| _BY_EV``): the EV's address bytes and the
packet's route: no 128-bit int made at either end, and the receiving rank's switches route it as this
rank's would (such a packet has no segment)."""
_BY_EV: Final = 4
_DATA: Final = 0
_DATA_TAIL: Final = "QIQ"
"""A data packet: one word of its op, payload length and Write template's index, then its PSN and VA.
Its sender and destination nodes and its QP number cross once with its template (a template is one QP's),
its size is its payload's."""
_SACK: Final = 1
_SACK_TAIL: Final = "QQQQQQq"
"""A SACK carried by its fields (a `SackTransmit` no driver has built a `Packet` of): one word of its
sender and destination nodes, one of its QP number and size, then the four words its fields are packed in
(`sack_of_words`) and its SACK offset; the probe-reply flag is in the flags."""
_OTHER: Final = 2
_OTHER_TAIL: Final = "QQI"
"""Any other packet: its nodes' word and its QP number and size's, as a SACK's, then the index of its
wire bytes (or of itself, when it does not encode)."""
_WIDE: Final = 3
_WIDE_S: Final = struct.Struct("<BI")
"""A packet with a field beyond its place in its kind's row, or a data packet whose template crossed with
another sender or QP: the index of its fields, shipped as a tuple of them one by one (`_fields`)."""
_WIDE_HEAD: Final = 10
"""A wide packet's head: kind, flags, trim, plane, time, ends (its origin and target), wire size,
entropy, epoch and flow hash; its kind's tail as a row's but each field on its own (a data packet's
ends with its sender, destination and QP number), then its address and segment in 64-bit halves."""
_TAILS: Final = (_DATA_TAIL, _SACK_TAIL, _OTHER_TAIL)
_STRUCTS: Final = (
    *(struct.Struct(_HEAD_FMT + t + _ADDR_FMT) for t in _TAILS),
    _WIDE_S,
    *(struct.Struct(_HEAD_FMT + t + _ADDR_EV_FMT) for t in _TAILS),
)
"""By kind: each kind's, `_WIDE_S`, then each kind's routed by its EV (``kind | _BY_EV``)."""
_M64: Final = (1 << 64) - 1
_M40: Final = (1 << 40) - 1
_M33: Final = (1 << 33) - 1
_M32: Final = (1 << 32) - 1
_QP_BITS: Final = 0xFFFFFF
_MAX_NODES: Final = 1 << 23
"""Nodes a split fabric may have: a cut port's target (``2 * (node << 16 | port) + 1``) has 40 bits in
its word, beside its origin."""
_ENTRY: Final = 2
"""A packet's target is one of three (its ends' low 40 bits): ``4 * node``, the node's arrival; ``2 * key
+ 1``, the guarded delivery of the cut port ``key``; or, for a packet sent into a shared switch
(`_Splitter`), ``(place << 16 | leaves) << 3 | guarded << 2 | _ENTRY``: the port it leaves the switch by and,
when its link is guarded, the sending port (of the origin's node) as ``place``, which names its stand-in
here; otherwise the switch, as its place among the shared switches by node id (`_Cut.shared_arrivals`:
every rank numbers them alike), a small list's index where a port's stand-in is an entry of a large
dict."""
_MAX_SHARED: Final = 1 << 21
"""Shared switches a split fabric may have (an `_ENTRY` names one in 21 bits)."""
_ROUTE_THERE: Final = 0xFFFF
"""An `_ENTRY`'s port that the switch is to pick at the packet's arrival (`_Arrival`); a split fabric's
switches have fewer ports."""
# bound once: a compiled call through the Struct looks its method up by name on every packet
_PACK_DATA: Final = _STRUCTS[_DATA].pack_into
_PACK_SACK: Final = _STRUCTS[_SACK].pack_into
_PACK_OTHER: Final = _STRUCTS[_OTHER].pack_into
_PACK_DATA_EV: Final = _STRUCTS[_DATA | _BY_EV].pack_into
_PACK_SACK_EV: Final = _STRUCTS[_SACK | _BY_EV].pack_into
_PACK_OTHER_EV: Final = _STRUCTS[_OTHER | _BY_EV].pack_into
_PACK_WIDE: Final = _WIDE_S.pack_into
_UNPACKS: Final = tuple(s.unpack_from for s in _STRUCTS)
_SIZES: Final = tuple(s.size for s in _STRUCTS)
_MAX_ROW: Final = max(_SIZES)
_FIRST_BUF: Final = 1 << 16
"""A lane's buffer to begin with (bytes); it doubles when a row would not fit."""


class LaneHead(NamedTuple):
    """What crosses beside a lane's packed rows in a window's message (pickled with `_dumps`)."""

    reset: bool
    """The sender started its table of templates over: so does the receiver, before `templates`."""
    templates: list[tuple[int, int, int, int, int, int | None, int, int, int]]
    """The Write templates new in this message, in the order they were indexed (`_Lane.tpl_index`)."""
    blobs: list[bytes | Packet]
    """The packets shipped as their wire bytes (or as themselves), by the index their rows hold."""
    wide: list[tuple[Any, ...]]
    """The packets shipped field by field (`_fields`), by the index their rows hold."""


class LaneMessage(NamedTuple):
    """A lane's message of one window (`_Lane.message`)."""

    head: LaneHead
    rows: bytearray
    """The packed rows, each its kind's fields (`_STRUCTS`)."""


class _Lane:
    """What one rank ships to one other in a window: its packets packed into one byte string as they are
    sent, each its kind's fields in a row (`struct`, so no int object outlives the packing, and the bytes
    cross as they are; per-packet tuples pickled cost about 3 µs a packet, a flat list of ints pickled
    about 1.5), in the order they were sent. A data packet's Write template crosses once, with the sender,
    destination and QP number of its packets, and is named by its index afterwards (both ends keep the
    same table: one lane's messages arrive in order)."""

    __slots__ = ("blobs", "buf", "new_tpls", "off", "reset", "soonest", "tpls", "wide")

    def __init__(self) -> None:
        self.tpls: dict[DataTemplate, tuple[int, int, int, int]] = {}
        """(by identity) -> its index, and the sender, destination and QP number it crossed with."""
        self.reset = False
        self.buf = bytearray(_FIRST_BUF)
        """The rows packed since the last message, from 0 to `off` (written in place, no row made)."""
        self.off = 0
        self.blobs: list[bytes | Packet] = []
        self.wide: list[tuple[Any, ...]] = []
        self.new_tpls: list[tuple[int, int, int, int, int, int | None, int, int, int]] = []
        self.soonest = _NEVER
        """The earliest arrival packed since the last message."""

    def pack(self, at: int, ends: object, tx: Transmit) -> None:
        """``tx``, arriving at ``at``, its origin and target ``ends`` (`_Shipper`: an int made once by the
        port that ships, no int made per packet): one `struct` call per packet."""
        if at < self.soonest:
            self.soonest = at
        buf = self.buf
        off = self.off
        if off + _MAX_ROW > len(buf):
            buf *= 2  # (what it holds past `off` is written over)
        tpl = tx.tpl
        r = tx._route
        addr: object
        by_ev = r < 0
        port, wire_size, epoch, crc = tx.port, tx.wire_size, tx.epoch, tx.flow_crc + 1
        # the head's first word but the kind and the kind's flags
        word = int(tx.ecn) << 8 | tx.trim_code << 16 | port << 24 | wire_size << 40
        if by_ev:  # its EV's address bytes (the format takes the first 16) and its route
            word |= _BY_EV
            addr, addr_hi, seg, seg_hi = tx.ev, -r, 0, 0
        else:
            a, seg = tx.addr, tx.seg
            addr_hi, seg_hi = a >> 64, seg >> 64
            if addr_hi:  # (a mask of 64 bits is a long integer operation: only on a long address)
                a &= _M64
            if seg_hi:
                seg &= _M64
            addr = a
        try:
            if port >> 16 or wire_size >> 22 or epoch >> 29 or crc >> 33:  # (a negative one too)
                raise struct.error
            if tx.body is not None:  # sealed (authenticated MRC): its bytes cross with it, wide
                raise struct.error
            crc |= epoch << 33
            if tpl is not None:
                got = self.tpls.get(tpl)
                if got is None:
                    got = self.tpl_index(tpl, tx)
                if got[1] != tx.src or got[2] != tx.peer or got[3] != tx.qp_num:
                    raise struct.error  # (its template crossed with other packets: this one goes wide)
                op, n, index = tx.op, len(tx.payload), got[0]
                if op >> 8 or n >> 20 or index >> 30:
                    raise struct.error
                word |= _DATA | int(tx.ack_req) << 9 | int(tx.rtx) << 10
                tail = op | n << 8 | index << 28
                if by_ev:
                    _PACK_DATA_EV(
                        buf, off, word, at, ends, tx.entropy, crc, tail, tx.psn, tx.va, addr, addr_hi
                    )
                    off += _SIZES[_DATA | _BY_EV]
                else:
                    _PACK_DATA(
                        buf, off, word, at, ends, tx.entropy, crc, tail, tx.psn, tx.va, addr, addr_hi, seg,
                        seg_hi,
                    )  # fmt: skip
                    off += _SIZES[_DATA]
            else:
                src, peer, qp, size = tx.src, cast(int, tx.peer), tx.qp_num, tx.size
                if src >> 32 or peer >> 30 or qp >> 24 or size >> 32:
                    raise struct.error
                nodes, qs = src | peer << 32, qp | size << 24
                if type(tx) is SackTransmit and not tx.has_packet():
                    word |= _SACK | int(tx.pr) << 11
                    if by_ev:
                        _PACK_SACK_EV(
                            buf, off, word, at, ends, tx.entropy, crc, nodes, qs,
                            tx.psn, tx.op, tx.va, tx.qps_word, tx.sack_offset, addr, addr_hi,
                        )  # fmt: skip
                        off += _SIZES[_SACK | _BY_EV]
                    else:
                        _PACK_SACK(
                            buf, off, word, at, ends, tx.entropy, crc, nodes, qs,
                            tx.psn, tx.op, tx.va, tx.qps_word, tx.sack_offset, addr, addr_hi, seg, seg_hi,
                        )  # fmt: skip
                        off += _SIZES[_SACK]
                else:
                    word |= _OTHER
                    blob = len(self.blobs)
                    if by_ev:
                        _PACK_OTHER_EV(
                            buf, off, word, at, ends, tx.entropy, crc, nodes, qs, blob, addr, addr_hi
                        )
                        off += _SIZES[_OTHER | _BY_EV]
                    else:
                        _PACK_OTHER(
                            buf, off, word, at, ends, tx.entropy, crc, nodes, qs, blob, addr, addr_hi,
                            seg, seg_hi,
                        )  # fmt: skip
                        off += _SIZES[_OTHER]
                    self.blobs.append(_wire(tx.packet))
        except struct.error:  # a field beyond its place: the fields cross one by one, in their turn
            _PACK_WIDE(buf, off, _WIDE, len(self.wide))  # (over what the failed row wrote of itself)
            self.off = off + _WIDE_S.size
            self.wide.append(_fields(at, cast(int, ends), tx, self))
            return
        self.off = off

    def message(self) -> LaneMessage | None:
        """This window's packets (None: nothing crosses), the lane then emptied: the head (reset flag, new
        templates, wire bytes, wide packets: pickled with `_dumps`) and the packed rows, the lane's buffer
        itself, handed over (no copy of tens of MB a window at scale; they may cross out of band), the lane
        starting a new one."""
        off = self.off
        if not off:
            return None
        buf = self.buf
        del buf[off:]
        msg = LaneMessage(LaneHead(self.reset, self.new_tpls, self.blobs, self.wide), buf)
        self.reset = False
        self.buf = bytearray(max(off, _FIRST_BUF))  # (as large as this window's needed)
        self.off = 0
        self.blobs, self.new_tpls, self.wide = [], [], []
        self.soonest = _NEVER
        if len(self.tpls) > _TPL_CACHE:
            self.tpls.clear()
            self.reset = True  # the receiving end starts its table over with the next message
        return msg

    def tpl_index(self, tpl: DataTemplate, tx: Transmit) -> tuple[int, int, int, int]:
        """``tpl``'s entry (its index, and the sender, destination and QP number it crossed with: those of
        ``tx`` when it is new)."""
        got = self.tpls.get(tpl)
        if got is None:
            imm = tpl.immdt
            meth = tpl.meth
            src, peer, qp = tx.src, cast(int, tx.peer), tx.qp_num
            got = self.tpls[tpl] = (len(self.tpls), src, peer, qp)
            key = (
                tpl.dest_qp,
                meth.rqmsn,
                meth.msn,
                tpl.rkey,
                tpl.dma_len,
                None if imm is None else imm.imm_data,
                src,
                peer,
                qp,
            )
            self.new_tpls.append(key)
        return got


def _fields(at: int, ends: int, tx: Transmit, lane: _Lane) -> tuple[Any, ...]:
    """What `_Lane.pack` packs of ``tx``, each field on its own (`_WIDE_HEAD`; the rare packet a row
    cannot hold, and every sealed one), addressed by a plain address (a packet routed by its EV as the
    address that EV gives); a data packet's tail ends with its sender, destination and QP number (its
    template may have crossed with others); its sealed bytes (`Transmit.body`, None for most) come right
    before the addressing."""
    tail: tuple[Any, ...]
    tpl = tx.tpl
    peer = cast(int, tx.peer)
    if tpl is not None:
        kind, flags = _DATA, int(tx.ack_req) << 1 | int(tx.rtx) << 2
        tail = (lane.tpl_index(tpl, tx)[0], tx.op, tx.psn, tx.va, len(tx.payload), tx.src, peer, tx.qp_num)
    elif type(tx) is SackTransmit and not tx.has_packet():
        kind, flags = _SACK, int(tx.pr) << 3
        tail = (tx.src, peer, tx.qp_num, tx.size, tx.psn, tx.op, tx.va, tx.qps_word, tx.sack_offset)
    else:
        kind, flags = _OTHER, 0
        tail = (tx.src, peer, tx.qp_num, tx.size, len(lane.blobs))
        lane.blobs.append(_wire(tx.packet))
    addr, seg = tx.addr, tx.seg
    return (
        kind, flags | int(tx.ecn), tx.trim_code, tx.port, at, ends, tx.wire_size,
        tx.entropy, tx.epoch, tx.flow_crc, *tail, tx.body, addr & _M64, addr >> 64, seg & _M64, seg >> 64,
    )  # fmt: skip


class _Shipper(Crossing):
    """A cut port of this rank: what it sends is packed straight into the lane towards its peer's rank."""

    def __init__(self, lane: _Lane, origin: int, arrive: int, deliver: int) -> None:
        if not (0 <= arrive <= _M40 and 0 <= deliver <= _M40 and 0 < origin <= _MAX_NODES):
            raise ValueError(f"a split fabric has at most {_MAX_NODES:,} nodes")
        self.lane = lane
        # its origin and each target in one word, held as objects: each packet passes them on to
        # `struct` as they are (no int made per packet)
        self.arrive: object = origin << 40 | arrive
        self.deliver: object = origin << 40 | deliver

    def ship(self, at: int, p: Transmit, guarded: bool) -> None:
        self.lane.pack(at, self.deliver if guarded else self.arrive, p)


class _Splitter(Crossing):
    """A port of this rank leading into a shared switch (`openmrc.sim.fabric_sim.shared_switches`): the
    switch's routing picks the port each packet leaves by as it is sent (the switch would pick the same at
    its arrival: its choice depends on the packet and the routing state, which changes only when ECMP
    reconverges; a packet that may arrive after such a change goes to every rank, which routes it then:
    `_Arrival`), and the packet joins that port's queue at its arrival, here or on the rank that runs the
    port, through this port's epoch check when its link is guarded (`_guarded_entry`), as the switch's
    arrival would have it."""

    def __init__(self, cut: _Cut, port: Port, key: int, switch: Switch, reroutes: list[int]) -> None:
        self.origin = (key >> 16) + 1
        if self.origin > _MAX_NODES:  # (as `_Shipper`: its origin beside its target in one word)
            raise ValueError(f"a split fabric has at most {_MAX_NODES:,} nodes")
        self.port = port
        self.code = self.origin << 40 | (key & 0xFFFF) << 19 | 4 | _ENTRY  # guarded: by the sending port
        self.plain = self.origin << 40 | cut.shared_place(switch) << 19 | _ENTRY  # otherwise by the switch
        self.switch = switch
        self.routing = switch.routing
        self.engine = switch.sim
        self.rank = cut.rank
        self.lanes = cut.lanes
        self.ranks = cut.port_ranks(switch)
        """By port of the switch: the rank that runs it."""
        self.reroutes = reroutes
        """When the routing may change (`FailureInjector.reroutes`)."""
        self.there = cut.arrival(switch)
        self.enters = self.there.enters

    def ship(self, at: int, p: Transmit, guarded: bool) -> None:
        sw = self.switch
        reroutes = self.reroutes
        if reroutes:  # the switch may route it otherwise by the time it arrives: every rank routes it then
            k = bisect.bisect_right(reroutes, self.engine.now)
            if k < len(reroutes) and reroutes[k] <= at:
                code = (self.code if guarded else self.plain) | _ROUTE_THERE << 3
                for r, lane in enumerate(self.lanes):
                    if r != self.rank:
                        lane.pack(at, code, p)
                arg = (self.port if guarded else None, p, True)
                self.engine.push_from(at, self.there.enter, arg, self.origin)
                return
        try:
            out = self.routing.port(sw.id, p)
        except ValueError:  # counted at its arrival, as the switch would
            self.engine.push_from(at, _misrouted, (self.port if guarded else None, sw, p), self.origin)
            return
        r = self.ranks[out]
        if r != self.rank:
            self.lanes[r].pack(at, (self.code if guarded else self.plain) | out << 3, p)
        elif guarded:
            self.engine.push_from(at, _guarded_entry, (self.port, sw.ports[out], p), self.origin)
        else:
            enter = self.enters[out]
            if enter is None:
                enter = self.there.enter_at(out)
            self.engine.push_from(at, enter, p, self.origin)


class _Arrival:
    """A shared switch's arrivals that every rank routes as they arrive (`_Splitter`: its routing may
    change on the way): the rank that runs the port a packet leaves by queues it there; the sending rank
    stands for the switch in the rest (a packet lost on its link, or with no route, counted once), and
    every other rank lets its copy go, uncounted as an event (the run counts the switch's arrival once)."""

    def __init__(self, switch: Switch, ranks: list[int], rank: int) -> None:
        self.switch = switch
        self.ranks = ranks
        self.rank = rank
        self.enters: list[Callable[[Transmit], None] | None] = [None] * len(ranks)
        """By port: its `Port.enter`, bound when first needed (not once per packet)."""

    def enter_at(self, out: int) -> Callable[[Transmit], None]:
        """`Port.enter` of this rank's port ``out``, bound (once)."""
        enter = self.enters[out]
        if enter is None:
            enter = self.enters[out] = self.switch.ports[out].enter
        return enter

    def enter(self, arg: tuple[Port | None, Transmit, bool]) -> None:
        guard, p, sender = arg
        sw = self.switch
        if guard is not None and p.epoch != guard.epoch:
            if sender:
                guard.drops += 1
            else:
                sw.sim.events -= 1
            return
        try:
            out = sw.routing.port(sw.id, p)
        except ValueError:
            if sender:
                sw.misrouted += 1
            else:
                sw.sim.events -= 1
            return
        if self.ranks[out] == self.rank:
            sw.ports[out].enter(p)
        else:
            sw.sim.events -= 1


def _guarded_entry(arg: tuple[Port, Port, Transmit]) -> None:
    """A packet routed by a shared switch as it was sent (`_Splitter`) reaches it: it joins the port it
    leaves by unless the link it came over failed under it (the sending port's epoch moved on: a drop
    there, as `Port._deliver` counts it)."""
    guard, out, p = arg
    if p.epoch == guard.epoch:
        out.enter(p)
    else:
        guard.drops += 1


def _misrouted(arg: tuple[Port | None, Switch, Transmit]) -> None:
    """A packet a shared switch has no route for reaches it (`_Splitter`): counted there, as
    `Switch.arrive` counts it, unless lost on the way."""
    guard, sw, p = arg
    if guard is None or p.epoch == guard.epoch:
        sw.misrouted += 1
    else:
        guard.drops += 1


class _Cut:
    """This rank's view: which nodes it runs, and how shipped packets name their target (`_ENTRY`):
    ``4 * node`` (the node's arrival), ``2 * key + 1`` (the guarded delivery of the cut port ``key``: port
    ``i`` of node ``n`` as ``n << 16 | i``, a name every rank gives it without numbering the others'
    ports), or a port of a shared switch entered from the cut port of the packet's origin (named by the
    switch's place among the shared ones when that port's link is not guarded)."""

    def __init__(self, sim: FabricSim, rank_of: list[int], rank: int, size: int) -> None:
        self.rank_of = rank_of
        self.rank = rank
        self.nodes = sim.nodes
        self.topo = sim.topo
        self.lanes = [_Lane() for _ in range(size)]  # by the rank they go to
        # by key, the guarded delivery of each cut port leading here (its stand-in's, or its replica's)
        self.delivers: dict[int, Callable[[Transmit], None]] = {}
        self.guards: dict[int, tuple[Port, _Arrival]] = {}
        """By key, the stand-in (or replica) of each port of another rank leading into a shared switch."""
        self._port_ranks: dict[int, list[int]] = {}
        part = sim.part
        shared = (shared_switches(sim.topo) if part is None else part.shared) or [False] * len(sim.nodes)
        self._shared_places = {n: k for k, n in enumerate(n for n, s in enumerate(shared) if s)}
        if len(self._shared_places) > _MAX_SHARED:
            raise ValueError(f"a split fabric shares at most {_MAX_SHARED:,} switches")
        self.shared_arrivals: list[_Arrival] = []
        """Each shared switch's `_Arrival` (one a switch), by its place among them (`shared_place`)."""
        for n in self._shared_places:
            sw = sim.nodes[n]
            assert isinstance(sw, Switch)  # (every rank runs a shared switch)
            self.shared_arrivals.append(_Arrival(sw, self.port_ranks(sw), rank))
        for n, node in enumerate(sim.nodes):
            if shared[n]:  # its ports lead to this rank's nodes, or are another's to run: none is cut
                continue
            mine = rank_of[n] == rank
            if not mine and (part is None or not part.built):  # a replica: its cut ports
                for i, p in enumerate(node.ports):
                    peer = p.peer.id
                    if peer >= 0 and shared[peer]:
                        sw = sim.nodes[peer]
                        assert isinstance(sw, Switch)  # (every rank runs a shared switch)
                        self.guards[n << 16 | i] = p, self.arrival(sw)
                    elif peer >= 0 and rank_of[peer] == rank:
                        self.delivers[n << 16 | i] = p._deliver
            if not mine:
                continue
            for i, p in enumerate(node.ports):
                peer = p.peer.id
                if peer < 0:
                    continue
                if shared[peer]:
                    sw = sim.nodes[peer]
                    assert isinstance(sw, Switch)  # (every rank runs a shared switch)
                    p.cross = _Splitter(self, p, n << 16 | i, sw, sim.faults.reroutes)
                elif rank_of[peer] != rank:
                    p.cross = _Shipper(self.lanes[rank_of[peer]], n + 1, 4 * peer, 2 * (n << 16 | i) + 1)
        for (n, i), ghost in ({} if part is None else part.ghosts).items():
            if shared[ghost.peer.id]:
                sw = ghost.peer
                assert isinstance(sw, Switch)
                self.guards[n << 16 | i] = ghost, self.arrival(sw)
            else:
                self.delivers[n << 16 | i] = ghost._deliver
        # by the rank they come from: each template with the sender, destination and QP number of its packets
        self.tpls_in: list[list[tuple[DataTemplate, int, int, int]]] = [[] for _ in range(size)]

    def port_ranks(self, switch: Switch) -> list[int]:
        """The rank that runs each port of a shared ``switch`` (its peer's), worked out once a switch."""
        got = self._port_ranks.get(switch.id)
        if got is None:
            got = [-1] * len(switch.ports)
            topo = self.topo
            if isinstance(topo, MultiPlaneClos):  # a T1: port j leads to T0 j of its plane
                plane = topo.switch_info(switch.id)[1]
                for j in range(len(got)):
                    got[j] = self.rank_of[topo.t0(plane, j)]
            else:
                for ref in topo.ports(switch.id):  # (ports another rank runs are placeholders here)
                    got[ref.port] = self.rank_of[ref.peer]
            self._port_ranks[switch.id] = got
        return got

    def shared_place(self, switch: Switch) -> int:
        """The shared ``switch``'s place among the shared switches by node id (the same on every rank)."""
        return self._shared_places[switch.id]

    def arrival(self, switch: Switch) -> _Arrival:
        """The shared ``switch``'s `_Arrival` here."""
        return self.shared_arrivals[self._shared_places[switch.id]]

    def decode(self, src: int, head: LaneHead, rows: Any, engine: Simulator) -> int:
        """Schedule the packets of rank ``src``'s message (`_Lane.message`: its head, and its rows as bytes,
        a bytearray or a view of the receiving end's buffer) here, in the order they were sent; how many."""
        blobs, wide = head.blobs, head.wide
        tpls = self.tpls_in[src]
        if head.reset:
            tpls.clear()
        for key in head.templates:
            tpls.append((DataTemplate(*key[:6]), key[6], key[7], key[8]))
        data: Any = rows
        off, n, got = 0, len(data), 0
        while off < n:
            got += 1
            kind: int = data[off]
            f: tuple[Any, ...] = _UNPACKS[kind](data, off)
            off += _SIZES[kind]
            if kind == _WIDE:
                self._wide(wide[f[1]], tpls, blobs, engine)
                continue
            word: int = f[0]
            ends: int = f[2]
            entropy: int = f[3]
            crc: int = f[4]
            port = word >> 24 & 0xFFFF
            tx: Transmit
            if kind & ~_BY_EV == _DATA:
                tail: int = f[5]
                tpl, sender, peer, qp = tpls[tail >> 28]  # (typed: indexed and unpacked directly)
                tx = _data_tx(
                    tpl, sender, peer, qp, port, entropy, tail & 0xFF, word & 0x200 != 0, word & 0x400 != 0,
                    f[6], f[7], tail >> 8 & 0xFFFFF,
                )  # fmt: skip
            else:
                nodes: int = f[5]
                qs: int = f[6]
                if kind & ~_BY_EV == _SACK:
                    tx = sack_of_words(qs & _QP_BITS, f[7], f[8], f[9], f[10], f[11], word & 0x800 != 0)
                else:
                    tx = _other_tx(blobs[f[7]], qs & _QP_BITS)
                tx.port, tx.peer, tx.entropy = port, nodes >> 32, entropy
                tx.src, tx.size = nodes & _M32, qs >> 24
            self._arrive(
                f, kind & _BY_EV != 0, tx, f[1], ends, word & 0x100 != 0, word >> 16 & 0xFF, word >> 40,
                crc >> 33, (crc & _M33) - 1, engine,
            )  # fmt: skip
        return got

    def _wide(
        self,
        f: tuple[Any, ...],
        tpls: list[tuple[DataTemplate, int, int, int]],
        blobs: list[bytes | Packet],
        engine: Simulator,
    ) -> None:
        """A packet shipped wide (`_fields`), scheduled as `decode` schedules the others."""
        j = _WIDE_HEAD
        kind: int = f[0]
        flags: int = f[1]
        port: int = f[3]
        entropy: int = f[7]
        tx: Transmit
        if kind == _DATA:  # its own sender, destination and QP number
            tx = _data_tx(
                tpls[f[j]][0], f[j + 5], f[j + 6], f[j + 7], port, entropy, f[j + 1], flags & 2 != 0,
                flags & 4 != 0, f[j + 2], f[j + 3], f[j + 4],
            )  # fmt: skip
        else:
            if kind == _SACK:
                tx = sack_of_words(f[j + 2], f[j + 4], f[j + 5], f[j + 6], f[j + 7], f[j + 8], flags & 8 != 0)
            else:
                tx = _other_tx(blobs[f[j + 4]], f[j + 2])
            tx.port, tx.peer, tx.entropy, tx.src, tx.size = port, f[j + 1], entropy, f[j], f[j + 3]
        tx.body = f[len(f) - 5]  # (a sealed packet's bytes, before its addressing; None for others)
        self._arrive(f, False, tx, f[4], f[5], flags & 1 != 0, f[2], f[6], f[8], f[9], engine)

    def _arrive(
        self,
        f: tuple[Any, ...],
        by_ev: bool,
        tx: Transmit,
        at: int,
        ends: int,
        ecn: bool,
        trim: int,
        wire_size: int,
        epoch: int,
        flow_crc: int,
        engine: Simulator,
    ) -> None:
        """``tx``, given its fabric fields and its addressing (last in its row ``f``), scheduled where its
        ``ends`` say."""
        cb: Callable[[Any], None]
        arg: Any = tx
        origin, code = ends >> 40, ends & _M40
        if code & 1:
            cb = self.delivers[code >> 1]
        elif code & _ENTRY:  # into a shared switch's port
            leaves = code >> 3 & 0xFFFF
            if code & 4:  # through the sending port's stand-in
                guard, there = self.guards[(origin - 1) << 16 | code >> 19]
                if leaves == _ROUTE_THERE:
                    cb, arg = there.enter, (guard, tx, False)
                else:
                    cb, arg = _guarded_entry, (guard, there.switch.ports[leaves], tx)
            else:
                there = self.shared_arrivals[code >> 19]
                if leaves == _ROUTE_THERE:
                    cb, arg = there.enter, (None, tx, False)
                else:
                    enter = there.enters[leaves]
                    cb = there.enter_at(leaves) if enter is None else enter
        else:
            arrive = self.nodes[code >> 2].arrive_cb
            assert arrive is not None  # bound when the ports leading there were made
            cb = arrive
        tx.ecn = ecn
        tx.trim_code = trim
        tx.wire_size = wire_size
        last = len(f) - 1
        if by_ev:  # its EV's address and its route (`_ADDR_EV_FMT`); no segment
            tx.ev = f[last - 1]
            tx._route = -cast(int, f[last])
        else:
            addr: int = f[last - 3]
            hi: int = f[last - 2]
            tx.addr = addr | hi << 64 if hi else addr  # (an address of 64 bits or less: no long operation)
            seg: int = f[last - 1]
            hi = f[last]
            tx.seg = seg | hi << 64 if hi else seg
        tx.epoch = epoch
        tx.flow_crc = flow_crc
        engine.insert(at, 0, origin, cb, arg)


def _data_tx(
    tpl: DataTemplate,
    src: int,
    peer: int,
    qp: int,
    port: int,
    entropy: int,
    op: int,
    ack_req: bool,
    rtx: bool,
    psn: int,
    va: int,
    n: int,
) -> Transmit:
    tx = data_transmit(port, peer, b"", entropy, qp, tpl, op, ack_req, rtx, psn, va, _zeros(n))
    tx.src = src
    return tx


def _other_tx(blob: bytes | Packet, qp: int) -> Transmit:
    """A packet shipped as its wire bytes (or as itself), its fabric fields still to set."""
    return Transmit(0, None, b"", 0, blob if isinstance(blob, Packet) else parse(blob), qp)


def _wire(pkt: Packet) -> bytes | Packet:
    """A control packet as its wire bytes (what `parse` makes the same packet of again), or itself (then
    pickled) when it does not encode."""
    try:
        return pkt.encode()
    except WireError:
        return pkt
