"""Packet-level simulator: event engine, ports with ECN and trimming, SRv6 switches, hosts running the
real transport core.

A process that imports the simulator keeps its small objects on transparent huge pages from then on
(`openmrc._native.huge_page_arenas`; ``OPENMRC_HUGE_PAGES=0`` leaves Python's allocator as it is)."""

from openmrc import _native

_native.huge_page_arenas()
