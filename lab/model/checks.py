"""Validators shared by everything that reads user input: each names the field it checks."""

from __future__ import annotations

from lab.model.errors import TopologyError


def check_int(field: str, value: object, lo: int, hi: int) -> int:
    """``value`` as an int in ``lo..hi``, else a TopologyError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TopologyError(field, f"expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise TopologyError(field, f"{value} is out of range ({lo}..{hi})")
    return value
