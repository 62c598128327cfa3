"""The per-QP EV table: spraying rotation, EV states, backups, probing and EV events.

Theory of operation (MRC-SPEC-NOTES §2)
---------------------------------------
A QP sprays each packet on the next usable EV of a pseudo-random *rotation* over its active EV set, which
is drawn equally from all planes (NIC ports) and takes the planes in turn (one EV of each plane, then the
next of each: spraying loads every plane alike at any time, not only on average); the EVs of each plane
are re-shuffled every ``reshuffle_rotations`` complete passes (an *epoch* is one pass). With a ``burst``
above 1, new data stays on the EV it took for that many packets before the rotation moves on (a software
NIC's segmentation offload needs runs of packets with one addressing); retransmissions and probes still
take the next EV. An EV is usable when it is GOOD (or SKIP from an earlier epoch) and both its local port
and the peer's port of that plane are up.

* ECN echo (SACK M=SKIP_ONCE) or a trim NACK that is not last-hop → SKIP: not used for the rest of the
  current rotation.
* Loss without trim (inferred or timeout) or SACK M=ALWAYS_SKIP → ASSUMED_BAD at once. The EV leaves the
  rotation and a GOOD backup *of the same plane* takes its slot, so planes stay balanced. If no backup is
  left, the EV stays in its slot but is skipped. Never below ``min_active`` usable EVs: at the floor a bad
  EV is only skipped for the rotation.
* A packet sent on an EV is thought lost but not yet judged (`openmrc.transport.recovery`) → skipped for the
  rotation, or, on a NIC whose host is late (`NicConfig.late_host`), *held*: out of the rotation until
  it is released (the loss was spurious) or blamed (ASSUMED_BAD); no EV event until it is blamed. Not below
  ``min_active`` usable EVs: at the floor it is only skipped for the rotation.
* ASSUMED_BAD EVs are probed every ``probe_interval``, or every probe timeout of the QP when that is longer
  (`due_probes`' ``spacing``: a probe is not repeated while its answer can still come, so a slow path or a
  slow peer is not flooded with probes), the spacing doubling with every probe of the EV that went
  unanswered, up to ``probe_backoff_max`` (the first answer after such a silence is confirmed by a probe at
  once); ``probes_to_restore`` successful probes in a row restore them to GOOD (they return to their slot
  if it is still theirs, else to the backups).
* DENIED is set and cleared only by the controller; a denied EV is never used nor probed.
* A plane the local port has up but the peer says is down (a port status update) is *doubted*, not
  dead: the update is a hint. While the QP has work its requester probes one EV of each doubted plane every
  ``probe_interval``; an answer proves the peer's port up again (`EvTable.doubted`).
* Each probe is outstanding until answered: an answer that matches no outstanding probe (stale, duplicated
  or forged) changes nothing (`EvTable.probe_matches`).

The states and every transition between them are one table, `openmrc.ev.state.TRANSITIONS` (its module
docstring lists them); ``EvTable._fire`` is the one place an EV changes state, and the calls above only say
which trigger happened (at the floor or not). SKIP ends lazily: ``pick`` fires SKIP_ELAPSED on an EV skipped
in an earlier rotation when it reaches it, which happens once a skip, not once a packet.

The changes the table marks EMIT (to ASSUMED_BAD, to DENIED, back to GOOD) are reported through ``emit``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, TypeVar

from mypy_extensions import mypyc_attr

from openmrc.ev import EVState
from openmrc.ev.state import EV_STATE_OF, STATE_BITS, TRANSITION_CODES, Action, MachineState, Trigger

__all__ = ["EvEntry", "EvEvent", "EvStatus", "EvTable"]

# Final: the compiled build keeps them in C statics (a plain module global is a dict lookup per use)
_GOOD: Final = EVState.GOOD
_SKIP: Final = EVState.SKIP
_BAD: Final = EVState.ASSUMED_BAD
_DENIED: Final = EVState.DENIED
_T = TypeVar("_T")
_HELD: Final = 1 << 30
"""The skip epoch of a held EV: after every rotation's (a rotation skips an EV until its epoch is past)."""

