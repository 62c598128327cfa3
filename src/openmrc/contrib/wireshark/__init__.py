"""Wireshark Lua dissector for MRC, shipped with the package.

Load it with ``wireshark -X lua_script:<DISSECTOR_PATH> capture.pcap`` (or tshark), or copy the file into
the personal Lua plugins folder. It decodes every MRC header on UDP port 4791 by default; the preference
``mrc.udp_port`` moves it (e.g. ``-o mrc.udp_port:4971``). Fields are named ``mrc.<header>.<field>`` after
the attributes of `openmrc.wire.headers`, plus ``mrc.imm``, ``mrc.payload`` and ``mrc.icrc``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DISSECTOR_PATH"]

#: The Lua dissector file (``mrc.lua``), installed next to this module.
DISSECTOR_PATH: Path = Path(__file__).resolve().parent / "mrc.lua"
