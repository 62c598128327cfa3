"""Entropy values (EVs): format profiles, EV profiles, expansion, generation, states and packet fields."""

from openmrc.ev.fields import EVFields, ev_echo32, packet_fields, srv6_fields, stev_fields, udp_sport
from openmrc.ev.profile import (
    EV_FIELD_MAX_BITS,
    EV_MAX_BYTES,
    EVConfigError,
    EVField,
    EVFormatMode,
    EVFormatProfile,
    EVProfile,
    EVProfileMode,
)
from openmrc.ev.state import CONTROLLER_VISIBLE, EVENT_MASK_ALLOWED, EVState, controller_state

__all__ = [
    "CONTROLLER_VISIBLE",
    "EVENT_MASK_ALLOWED",
    "EV_FIELD_MAX_BITS",
    "EV_MAX_BYTES",
    "EVConfigError",
    "EVField",
    "EVFields",
    "EVFormatMode",
    "EVFormatProfile",
    "EVProfile",
    "EVProfileMode",
    "EVState",
    "controller_state",
    "ev_echo32",
    "packet_fields",
    "srv6_fields",
    "stev_fields",
    "udp_sport",
]