# the state machine (`openmrc.ev.state.TRANSITIONS`) as C statics: plain ints, a tuple indexed by int
_CODES: Final = TRANSITION_CODES
_EV_STATE_OF: Final = EV_STATE_OF
_STATE_BITS: Final = STATE_BITS
_STATE_MASK: Final = (1 << STATE_BITS) - 1
_TRIGGERS: Final = len(Trigger)
_S_GOOD: Final = int(MachineState.GOOD)
_S_SKIP: Final = int(MachineState.SKIP)
_S_HELD: Final = int(MachineState.HELD)
_S_BAD: Final = int(MachineState.ASSUMED_BAD)
_S_DENIED: Final = int(MachineState.DENIED)
_T_SKIP: Final = int(Trigger.SKIP)
_T_SKIP_ELAPSED: Final = int(Trigger.SKIP_ELAPSED)
_T_HOLD: Final = int(Trigger.HOLD)
_T_RELEASE: Final = int(Trigger.RELEASE)
_T_BLAME: Final = int(Trigger.BLAME)
_T_PROBE_DIRTY: Final = int(Trigger.PROBE_DIRTY)
_T_PROBE_CLEAN: Final = int(Trigger.PROBE_CLEAN)
_T_PROBE_RESTORES: Final = int(Trigger.PROBE_RESTORES)
_T_SET_GOOD: Final = int(Trigger.SET_GOOD)
_T_SET_DENIED: Final = int(Trigger.SET_DENIED)
_A_STOP_PROBING: Final = int(Action.STOP_PROBING)
_A_RESET_OK: Final = int(Action.RESET_OK)
_A_CONFIRM: Final = int(Action.CONFIRM)
_A_CLEAR_MISSES: Final = int(Action.CLEAR_MISSES)
_A_COUNT_OK: Final = int(Action.COUNT_OK)
_A_PROBE_COUNTS: Final = int(Action.CONFIRM | Action.CLEAR_MISSES | Action.COUNT_OK)
_A_RETIRE: Final = int(Action.RETIRE)
_A_REST: Final = int(Action.REST)
_A_HOLD: Final = int(Action.HOLD)
_A_EMIT: Final = int(Action.EMIT)
_A_START_PROBING: Final = int(Action.START_PROBING)
_A_REJOIN: Final = int(Action.REJOIN)


def shuffle(rng: random.Random, x: list[EvEntry]) -> None:
    """``rng.shuffle(x)``, drawing the very same numbers, at a fraction of the cost for a plain
    `random.Random` (the rotation is re-shuffled once per pass, so this is on the per-packet path)."""
    _Draws(rng, len(x) - 1).shuffle(x)


def _machine_state(e: EvEntry) -> int:
    """``e``'s `MachineState` (HELD is SKIP with the held skip epoch)."""
    st = e.state
    if st is _GOOD:
        return _S_GOOD
    if st is _SKIP:
        return _S_HELD if e.skip_epoch == _HELD else _S_SKIP
    return _S_BAD if st is _BAD else _S_DENIED


def _in_use(e: EvEntry) -> bool:
    """GOOD, or skipped for a rotation only (not held, not ASSUMED_BAD, not DENIED)."""
    st = e.state
    return st is _GOOD or (st is _SKIP and e.skip_epoch != _HELD)


def _interleave(planes: list[list[EvEntry]]) -> list[EvEntry]:
    """The rotation from each plane's EVs (the planes in a drawn order): one EV of every plane in turn, so
    that any run of as many consecutive picks as there are planes spreads over all of them (with bursts,
    each plane carries every so many bursts: one plane is never sent several bursts in a row while another
    idles)."""
    out: list[EvEntry] = []
    longest = max(len(g) for g in planes)
    for i in range(longest):
        for g in planes:
            if i < len(g):
                out.append(g[i])
    return out


