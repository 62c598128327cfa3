"""Packet-level simulator: event engine, ports with ECN and trimming, SRv6 switches, hosts running the
real transport core."""
