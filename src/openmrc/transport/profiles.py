"""The NIC's EV and CC profiles: the node-local state a controller edits and QPs bind to by id.

`ProfileTable` holds the installed EV profiles (each EV expanded once, with its port and 32-bit echo
value: `EvProfileBinding`), the CC profiles (an algorithm name and its configuration), builds a QP's
`EvTable` from the profile it binds in INIT, and queues the EV state changes that the profile's event mask
selects (the controller's EV event queue). Profile 0 of each kind is the NIC's own: EV profile 0 is an
AUTO profile of ``NicConfig.default_ev_count`` UDP source ports spread over the ports, CC profile 0 is
UET NSCC sized for the NIC's aggregate rate. The data path (`openmrc.transport.nic`) never looks here
per packet.
"""

from __future__ import annotations

import errno
import math
import random
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

from openmrc.ev import EVENT_MASK_ALLOWED, EVFormatMode, EVProfile, EVProfileMode, EVState, ev_echo32
from openmrc.transport.cc import CongestionControl, create_cc
from openmrc.transport.config import NicConfig
from openmrc.transport.evtable import EvEvent, EvTable
from openmrc.transport.nscc import NsccConfig
from openmrc.transport.stats import NicStats
from openmrc.transport.types import LocalProtocolError

Buffer = bytes | bytearray | memoryview
"""An expanded EV as a caller may hand it (the profile keeps its own bytes)."""

__all__ = ["EvProfileBinding", "ProfileTable", "sample_range"]

EVENT_QUEUE_DEPTH = 1 << 16
_SRV6: Final = EVFormatMode.SRV6  # its echo is the CRC-32 of the expanded EV (`ev_echo32`)


def sample_range(rng: random.Random, start: int, stop: int, k: int) -> list[int]:
    """``rng.sample(range(start, stop), k)``: the same values from the same draws, leaving ``rng`` in the
    same state (a simulated fabric draws one NIC's default EVs 100K+ times, and the library's loop is
    interpreted). Any other kind of random source gets the library's own."""
    n = stop - start
    if type(rng) is not random.Random or not 0 <= k <= n:
        return rng.sample(range(start, stop), k)
    bits = rng.getrandbits
    out = [0] * k
    setsize = 21  # the library's choice between a pool and a set of the chosen, made the same way
    if k > 5:
        setsize += 4 ** math.ceil(math.log(k * 3, 4))
    if n <= setsize:
        pool = list(range(start, stop))
        for i in range(k):
            m = n - i
            width = m.bit_length()
            j = int(bits(width))
            while j >= m:
                j = int(bits(width))
            out[i] = pool[j]
            pool[j] = pool[m - 1]
        return out
    width = n.bit_length()
    chosen: set[int] = set()
    for i in range(k):
        j = int(bits(width))
        while j >= n or j in chosen:
            j = int(bits(width))
        chosen.add(j)
        out[i] = start + j
    return out


class EvProfileBinding:
    """An EV profile as the NIC holds it: every EV expanded, with its port and 32-bit echo value.

    A simulated fabric's NICs hold millions of EVs, so they are kept packed (the expanded values, then a
    16-bit word per port and a 32-bit word per echo, no tuple or integer object per EV); `entries` builds
    the (expanded EV, port, echo) tuples when asked. It is also what the EV tables of the QPs that bind it
    hand their events to (`__call__`: one object per profile, not a closure per QP)."""

    __slots__ = ("_echoes", "_evs", "_ports", "event_mask", "min_active", "mode", "profile_id", "queue")

    def __init__(
        self,
        profile_id: int,
        mode: EVFormatMode,
        evs: Sequence[bytes],
        ports: Sequence[int],
        echoes: Sequence[int],
        min_active: int,
        event_mask: int,
    ) -> None:
        """The profile's EVs as three columns of one length: expanded EV, port, 32-bit echo value."""
        self.profile_id = profile_id
        self.mode = mode
        self._evs = tuple(evs)
        self._ports = array("H", ports)
        self._echoes = array("I", echoes)
        self.min_active = min_active
        self.event_mask = event_mask
        self.queue: Callable[[EvEvent], None] | None = None
        """Where the events the mask selects go (the NIC's EV event queue, set when a QP binds it)."""

    def __call__(self, ev: EvEvent) -> None:
        if ev.state & self.event_mask and self.queue is not None:
            self.queue(ev)

    @property
    def entries(self) -> tuple[tuple[bytes, int, int], ...]:
        """Each EV as (expanded EV, port, 32-bit echo), in the profile's order."""
        return tuple(zip(self._evs, self._ports, self._echoes, strict=True))