def _round(x: float) -> int:
    """``round(x)`` (half to even) for a table's plane sizes times its active fraction, in arithmetic (the
    builtin is a generic call from compiled code)."""
    if not 0.0 <= x < 4503599627370496.0:  # 2**52: below it, x - int(x) is exact
        return round(x)
    r = int(x)
    frac = x - r
    if frac > 0.5 or (frac == 0.5 and r & 1):
        r += 1
    return r


class _Draws:
    """Consecutive `random.Random.shuffle` calls on one generator (a table's planes, then its rotation),
    drawing the very same numbers from batches of the generator's words.

    `random.Random.shuffle` runs Fisher-Yates from the last slot down, drawing each index below ``n`` by
    rejection from ``getrandbits(k)``, ``k = n.bit_length()``, which is the top ``k`` bits of the
    generator's next 32-bit word. ``getrandbits(32·m)`` returns the next ``m`` words at once (the first
    in the lowest bits), so the words are fetched in batches of as many words as slots are still to fill
    (``slots``: every shuffle of ``n`` items fills ``n - 1``), in this shuffle and the ones announced after
    it: every slot takes at least one word, so a batch never takes a word the shuffles would not. Nothing
    else may draw from the generator between the announced shuffles."""

    __slots__ = ("left", "rng", "w", "words")

    def __init__(self, rng: random.Random, slots: int) -> None:
        self.rng = rng
        self.left = slots  # slots still to fill in the announced shuffles
        self.words = b""  # the batch, little-endian: word w is bytes 4w..4w+3
        self.w = 0

    def shuffle(self, x: list[_T]) -> None:
        rng = self.rng
        if type(rng) is not random.Random:
            rng.shuffle(x)  # a subclass may draw differently
            return
        if len(x) < 2:
            return  # nothing to draw (as `random.Random.shuffle`)
        words, w, left = self.words, self.w, self.left
        shift = 32 - len(x).bit_length()  # 32 - n.bit_length() for each n below, kept as n falls
        half = 1 << (31 - shift)  # the least n of that bit length
        for i in range(len(x) - 1, 0, -1):
            n = i + 1
            if n < half:
                shift += 1
                half >>= 1
            while True:
                if w == len(words):
                    m = max(left, 1)  # (a miscount must not stall: at least the word this slot needs)
                    words = rng.getrandbits(32 * m).to_bytes(4 * m, "little")
                    w = 0
                if shift >= 24:  # fewer than 256 slots left: the word's top byte holds all the bits
                    j = words[w + 3] >> (shift - 24)
                else:
                    j = (words[w + 3] << 24 | words[w + 2] << 16 | words[w + 1] << 8 | words[w]) >> shift
                w += 4
                if j < n:
                    break
            left -= 1
            x[i], x[j] = x[j], x[i]
        self.words, self.w, self.left = words, w, left


@mypyc_attr(acyclic=True)
class _Probing:
    """An EV's probe state, made when it is first probed or marked bad (most EVs never are: a QP's table
    is 32 EVs or more, and a fabric has millions of them)."""

    __slots__ = ("misses", "next_probe", "ok", "out")

    def __init__(self) -> None:
        self.next_probe = 0
        self.ok = 0
        self.out = False
        self.misses = 0  # probes sent while the one before was still unanswered, since the last answer


