"""Ordering a list's fixed-width records by their first item, in C (the extension built from ``_order.c``)."""

from typing import Any

def order_records(records: list[Any], width: int) -> None: ...
