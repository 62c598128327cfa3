"""The fabric model: topologies, SRv6 uSID address plans and static tables, ECMP (no simulator inside)."""
