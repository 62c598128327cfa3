"""Congestion-control interface and registry of algorithms by name (aioquic shape).

A QP owns one :class:`CongestionControl` object. The transport asks it whether a packet may leave
(:meth:`~CongestionControl.can_send`) and feeds it the congestion signals the MRC wire carries: every SACK
(bytes newly acknowledged, RTT sample, ECN echo), every trim NACK, every loss the requester infers or times
out on, and the receiver's CC_STATE fields. Sizes are bytes, times integer nanoseconds; time is always an
argument, so the same object runs under the real clock and the simulator's.

Algorithms register under a name (:func:`register_cc`, usable as a class decorator) and are built with
:func:`create_cc`, which is how a CC profile's algorithm id becomes an object. Built-ins: ``"uet-1.0-nscc"``
(:class:`openmrc.transport.nscc.Nscc`) and ``"none"`` (:class:`FixedWindow`).
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass
from typing import ClassVar, Final, TypeVar

from mypy_extensions import mypyc_attr

__all__ = [
    "UNLIMITED_CWND",
    "CongestionControl",
    "FixedWindow",
    "FixedWindowConfig",
    "UnknownCcAlgorithm",
    "cc_algorithms",
    "create_cc",
    "register_cc",
    "unregister_cc",
]

UNLIMITED_CWND: Final = 1 << 61  # below 2**62: compared unboxed in the compiled build
"""Window of :class:`FixedWindow` when no size is configured: more than a QP can ever have in flight."""

_BUILTIN_MODULES: Final = ("openmrc.transport.nscc",)
"""Modules whose import registers the built-in algorithms that do not live in this module."""

_ABSTRACT: Final = ("on_ack", "on_trim", "on_loss")
_COMPLETE: Final[set[type]] = set()  # CongestionControl subclasses found to implement every abstract method


@mypyc_attr(allow_interpreted_subclasses=True)
class CongestionControl(abc.ABC):
    """Per-QP window-based congestion control. All sizes in bytes, times in ns.

    The transport calls the ``on_*`` hooks with positional arguments, in the order of their signatures here
    (keywords would cost a per-SACK argument parse): an algorithm keeps the parameter order.
    """

    __slots__ = ("mtu",)

    name: ClassVar[str]
    """Registry name of the algorithm."""
    config_type: ClassVar[type | None] = None
    """Type the ``config`` argument must have (``None`` when the algorithm takes no configuration)."""

    mtu: int
    """Largest packet payload in bytes; the smallest window any algorithm may have."""
    cwnd: int
    """Current congestion window in bytes (an attribute or a property in subclasses)."""

    def __init__(self, *, mtu: int, config: object | None = None, now: int = 0) -> None:
        if isinstance(mtu, bool) or not isinstance(mtu, int) or mtu <= 0:
            raise ValueError(f"mtu must be a positive integer, got {mtu!r}")
        # ABC refuses abstract classes itself, but not once this module is compiled: check here too (once a
        # class: every QP of a simulated fabric makes one)
        cls = type(self)
        if cls not in _COMPLETE:
            missing = [m for m in _ABSTRACT if getattr(cls, m) is getattr(CongestionControl, m)]
            if missing:
                raise TypeError(f"can't instantiate {cls.__name__}: {', '.join(missing)} not implemented")
            _COMPLETE.add(cls)
        self.mtu = mtu
        self._check_config(config)

    @classmethod
    def _check_config(cls, config: object | None) -> None:
        """Raise ``TypeError`` naming :attr:`config_type` unless ``config`` is ``None`` or of that type."""
        if config is None:
            return
        expected = cls.config_type
        if expected is None:
            raise TypeError(f"{cls.name} takes no config, got {type(config).__name__}")
        if not isinstance(config, expected):
            raise TypeError(
                f"{cls.name} expects config of type {expected.__name__}, got {type(config).__name__}"
            )

    def can_send(self, inflight: int, size: int) -> bool:
        """Whether a packet of ``size`` bytes may be sent with ``inflight`` bytes outstanding."""
        return inflight + size <= self.cwnd

    def on_send(self, now: int, size: int, inflight: int) -> None:  # noqa: B027 - optional hook
        """A packet of ``size`` bytes left; ``inflight`` includes it."""

    @abc.abstractmethod
    def on_ack(
        self,
        now: int,
        newly_acked: int,
        inflight: int,
        rtt_ns: int | None,
        ecn: bool,
        service_ns: int = 0,
    ) -> None:
        """One SACK: bytes it newly acknowledges, bytes still in flight after it, its RTT sample if any,
        its ECN echo (M = SKIP_ONCE) and the responder's service time included in the RTT."""

    @abc.abstractmethod
    def on_trim(self, now: int, size: int, inflight: int, last_hop: bool) -> None:
        """A NACK TRIMMED (``last_hop`` False) or TRIMMED_LASTHOP for a packet of ``size`` bytes."""

    @abc.abstractmethod
    def on_loss(self, now: int, inflight: int) -> None:
        """A retransmission timeout or an inferred loss (no trim NACK)."""

    def on_receiver_state(self, now: int, rcv_cwnd_pen: int, restore: bool) -> None:  # noqa: B027
        """The receiver's CC_STATE fields carried by a SACK."""


