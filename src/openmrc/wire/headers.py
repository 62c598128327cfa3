"""One class per MRC 1.0 header, each with a precompiled `struct.Struct` layout.

Theory of operation
-------------------
Every header is a small ``__slots__`` dataclass whose fields carry the spec's names in snake_case. A header
knows its size, how to pull itself from a `Buffer` (one ``unpack_from`` call) and how to push itself (one
``pack`` call after a range check of every field). Reserved bits are written as zero and ignored on parse.

Each layout below is described once, as data, in ``_layouts.py`` (the values of its struct, the fields in
each with bit positions, types, defaults and spec names); ``python -m openmrc.wire._layouts`` generates the
classes from them into ``_headers_gen.py``, which this module re-exports. The generated code is what mypyc
compiles natively: typed attributes, a written-out ``__init__``, and per header a ``pull``, ``push`` and
``out_of_range`` that unpack, test and pack with direct expressions (no loop over the fields, no attribute
looked up by name), and name their class rather than ``cls``, so that a compiled build constructs natively.
`Header.check` walks the layout only to name the field that failed.

Layouts (byte offsets within the header, network byte order; ``[openmrc]`` marks a choice made where the
MRC 1.0 tables are not public, so that a correction is one line here and one in ``_layouts.py``):

* **BTH** (12): 0 opcode; 1 SE(7) M(6) Pad(5:4) TVer(3:0); 2-3 P_Key; 4 FECN(7) BECN(6) resv(5:0);
  5-7 DestQP; 8 A(7) resv(6) RTX(5) TS(4) resv(3:0); 9-11 PSN.
* **METH** (4): 0-1 RQMSN; 2-3 MSN.
* **TSETH** (4): 0-1 tx_timestamp; 2-3 TSR(15) resv(14:4) format_type(3:0).
  ``[openmrc]`` timestamp units: TSR=0 → 128 ns, TSR=1 → 1.024 µs (16-bit, wrapping).
* **RETH** (16): 0-7 VA; 8-11 R_Key; 12-15 DMA length (of the whole operation).
* **ImmDt** (4): 0-3 immediate data.
* **AETH** (4): 0 syndrome; 1-3 MSN.
* Extension headers (SETH, NETH, PETH, ERTH, EETH) open with two bytes "type/next". ``[openmrc]`` byte 0 is
  hdr_type(7:4) next_hdr(3:0); byte 1 holds the header's own flag bits, the rest of byte 1 is reserved.
* **SETH** (28): 0 type/next; 1 M(7:6) PR(5); 2-3 ack_psn_offset (signed, PSN of the triggering packet minus
  cack_psn); 4-7 entropy (EV echo); 8-9 src_qp; 10-11 dst_qp (low 16 bits of the QPNs);
  12 ``[openmrc]`` svc: the responder's service time, how long the triggering packet had been in its host
  when the SACK left (reserved in MRC 1.0, so 0 from a peer that does not fill it: nothing known), in the
  8-bit log scale of `service_time_code`; 13-15 cack_psn; 16 cc_type(7:4) cc_flags(3:0); 17 MPR (128-PSN
  units, 0 = not advertised);
  18-19 sack_offset (signed, bitmap base minus cack_psn); 20-27 bitmap (bit i, LSB first, = PSN base+i).
  ``[openmrc]`` bit order inside byte 1 and of the bitmap.
* **CC_STATE** (8, follows SETH): 0-1 ts_echo; 2-3 resv(15) ooo_count(14:0); 4 R_C(7) rcv_cwnd_pen(6:0);
  5-7 received bytes in 256-byte units (``rcvd_256b``).
* **NETH** (20): 0 type/next; 1 resv; 2 reason; 3 vendor_info; 4-7 entropy echo; 8-9 src_qp; 10-11 dst_qp;
  12 resv; 13-15 NACK PSN; 16 cc_type(7:4) cc_flags(3:0); 17 resv; 18-19 ts_echo.
* **PETH** (16): 0 type/next; 1 resv; 2 resv; 3 vendor_info; 4-5 probe_id; 6-7 resv; 8-9 src_qp;
  10-11 dst_qp; 12-13 tx_timestamp; 14-15 TSR(15) resv(14:4) format_type(3:0).
* **ERTH** (16): 0 type/next; 1 resv(7:2) op(1:0); 2 resv; 3 vendor_info; 4-7 port_status (bit N = port
  N+1 up); 8-11 resv; 12-13 tx_timestamp; 14-15 TSR(15) resv(14:4) format_type(3:0).
* **EETH** (36): 0 type/next; 1 resv(7:6) op(5:4) resv(3:0); 2 resv; 3 vendor_info; ``[openmrc]`` response
  body in 4-27: 4-7 service_time (ns the responder held the request), 8-11 port_status (responder's port
  mask, bit N = port N+1 up), 12 rx_port (1-based port the request arrived on), 13-27 resv;
  28-29 ts_echo (the request's tx_timestamp); 30-31 TSR(15) resv(14:4) format_type(3:0) of the echo;
  32-35 resv.
"""

from __future__ import annotations

from typing import Final

from openmrc.wire._header import Header, range_test
from openmrc.wire._headers_gen import (
    AETH,
    BTH,
    EETH,
    ERTH,
    METH,
    NETH,
    PETH,
    RETH,
    SETH,
    TSETH,
    CcState,
    ImmDt,
    make_bth,
)

__all__ = [
    "AETH",
    "BTH",
    "EETH",
    "ERTH",
    "METH",
    "NETH",
    "PETH",
    "RETH",
    "SETH",
    "TSETH",
    "CcState",
    "Header",
    "ImmDt",
    "make_bth",
    "range_test",
    "service_time_code",
    "service_time_ns",
]

_SVC_MANTISSA: Final = 5  # bits of a service time code's mantissa; the other 3 are its exponent
_SVC_MAX_US: Final = 31 << 14  # the largest service time a code says: 507,904 µs


def service_time_code(ns: int) -> int:
    """``ns`` of responder service time as SETH's 8-bit ``svc`` code ``e << 5 | m``, which means ``m << 2e``
    µs (exact to 31 µs, then 4, 16, 64, 256 µs, 1, 4, 16 ms steps, up to 0.5 s): rounded down, so that a
    requester never takes more out of an RTT sample than the responder spent; longer saturates."""
    us = ns // 1000
    if us <= 0:
        return 0
    if us >= _SVC_MAX_US:
        return 0xFF
    e = 0
    while us >> (2 * e) > 31:
        e += 1
    return e << _SVC_MANTISSA | us >> (2 * e)


def service_time_ns(code: int) -> int:
    """The service time (ns) an ``svc`` code stands for (`service_time_code`)."""
    return ((code & 31) << (2 * (code >> _SVC_MANTISSA))) * 1000
