"""EV states (MRC spec notes §2; values from mrc_ctl.h ``mrc_ctl_ev_state``).

Theory of operation: every EV of a QP is in one state. GOOD EVs carry traffic. SKIP is internal to the
NIC: the EV sits out the rest of the current rotation (a SACK echo said the forward path saw ECN, or a
non-last-hop trim NACK) and is GOOD again when the rotation is reshuffled. ASSUMED_BAD EVs carry no data and
are probed in the background until a probe comes back clean. DENIED is set by the controller and never
recovers on its own. The controller never sees SKIP: it is reported as GOOD (`CONTROLLER_VISIBLE`).
The transitions themselves belong to the per-QP EV table, not to this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType

__all__ = ["CONTROLLER_VISIBLE", "EVENT_MASK_ALLOWED", "EVState", "controller_state"]


class EVState(IntEnum):
    """State of one EV. Values are the mrc_ctl.h bits, except the internal SKIP."""

    GOOD = 1 << 0
    """Usable for new packets."""
    ASSUMED_BAD = 1 << 1
    """Not used for data; probed in the background, back to GOOD when probes succeed."""
    DENIED = 1 << 2
    """Disabled by the controller; never recovers automatically."""
    SKIP = 1 << 8
    """Internal (openmrc value, outside the mrc_ctl.h bits): skip for the rest of the current rotation."""
    UNKNOWN = 1 << 31
    """Reported to the controller when the state cannot be determined."""


CONTROLLER_VISIBLE: Mapping[EVState, EVState] = MappingProxyType(
    {
        EVState.GOOD: EVState.GOOD,
        EVState.SKIP: EVState.GOOD,
        EVState.ASSUMED_BAD: EVState.ASSUMED_BAD,
        EVState.DENIED: EVState.DENIED,
        EVState.UNKNOWN: EVState.UNKNOWN,
    }
)
"""The state a controller query reports for each internal state (SKIP reads as GOOD)."""

EVENT_MASK_ALLOWED: int = EVState.GOOD | EVState.ASSUMED_BAD
"""The only bits an EV profile's ``event_mask`` may use (mrc_ctl.h ``ev_event_mask``)."""


def controller_state(state: EVState) -> EVState:
    """The controller-visible form of ``state``."""
    return CONTROLLER_VISIBLE[state]