# acyclic: no cyclic-GC header (16 bytes an EV, millions of them); an EV refers to nothing that refers back
@mypyc_attr(acyclic=True)
class EvEntry:
    """One EV of a QP: the expanded value, its port (plane), the 32-bit echo, and its state.

    Its port, rotation slot and skip epoch share one integer (a fabric has millions of EVs: five fields
    are 64 bytes an EV in the compiled build, seven were 80)."""

    __slots__ = ("_packed", "_probing", "entropy", "expanded", "state")

    def __init__(self, expanded: bytes, port: int, entropy: int) -> None:
        if not 0 <= port <= 0xFF:
            raise ValueError(f"EV port {port} outside 0..255")
        self.expanded = expanded
        self.entropy = entropy
        self.state = _GOOD
        self._packed = port  # port 8 | slot + 1 16 | skip_epoch + 1: slot -1 (a backup), skip_epoch -1
        self._probing: _Probing | None = None

    @property
    def port(self) -> int:
        return self._packed & 0xFF

    @property
    def slot(self) -> int:
        """Index in the rotation, -1 for a backup."""
        return ((self._packed >> 8) & 0xFFFF) - 1

    @slot.setter
    def slot(self, slot: int) -> None:
        self._packed = (self._packed & ~0xFFFF00) | (slot + 1) << 8

    @property
    def skip_epoch(self) -> int:
        """The rotation in which the EV was last skipped (-1: never)."""
        return (self._packed >> 24) - 1

    @skip_epoch.setter
    def skip_epoch(self, epoch: int) -> None:
        self._packed = (self._packed & 0xFFFFFF) | (epoch + 1) << 24

    def _probe_state(self) -> _Probing:
        p = self._probing
        if p is None:
            p = self._probing = _Probing()
        return p

    @property
    def probe_out(self) -> bool:
        """A probe on this EV awaits its answer."""
        p = self._probing
        return p is not None and p.out

    @probe_out.setter
    def probe_out(self, out: bool) -> None:
        if out or self._probing is not None:
            self._probe_state().out = out

    @property
    def held(self) -> bool:
        """Out of the rotation until a loss thought to have happened on it is judged."""
        return self.state is _SKIP and self.skip_epoch == _HELD

    @property
    def probe_ok(self) -> int:
        """Successful probes in a row while ASSUMED_BAD."""
        p = self._probing
        return 0 if p is None else p.ok

    @probe_ok.setter
    def probe_ok(self, ok: int) -> None:
        if ok or self._probing is not None:
            self._probe_state().ok = ok

    @property
    def next_probe(self) -> int:
        """When an ASSUMED_BAD EV is probed next."""
        p = self._probing
        return 0 if p is None else p.next_probe

    @next_probe.setter
    def next_probe(self, at: int) -> None:
        if at or self._probing is not None:
            self._probe_state().next_probe = at

    def __repr__(self) -> str:
        return f"EvEntry(port={self.port}, entropy=0x{self.entropy:08x}, {self.state.name}, slot={self.slot})"


def _home(entropy: int) -> int:
    """Where `_entropy_index` starts looking for an echo value (before the mask): its bits folded down, as
    they vary in the high bits (a CRC-32) or only the low 16 (a UDP source port)."""
    h = entropy ^ (entropy >> 16)
    return h ^ (h >> 8)


def _entropy_index(entries: list[EvEntry]) -> bytes:
    """An open-addressing table from echo value to EV: a power of two of slots, at least twice the EVs,
    each 0 (empty) or 1 + the EV's position in ``entries``; linear probing. A slot is a byte, or two
    (little-endian) from 255 EVs on. A dict with the values' integer objects would be ten times the size
    (a QP of 32 EVs: 2.2 KB instead of 64 bytes)."""
    n = len(entries)  # below 0xFFFF (`EvTable` checks)
    size = 4
    while size < 2 * n:
        size <<= 1
    mask = size - 1
    slots = [0] * size
    for k, e in enumerate(entries, 1):
        i = _home(e.entropy) & mask
        while True:
            j = slots[i]
            if not j or entries[j - 1].entropy == e.entropy:  # a repeated value: the later EV, as a dict
                slots[i] = k
                break
            i = (i + 1) & mask
    if n < 0xFF:
        return bytes(slots)
    return b"".join(k.to_bytes(2, "little") for k in slots)


@dataclass(frozen=True, slots=True)
class EvEvent:
    """An EV state change, as the controller's EV event queue reports it."""

    time: int
    qp_num: int
    profile_id: int
    port: int
    ev: bytes
    entropy: int
    state: EVState


@dataclass(frozen=True, slots=True)
class EvStatus:
    """One EV of a QP as the controller sees it (`EvTable.status`)."""

    port: int
    ev: bytes
    entropy: int
    state: EVState
    """GOOD, ASSUMED_BAD or DENIED (SKIP is internal and reads as GOOD)."""
    active: bool
    """In the spraying rotation (False: a backup of its plane)."""
    usable: bool
    """Sprayed on now: in the rotation, GOOD (or SKIP) and its plane up on both sides."""