@mypyc_attr(native_class=False)
class UnknownCcAlgorithm(KeyError):
    """:func:`create_cc` was asked for a name no algorithm is registered under."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(name)
        self.name = name
        self.known = known

    def __str__(self) -> str:
        return f"unknown congestion control algorithm {self.name!r}; known: {', '.join(self.known)}"


_CcT = TypeVar("_CcT", bound=type[CongestionControl])

_registry: dict[str, type[CongestionControl]] = {}
_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)


def register_cc(cls: _CcT) -> _CcT:
    """Register ``cls`` under ``cls.name``; usable as a class decorator.

    Registering the same class twice is harmless; another class under a taken name is a ``ValueError``.
    """
    if not (isinstance(cls, type) and issubclass(cls, CongestionControl)):
        raise TypeError(f"{cls!r} is not a CongestionControl subclass")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__} needs a non-empty str class attribute 'name'")
    taken = _registry.get(name)
    if taken is not None and taken is not cls:
        raise ValueError(f"congestion control name {name!r} is already registered to {taken.__qualname__}")
    _registry[name] = cls
    return cls


def unregister_cc(name: str) -> None:
    """Remove the algorithm registered under ``name`` (:class:`UnknownCcAlgorithm` if there is none)."""
    _load_builtins()
    if name not in _registry:
        raise UnknownCcAlgorithm(name, sorted(_registry))
    del _registry[name]


def cc_algorithms() -> list[str]:
    """Names of the registered algorithms, sorted."""
    _load_builtins()
    return sorted(_registry)


def create_cc(name: str, *, mtu: int, config: object | None = None, now: int = 0) -> CongestionControl:
    """Build the algorithm registered under ``name``.

    Raises :class:`UnknownCcAlgorithm` (a ``KeyError``) for an unknown name and ``TypeError`` naming the
    expected type when ``config`` has the wrong type.
    """
    _load_builtins()
    cls = _registry.get(name)
    if cls is None:
        raise UnknownCcAlgorithm(name, sorted(_registry))
    cls._check_config(config)
    return cls(mtu=mtu, config=config, now=now)


@dataclass(frozen=True, slots=True)
class FixedWindowConfig:
    """Configuration of the ``"none"`` algorithm."""

    cwnd_bytes: int | None = None
    """Fixed window in bytes; ``None`` means unlimited (:data:`UNLIMITED_CWND`)."""

    def __post_init__(self) -> None:
        cwnd = self.cwnd_bytes
        if cwnd is not None and (isinstance(cwnd, bool) or not isinstance(cwnd, int) or cwnd <= 0):
            raise ValueError(f"cwnd_bytes must be None or a positive integer, got {cwnd!r}")


class FixedWindow(CongestionControl):
    """No congestion control: a constant window and no reaction to any signal."""

    __slots__ = ("cwnd",)

    name = "none"
    config_type = FixedWindowConfig

    def __init__(self, *, mtu: int, config: object | None = None, now: int = 0) -> None:
        super().__init__(mtu=mtu, config=config, now=now)
        cfg = config if isinstance(config, FixedWindowConfig) else FixedWindowConfig()
        if cfg.cwnd_bytes is None:
            self.cwnd = UNLIMITED_CWND
        elif cfg.cwnd_bytes < mtu:
            raise ValueError(f"cwnd_bytes ({cfg.cwnd_bytes}) must be at least the MTU ({mtu})")
        else:
            self.cwnd = cfg.cwnd_bytes

    def on_ack(
        self,
        now: int,
        newly_acked: int,
        inflight: int,
        rtt_ns: int | None,
        ecn: bool,
        service_ns: int = 0,
    ) -> None:
        """Ignored."""

    def on_trim(self, now: int, size: int, inflight: int, last_hop: bool) -> None:
        """Ignored."""

    def on_loss(self, now: int, inflight: int) -> None:
        """Ignored."""


register_cc(FixedWindow)
