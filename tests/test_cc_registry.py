"""Congestion-control interface and registry: lookup by name, errors, the fixed window, custom algorithms."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from openmrc.transport.cc import (
    UNLIMITED_CWND,
    CongestionControl,
    FixedWindow,
    FixedWindowConfig,
    UnknownCcAlgorithm,
    cc_algorithms,
    create_cc,
    register_cc,
    unregister_cc,
)
from openmrc.transport.nscc import Nscc, NsccConfig

MTU = 4096


class Aimd(CongestionControl):
    """A toy algorithm: +MTU per ACK, halve on trim or loss."""

    name = "test-aimd"

    def __init__(self, *, mtu: int, config: object | None = None, now: int = 0) -> None:
        super().__init__(mtu=mtu, config=config, now=now)
        self.cwnd = 10 * mtu

    def on_ack(
        self,
        now: int,
        newly_acked: int,
        inflight: int,
        rtt_ns: int | None,
        ecn: bool,
        service_ns: int = 0,
    ) -> None:
        self.cwnd += self.mtu

    def on_trim(self, now: int, size: int, inflight: int, last_hop: bool) -> None:
        self.cwnd = max(self.cwnd // 2, self.mtu)

    def on_loss(self, now: int, inflight: int) -> None:
        self.cwnd = max(self.cwnd // 2, self.mtu)


@pytest.fixture
def aimd() -> Iterator[type[Aimd]]:
    register_cc(Aimd)
    try:
        yield Aimd
    finally:
        unregister_cc(Aimd.name)


def test_builtins_are_listed() -> None:
    names = cc_algorithms()
    assert {"uet-1.0-nscc", "none"} <= set(names)
    assert names == sorted(names)


def test_create_nscc_by_name() -> None:
    cfg = NsccConfig.defaults(100_000_000_000, 10_000, MTU)
    cc = create_cc("uet-1.0-nscc", mtu=MTU, config=cfg, now=5)
    assert isinstance(cc, Nscc)
    assert cc.config is cfg
    assert cc.cwnd == cfg.max_cwnd


def test_create_nscc_without_config() -> None:
    cc = create_cc("uet-1.0-nscc", mtu=1024)
    assert isinstance(cc, Nscc)
    assert cc.cwnd == cc.config.max_cwnd


def test_unknown_name_is_a_key_error_listing_known_names() -> None:
    with pytest.raises(KeyError) as info:
        create_cc("cubic", mtu=MTU)
    err = info.value
    assert isinstance(err, UnknownCcAlgorithm)
    assert err.name == "cubic"
    assert "uet-1.0-nscc" in err.known
    assert "none" in err.known
    assert "cubic" in str(err)
    assert "uet-1.0-nscc" in str(err)


@pytest.mark.parametrize(
    ("name", "config", "expected"),
    [
        ("uet-1.0-nscc", FixedWindowConfig(), "NsccConfig"),
        ("uet-1.0-nscc", {"base_rtt": 1}, "NsccConfig"),
        ("none", NsccConfig.defaults(100_000_000_000, 10_000, MTU), "FixedWindowConfig"),
    ],
)
def test_wrong_config_type_is_a_type_error_naming_the_expected_type(
    name: str, config: object, expected: str
) -> None:
    with pytest.raises(TypeError, match=expected):
        create_cc(name, mtu=MTU, config=config)


@pytest.mark.parametrize("mtu", [0, -1])
def test_bad_mtu(mtu: int) -> None:
    with pytest.raises(ValueError, match="mtu"):
        create_cc("none", mtu=mtu)


def test_none_is_unlimited_by_default() -> None:
    cc = create_cc("none", mtu=MTU)
    assert isinstance(cc, FixedWindow)
    assert cc.cwnd == UNLIMITED_CWND
    assert cc.can_send(1 << 40, MTU)


def test_none_fixed_window_ignores_every_signal() -> None:
    cc = create_cc("none", mtu=MTU, config=FixedWindowConfig(cwnd_bytes=10_000))
    assert cc.cwnd == 10_000
    assert cc.can_send(10_000 - MTU, MTU)
    assert not cc.can_send(10_000 - MTU + 1, MTU)
    cc.on_send(now=1, size=MTU, inflight=MTU)
    cc.on_ack(now=2, newly_acked=MTU, inflight=0, rtt_ns=10**9, ecn=True)
    cc.on_trim(now=3, size=MTU, inflight=0, last_hop=False)
    cc.on_loss(now=4, inflight=0)
    cc.on_receiver_state(now=5, rcv_cwnd_pen=0, restore=False)
    assert cc.cwnd == 10_000


@pytest.mark.parametrize("cwnd_bytes", [0, -5, True])
def test_fixed_window_config_validation(cwnd_bytes: int) -> None:
    with pytest.raises(ValueError, match="cwnd_bytes"):
        FixedWindowConfig(cwnd_bytes=cwnd_bytes)


def test_fixed_window_below_mtu_is_rejected() -> None:
    with pytest.raises(ValueError, match="cwnd_bytes"):
        FixedWindow(mtu=MTU, config=FixedWindowConfig(cwnd_bytes=MTU - 1))


def test_custom_algorithm_registration(aimd: type[Aimd]) -> None:
    assert "test-aimd" in cc_algorithms()
    cc = create_cc("test-aimd", mtu=MTU)
    assert isinstance(cc, aimd)
    assert cc.cwnd == 10 * MTU
    cc.on_ack(now=1, newly_acked=MTU, inflight=0, rtt_ns=None, ecn=False)
    assert cc.cwnd == 11 * MTU
    assert cc.can_send(10 * MTU, MTU)
    assert not cc.can_send(10 * MTU + 1, MTU)


def test_custom_algorithm_without_config_type_rejects_a_config(aimd: type[Aimd]) -> None:
    with pytest.raises(TypeError, match="test-aimd"):
        create_cc("test-aimd", mtu=MTU, config=FixedWindowConfig())


def test_register_is_a_decorator_and_idempotent() -> None:
    @register_cc
    class Custom(Aimd):
        name = "test-custom"

    try:
        assert register_cc(Custom) is Custom
        assert isinstance(create_cc("test-custom", mtu=MTU), Custom)
    finally:
        unregister_cc("test-custom")
    assert "test-custom" not in cc_algorithms()


def test_a_taken_name_cannot_be_reused(aimd: type[Aimd]) -> None:
    class Other(Aimd):
        pass

    with pytest.raises(ValueError, match="test-aimd"):
        register_cc(Other)
    with pytest.raises(ValueError, match="already registered"):
        register_cc(type("Impostor", (Aimd,), {"name": "uet-1.0-nscc"}))
    assert create_cc("uet-1.0-nscc", mtu=MTU).__class__ is Nscc


def test_register_rejects_non_algorithms() -> None:
    with pytest.raises(TypeError):
        register_cc(int)  # type: ignore[type-var]

    class Nameless(Aimd):
        pass

    Nameless.name = ""
    with pytest.raises(ValueError, match="name"):
        register_cc(Nameless)


def test_unregister_unknown_name() -> None:
    with pytest.raises(UnknownCcAlgorithm):
        unregister_cc("no-such-algorithm")


def test_interface_is_abstract() -> None:
    with pytest.raises(TypeError):
        CongestionControl(mtu=MTU)  # type: ignore[abstract]
