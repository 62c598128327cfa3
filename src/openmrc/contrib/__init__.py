"""Optional extras that ship with openmrc but are not part of the transport (e.g. a Wireshark dissector)."""