class EvTable:
    """Spraying state of one QP over its EVs."""

    def __init__(
        self,
        entries: Iterable[tuple[bytes, int, int]],
        *,
        rng: random.Random,
        min_active: int,
        active_fraction: float = 0.75,
        reshuffle_rotations: int = 1,
        burst: int = 1,
        probe_interval: int = 50_000,
        probe_backoff_max: int = 50_000,
        probes_to_restore: int = 2,
        emit: Callable[[EvEvent], None] | None = None,
        qp_num: int = 0,
        profile_id: int = 0,
    ) -> None:
        self.entries: list[EvEntry] = []
        made = self.entries
        per_port: dict[int, list[EvEntry]] = {}
        for ev, port, ent in entries:
            e = EvEntry(ev, port, ent)
            made.append(e)
            group = per_port.get(port)
            if group is None:
                per_port[port] = [e]
            else:
                group.append(e)
        if not self.entries:
            raise ValueError("an EV table needs at least one EV")
        self._rng = rng
        self.min_active = min_active
        self.reshuffle_rotations = reshuffle_rotations
        self.probe_interval = probe_interval
        self.probe_backoff_max = probe_backoff_max
        self.probes_to_restore = probes_to_restore
        self._emit = emit
        self.qp_num = qp_num
        self.profile_id = profile_id
        if len(self.entries) >= 0xFFFF:
            raise ValueError(f"an EV table holds at most {0xFFFF - 1} EVs, not {len(self.entries)}")
        self._index: bytes | None = None  # made at the first `find`: a QP that only receives never needs it
        self.rotation: list[EvEntry] = []
        self._backups: list[EvEntry] = []  # every plane's, in order (a QP has few: no list per plane)
        ports = sorted(per_port)
        actives = [max(1, _round(len(per_port[p]) * active_fraction)) for p in ports]
        # each plane's shuffle, then the planes' order: one batch of the generator's words serves them all
        draws = _Draws(rng, len(self.entries) - 1)
        actives_by_plane = []
        for port, n_active in zip(ports, actives, strict=True):
            group = per_port[port]
            draws.shuffle(group)
            actives_by_plane.append(group[:n_active])
            self._backups.extend(group[n_active:])
        draws.shuffle(actives_by_plane)  # which plane a QP's first packet takes is drawn too
        self.rotation = _interleave(actives_by_plane)
        for i, e in enumerate(self.rotation):
            e.slot = i
        self._pos = 0
        self.epoch = 0
        self.burst = burst
        self._burst_ev: EvEntry | None = None
        self._burst_left = 0
        self._port_mask = (1 << 32) - 1  # bit p-1: port p usable (local and peer side up)
        self._local_mask = (1 << 32) - 1  # bit p-1: the local port p is up
        self.doubted: list[int] = []  # ports up locally that the peer says are down
        self.bad: dict[EvEntry, None] = {}
        """The ASSUMED_BAD EVs (a dict as an ordered set: an empty one is a quarter of an empty set's size,
        and a large fabric has a table per QP)."""
        self._probe_at: int | None = None  # cached next_probe_time()
        self._probe_dirty = False

    def find(self, entropy: int) -> EvEntry | None:
        """The EV whose echo value is ``entropy`` (the last of the profile's if several share it), or None:
        what a SACK or NACK echoes, looked up in `_entropy_index`."""
        idx = self._index
        entries = self.entries
        if idx is None:
            idx = self._index = _entropy_index(entries)
        if len(entries) < 0xFF:
            mask = len(idx) - 1
            wide = False
        else:
            mask = (len(idx) >> 1) - 1
            wide = True
        i = _home(entropy) & mask
        while True:
            k = idx[2 * i] | idx[2 * i + 1] << 8 if wide else idx[i]
            if not k:
                return None
            e = entries[k - 1]
            if e.entropy == entropy:
                return e
            i = (i + 1) & mask

    @property
    def by_entropy(self) -> dict[int, EvEntry]:
        """Every EV by its echo value (a new dict: the per-packet lookup is `find`)."""
        return {e.entropy: e for e in self.entries}

    @property
    def backups(self) -> dict[int, list[EvEntry]]:
        """The EVs out of the rotation, by port (plane), in the order they take a freed slot."""
        return {p: [b for b in self._backups if b.port == p] for p in sorted({e.port for e in self.entries})}

    @property
    def port_mask(self) -> int:
        """Ports whose plane is usable: up locally and, as far as the peer said, on its side too."""
        return self._port_mask

    @port_mask.setter
    def port_mask(self, mask: int) -> None:
        self.set_port_masks(self._local_mask, mask)

    def set_port_masks(self, local: int, usable: int) -> None:
        """The local ports up (``local``) and the usable ones (``usable``: local and the peer's)."""
        self._local_mask = local
        self._port_mask = usable
        self._probe_dirty = True
        doubted = local & ~usable
        self.doubted = sorted({e.port for e in self.entries if (doubted >> (e.port - 1)) & 1})

    def plane_probes(self) -> list[EvEntry]:
        """One EV of each doubted plane to probe (GOOD first, never a DENIED one)."""
        out = []
        for port in self.doubted:
            best = None
            for e in self.rotation:
                if e.port == port and e.state is not _DENIED:
                    if e.state is _GOOD or e.state is _SKIP:
                        best = e
                        break
                    best = best or e
            if best is not None:
                out.append(best)
        return out

    def probe_matches(self, e: EvEntry) -> bool:
        """Whether a probe answer echoing ``e`` answers a probe still outstanding (and clear it)."""
        if not e.probe_out:
            return False
        e.probe_out = False
        return True

    def status(self) -> list[EvStatus]:
        """Every EV of the QP, in the profile's order."""
        mask = self._port_mask
        out = []
        for e in self.entries:
            good = e.state is _GOOD or e.state is _SKIP
            active = e.slot >= 0
            usable = good and active and bool((mask >> (e.port - 1)) & 1) and not e.held
            out.append(EvStatus(e.port, e.expanded, e.entropy, _GOOD if good else e.state, active, usable))
        return out

    # -- spraying ------------------------------------------------------------------------------------------
    def pick(self, avoid: EvEntry | None = None, port: int = 0) -> EvEntry | None:
        """The next usable EV of the rotation (not ``avoid`` if another exists; on ``port`` if non-zero)."""
        mask = self._port_mask
        new_data = avoid is None and not port
        if self._burst_left and new_data:  # the rest of a burst: the same EV while it stays usable
            e = self._burst_ev
            if e is not None and e.state is _GOOD and (mask >> (e.port - 1)) & 1:
                self._burst_left -= 1
                return e
            self._burst_left = 0
        rot = self.rotation
        pos = self._pos
        n = len(rot)
        # Per-packet fast path: while spraying, the next slot almost always holds a GOOD EV of a usable plane.
        if pos < n:
            e = rot[pos]
            if (
                e.state is _GOOD
                and e is not avoid
                and (mask >> (e.port - 1)) & 1
                and (not port or e.port == port)
            ):
                self._pos = pos + 1
                return self._take(e, new_data)
        fallback = None
        for _ in range(2 * n):  # (a wrap re-shuffles: the whole new rotation is looked at too)
            if pos >= n:  # wrap lazily, so `epoch` is the rotation of the EV read below
                self._new_epoch()
                pos = 0
            e = rot[pos]
            pos += 1
            if port and e.port != port:  # cheapest test first: a control packet skips ~(ports-1)/ports
                continue
            st = e.state
            if st is _GOOD or (st is _SKIP and e.skip_epoch < self.epoch):
                if not (mask >> (e.port - 1)) & 1:
                    continue
                if e is avoid:
                    fallback = e
                    continue
                if st is _SKIP:  # skipped in an earlier rotation: once a skip, not once a packet
                    self._fire(e, _S_SKIP, _T_SKIP_ELAPSED, 0)
                self._pos = pos
                return self._take(e, new_data)
        self._pos = pos
        return fallback

    def _take(self, e: EvEntry, new_data: bool) -> EvEntry:
        """``e`` is the pick: start a burst on it for new data."""
        if new_data and self.burst > 1:
            self._burst_ev, self._burst_left = e, self.burst - 1
        return e

    def _new_epoch(self) -> None:
        self._pos = 0
        self.epoch += 1
        if self.epoch % self.reshuffle_rotations == 0:
            rot = self.rotation
            planes: dict[int, list[EvEntry]] = {}
            for e in rot:
                group = planes.get(e.port)
                if group is None:
                    planes[e.port] = [e]
                else:
                    group.append(e)
            groups = [planes[port] for port in sorted(planes)]
            draws = _Draws(self._rng, len(rot) - 1)
            for group in groups:
                draws.shuffle(group)
            draws.shuffle(groups)
            rot[:] = _interleave(groups)
            for i, e in enumerate(rot):
                e.slot = i

    def usable_count(self) -> int:
        """EVs of the rotation that may carry packets (GOOD, or skipped for the rotation; not held) on usable
        planes."""
        mask = self.port_mask
        n = 0
        for e in self.rotation:
            if _in_use(e) and (mask >> (e.port - 1)) & 1:
                n += 1
        return n

    def _at_floor(self, e: EvEntry) -> bool:
        """Whether taking ``e`` out of use would leave fewer than ``min_active`` usable EVs."""
        if e.slot < 0:
            return False
        n = self.usable_count()
        if _in_use(e) and (self._port_mask >> (e.port - 1)) & 1:
            n -= 1
        return n < self.min_active

    # -- feedback ------------------------------------------------------------------------------------------
    def skip(self, e: EvEntry) -> None:
        """ECN echo, a (not last-hop) trim, or a loss not judged yet: do not use ``e`` for the rest of this
        rotation (a held EV stays held)."""
        self._fire(e, _machine_state(e), _T_SKIP, 0)

    def hold(self, e: EvEntry) -> None:
        """A packet sent on ``e`` is thought lost: keep ``e`` out of the rotation until `release` or
        `mark_bad` (at the ``min_active`` floor, only for this rotation)."""
        self._fire_guarded(e, _T_HOLD, 0)

    def release(self, e: EvEntry) -> None:
        """The loss that held ``e`` was spurious: back in the rotation."""
        self._fire(e, _machine_state(e), _T_RELEASE, 0)

    def mark_bad(self, e: EvEntry, now: int) -> None:
        """Loss without trim, timeout, or M=ALWAYS_SKIP: ASSUMED_BAD now, replaced from the same plane."""
        self._fire_guarded(e, _T_BLAME, now)

    def _fire_guarded(self, e: EvEntry, trigger: int, now: int) -> None:
        """``trigger`` on ``e``, or its ``*_AT_FLOOR`` form (the next trigger) if taking ``e`` out of use
        would leave fewer than ``min_active`` usable EVs: judged only where the table tells them apart."""
        state = _machine_state(e)
        i = state * _TRIGGERS + trigger
        if _CODES[i] != _CODES[i + 1] and self._at_floor(e):
            trigger += 1
        self._fire(e, state, trigger, now)

    def _fire(self, e: EvEntry, state: int, trigger: int, now: int) -> None:
        """The one place an EV changes state: ``trigger`` on ``e``, in `MachineState` ``state``, leads where
        `openmrc.ev.state.TRANSITIONS` says, its actions taken in the order of their bits."""
        code = _CODES[state * _TRIGGERS + trigger]
        if code == state:  # a no-op cell: the same state, no action
            return
        to = code & _STATE_MASK
        act = code >> _STATE_BITS
        if act & _A_STOP_PROBING:
            self.bad.pop(e, None)
            self._probe_dirty = True
        if act & _A_RESET_OK:
            e.probe_ok = 0
        if act & _A_PROBE_COUNTS:
            p = e._probe_state()
            if act & _A_CONFIRM and p.misses:
                # the first answer after probes went unanswered (a path back after a failure): the next probe
                # goes at once rather than after the spacing the silence had grown to
                p.next_probe = now
                self._probe_dirty = True
            if act & _A_CLEAR_MISSES:
                p.misses = 0
            if act & _A_COUNT_OK:
                p.ok += 1
        if act & _A_RETIRE:
            self._retire(e)
        if to != state:
            e.state = _EV_STATE_OF[to]
        if act & _A_REST:
            e.skip_epoch = self.epoch
        elif act & _A_HOLD:
            e.skip_epoch = _HELD
        if act & _A_EMIT and self._emit is not None:
            self._emit(EvEvent(now, self.qp_num, self.profile_id, e.port, e.expanded, e.entropy, e.state))
        if act & _A_START_PROBING:
            p = e._probe_state()
            p.ok = p.misses = 0
            p.next_probe = now + self.probe_interval
            self.bad[e] = None
            self._probe_dirty = True
        if act & _A_REJOIN and e.slot < 0 and e not in self._backups:
            self._backups.append(e)

    def _retire(self, e: EvEntry) -> None:
        """Give ``e``'s rotation slot to a GOOD backup of the same plane, if there is one."""
        if e.slot < 0:
            backups = self._backups
            if e in backups:
                backups.remove(e)
            return
        backups = self._backups
        for i, b in enumerate(backups):
            if b.port == e.port and b.state is _GOOD:
                del backups[i]
                b.slot = e.slot
                self.rotation[e.slot] = b
                e.slot = -1
                return

    # -- probing -------------------------------------------------------------------------------------------
    def due_probes(self, now: int, spacing: int = 0) -> list[EvEntry]:
        """ASSUMED_BAD EVs whose probe is due (and whose port is usable); schedules their next probe
        ``max(probe_interval, spacing)`` later (``spacing``: how long an answer may take)."""
        out = []
        mask = self.port_mask
        every = max(self.probe_interval, spacing)
        cap = self.probe_backoff_max
        for e in self.bad:
            if e.next_probe <= now and (mask >> (e.port - 1)) & 1:
                p = e._probe_state()
                if p.out:  # the last probe went unanswered: wait longer for this one
                    p.misses += 1
                wait = every << min(p.misses, 20)
                e.next_probe = now + (wait if wait < cap or every >= cap else cap)
                out.append(e)
        if out:
            self._probe_dirty = True
        out.sort(key=lambda e: e.entropy)  # set order is not deterministic across runs
        return out

    def defer_probe(self, e: EvEntry, at: int) -> None:
        """Probe ASSUMED_BAD ``e`` no sooner than ``at``."""
        if e.next_probe < at:
            e.next_probe = at
            self._probe_dirty = True

    def next_probe_time(self) -> int | None:
        """When the next probe is due (EVs of unusable ports are not probed until their port is back)."""
        if self._probe_dirty:
            mask = self._port_mask
            self._probe_at = min((e.next_probe for e in self.bad if (mask >> (e.port - 1)) & 1), default=None)
            self._probe_dirty = False
        return self._probe_at

    def probe_answered(self, e: EvEntry, now: int, good: bool) -> None:
        """A probe (or any packet) sent on ASSUMED_BAD ``e`` was acknowledged; ``good``: with M=NONE."""
        if not good:
            trigger = _T_PROBE_DIRTY
        elif e.probe_ok + 1 >= self.probes_to_restore:
            trigger = _T_PROBE_RESTORES
        else:
            trigger = _T_PROBE_CLEAN
        self._fire(e, _machine_state(e), trigger, now)

    # -- controller ----------------------------------------------------------------------------------------
    def set_state(self, e: EvEntry, state: EVState, now: int) -> None:
        """Controller MODIFY_EV_STATE: DENIED, GOOD (also lifts a denial) or ASSUMED_BAD (as `mark_bad`)."""
        if state is _DENIED:
            self._fire(e, _machine_state(e), _T_SET_DENIED, now)
        elif state is _GOOD:
            self._fire(e, _machine_state(e), _T_SET_GOOD, now)
        elif state is _BAD:
            self.mark_bad(e, now)
        else:
            raise ValueError(f"controller cannot set EV state {state.name}")