class ProfileTable:
    """EV and CC profiles of a NIC with ``num_ports`` ports, and its EV event queue."""

    def __init__(self, num_ports: int, rng: random.Random, config: NicConfig, stats: NicStats) -> None:
        self.num_ports = num_ports
        self.rng = rng
        self.config = config
        self.stats = stats
        self.ev: dict[int, EvProfileBinding] = {}
        self.cc: dict[int, tuple[str, object | None]] = {}
        self._events: deque[EvEvent] | None = None  # made at the first event (see events)
        self.sinks: list[Callable[[EvEvent], None]] = []
        """Called with every queued event as well (a controller's EV event queues)."""
        self.resolver: Callable[[int, int], bool] | None = None
        """Asked whether profile (kind 0: EV, 1: CC, id) may be bound, when profiles come from elsewhere
        too (a node's shared store); it installs or removes them here and answers."""
        self.ev_states: dict[int, dict[int, EVState]] = {}
        """Per EV profile, the states a controller set (by EV echo value): a QP binding it later starts so."""
        self.controller: object | None = None
        """The controller's own record of this NIC (`openmrc.ctl`: its profiles in every state, the ports it
        took down, its grant, its store), here so that it lives and dies with the NIC."""
        # The values are drawn now (the rng sequence must not depend on whether profile 0 is used), the
        # profile itself is built on first use: a simulated fabric of 100K+ NICs mostly never needs it.
        self._default_ev_values: array[int] | None = array(
            "H", sample_range(rng, *config.default_ev_sports, config.default_ev_count)
        )
        self.cc[0] = (
            "uet-1.0-nscc",
            NsccConfig.defaults(
                config.link_bps * num_ports, config.base_rtt_ns, config.mtu, trimming=config.trimming
            ),
        )

    @property
    def events(self) -> deque[EvEvent]:
        """The EV event queue, oldest first (made at first use: an empty deque is most of a kilobyte, and
        most NICs of a simulated fabric never queue an event)."""
        q = self._events
        if q is None:
            q = self._events = deque(maxlen=EVENT_QUEUE_DEPTH)
        return q

    # -- EV profiles ---------------------------------------------------------------------------------------
    def has_ev_profile(self, profile_id: int) -> bool:
        """Whether a QP may bind EV profile ``profile_id`` (asked when one does: a ``resolver`` may bring
        it in, or learn that it went away)."""
        if self.resolver is not None and profile_id != 0:
            return self.resolver(0, profile_id)
        return profile_id in self.ev or (profile_id == 0 and self._default_ev_values is not None)

    def has_cc_profile(self, profile_id: int) -> bool:
        """Whether a QP may bind CC profile ``profile_id`` (see `has_ev_profile`)."""
        if self.resolver is not None and profile_id != 0:
            return self.resolver(1, profile_id)
        return profile_id in self.cc

    def ev_profile(self, profile_id: int) -> EvProfileBinding:
        """The installed EV profile ``profile_id`` (`LocalProtocolError` ENOENT if none); profile 0 is built
        on first use."""
        b = self.ev.get(profile_id)
        if b is None:
            values = self._default_ev_values
            if profile_id != 0 or values is None:
                raise LocalProtocolError(errno.ENOENT, f"no EV profile {profile_id}")
            b = self.ev[0] = self._default_profile(values)
        return b

    def _default_profile(
        self, values: array[int], profile_id: int = 0, min_active: int = -1, event_mask: int = -1
    ) -> EvProfileBinding:
        evs = [v.to_bytes(2, "big") + bytes(30) for v in values]
        n = len(values)
        return EvProfileBinding(
            profile_id,
            EVFormatMode.UDP,
            evs,
            [1 + i % self.num_ports for i in range(n)],
            values,  # a UDP EV's echo is its source port: the value itself (`ev_echo32`)
            max(1, n // 8) if min_active < 0 else min_active,
            int(EVENT_MASK_ALLOWED) if event_mask < 0 else event_mask,
        )

    def add_auto_profile(self, profile_id: int, min_active: int, event_mask: int) -> EvProfileBinding:
        """Install an AUTO (vendor-managed) EV profile: the NIC's own UDP source-port EVs, with the
        controller's minimum of active EVs and event mask."""
        values = self._default_ev_values
        if values is None:
            raise LocalProtocolError(errno.EOPNOTSUPP, "this NIC has no EVs of its own for AUTO profiles")
        if not 0 <= min_active <= len(values):
            raise LocalProtocolError(errno.EINVAL, f"min_active: {min_active} outside 0..{len(values)}")
        b = self.ev[profile_id] = self._default_profile(values, profile_id, min_active, event_mask)
        return b

    def remove_ev_profile(self, profile_id: int) -> None:
        """Uninstall EV profile ``profile_id`` (QPs that bound it keep their EV tables)."""
        if self.ev.pop(profile_id, None) is None:
            raise LocalProtocolError(errno.ENOENT, f"no EV profile {profile_id}")
        self.ev_states.pop(profile_id, None)

    def add_ev_profile(
        self, profile_id: int, profile: EVProfile, ports: Sequence[int] | None = None
    ) -> EvProfileBinding:
        """Install an EV profile. EXP EVs take ``ports`` (one per EV) or round-robin over the ports; GEN EVs
        are drawn with the NIC's rng and spread round-robin, so planes get equal shares."""
        if profile.mode is EVProfileMode.AUTO:
            raise LocalProtocolError(
                errno.EINVAL, "AUTO EV profiles are vendor-managed; the NIC's default profile 0 is one"
            )
        assert profile.fmt is not None
        compact = list(profile.evs or ()) if profile.mode is EVProfileMode.EXP else profile.generate(self.rng)
        if ports is not None and len(ports) != len(compact):
            raise LocalProtocolError(errno.EINVAL, f"ports: {len(ports)} given for {len(compact)} EVs")
        evs, at = [], []
        for i, c in enumerate(compact):
            port = ports[i] if ports is not None else 1 + i % self.num_ports
            if not 1 <= port <= self.num_ports:
                raise LocalProtocolError(errno.EINVAL, f"ports[{i}]: port {port} outside 1..{self.num_ports}")
            evs.append(profile.expand(c))
            at.append(port)
        mode = profile.fmt.mode
        echoes = [ev_echo32(ev, mode) for ev in evs]
        b = EvProfileBinding(profile_id, mode, evs, at, echoes, profile.ev_min_active, profile.event_mask)
        self.ev[profile_id] = b
        return b

    def add_expanded_profile(
        self,
        profile_id: int,
        mode: EVFormatMode,
        evs: Sequence[tuple[Buffer, int]],
        min_active: int,
        event_mask: int,
    ) -> EvProfileBinding:
        """Install an EV profile of expanded EVs (32 bytes each, as a controller's EV array holds them),
        each with its port."""
        rows = list(evs)
        values = [ev for ev, _ in rows]
        return self.add_expanded_columns(
            profile_id, mode, values, [p for _, p in rows], min_active, event_mask
        )

    def add_expanded_columns(
        self,
        profile_id: int,
        mode: EVFormatMode,
        evs: Sequence[Buffer],
        ports: Sequence[int],
        min_active: int,
        event_mask: int,
    ) -> EvProfileBinding:
        """`add_expanded_profile` with the EVs and their ports as two columns of one length."""
        if len(ports) != len(evs):
            raise LocalProtocolError(errno.EINVAL, f"{len(evs)} EVs but {len(ports)} ports")
        values: list[bytes] = []
        for i, raw in enumerate(evs):
            ev = raw if type(raw) is bytes else bytes(raw)  # a caller's buffer may change later
            if len(ev) != 32:
                raise LocalProtocolError(errno.EINVAL, f"EV {i}: {len(ev)} bytes, an expanded EV has 32")
            values.append(ev)
        num_ports = self.num_ports
        for i, port in enumerate(ports):
            if not 1 <= port <= num_ports:
                raise LocalProtocolError(errno.EINVAL, f"EV {i}: port {port} outside 1..{num_ports}")
        if not values or not 0 <= min_active <= len(values):
            raise LocalProtocolError(errno.EINVAL, f"min_active: {min_active} outside 0..{len(values)}")
        crc32 = zlib.crc32
        echoes = [crc32(ev) for ev in values] if mode is _SRV6 else [ev_echo32(ev, mode) for ev in values]
        b = EvProfileBinding(profile_id, mode, values, ports, echoes, min_active, event_mask)
        self.ev[profile_id] = b
        return b

    def build_ev_table(
        self, qp_num: int, profile_id: int, local_mask: int, peer_mask: int, now: int = 0
    ) -> EvTable:
        """The EV table of QP ``qp_num`` bound to EV profile ``profile_id``, with the usable ports
        ``local_mask & peer_mask`` and the EV states a controller set on the profile; its state changes
        that the profile's event mask selects are queued."""
        b = self.ev_profile(profile_id)
        cfg = self.config
        if b.queue is None:
            b.queue = self._queue_event
        t = EvTable(
            zip(b._evs, b._ports, b._echoes, strict=True),  # no tuple of the rows (`entries`) made first
            rng=self.rng,
            min_active=b.min_active,
            active_fraction=cfg.active_ev_fraction,
            reshuffle_rotations=cfg.reshuffle_rotations,
            burst=cfg.spray_burst,
            probe_interval=cfg.probe_interval_ns,
            probe_backoff_max=cfg.probe_backoff_max_ns,
            probes_to_restore=cfg.probes_to_restore,
            emit=b,
            qp_num=qp_num,
            profile_id=b.profile_id,
        )
        t.set_port_masks(local_mask, peer_mask)
        for entropy, state in self.ev_states.get(profile_id, {}).items():
            e = t.find(entropy)
            if e is not None:
                t.set_state(e, state, now)
        return t

    def _queue_event(self, ev: EvEvent) -> None:
        events = self.events
        if len(events) == events.maxlen:
            self.stats.ev_events_dropped += 1
        events.append(ev)
        for sink in self.sinks:
            sink(ev)

    def poll_events(self, n: int = 64) -> list[EvEvent]:
        """Up to ``n`` queued EV events, oldest first."""
        events = self._events
        out: list[EvEvent] = []
        while events is not None and events and len(out) < n:
            out.append(events.popleft())
        return out

    # -- CC profiles ---------------------------------------------------------------------------------------
    def add_cc_profile(self, profile_id: int, algorithm: str, config: object | None = None) -> None:
        try:  # validates name and config type now
            create_cc(algorithm, mtu=self.config.mtu, config=config)
        except (TypeError, ValueError, KeyError) as exc:  # KeyError: an unknown algorithm name
            raise LocalProtocolError(errno.EINVAL, f"CC profile {profile_id}: {exc}") from None
        self.cc[profile_id] = (algorithm, config)

    def remove_cc_profile(self, profile_id: int) -> None:
        """Uninstall CC profile ``profile_id`` (QPs that bound it keep their congestion control)."""
        if self.cc.pop(profile_id, None) is None:
            raise LocalProtocolError(errno.ENOENT, f"no CC profile {profile_id}")

    def make_cc(self, profile_id: int, now: int) -> CongestionControl:
        name, cfg = self.cc[profile_id]
        return create_cc(name, mtu=self.config.mtu, config=cfg, now=now)
