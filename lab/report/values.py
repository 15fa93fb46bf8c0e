"""Values formatted once, for the HTML tables and the terminal alike."""

from __future__ import annotations

from typing import Any

from lab.plotting.sections import num


def _base_key(key: str) -> str:
    """The last part of a dotted key, without a note such as `` (sum)``."""
    return key.rsplit(".", 1)[-1].split(" (", 1)[0]


def _unit_of(key: str) -> str:
    k = _base_key(key)
    for suffix, unit in (("_bps", "Mbit/s"), ("_mbps", "Mbit/s"), ("_pct", "%"),
                         ("_ms", "ms"), ("_s", "s"), ("_bytes", "B")):
        if k.endswith(suffix):
            return unit
    return ""


def format_value(key: str, v: Any, signed: bool = False) -> str:
    """One value as a person reads it: units from the key's suffix, lists summarised."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | float):
        unit = _unit_of(key)
        x = float(v) / 1e6 if unit == "Mbit/s" and _base_key(key).endswith("_bps") \
            else float(v)
        sign = "+" if signed else ""
        if isinstance(v, int) and unit != "Mbit/s":
            text = f"{v:{sign},}"
        elif unit == "Mbit/s":
            text = f"{x:{sign}.2f}"
        else:
            text = f"{x:{sign}.4g}"
        return f"{text} {unit}" if unit else text
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        if not v:
            return "none"
        if all(num(x) is not None for x in v) and len(v) > 8:
            return f"{len(v)} values, {min(v):.4g} … {max(v):.4g}"
        if all(not isinstance(x, dict | list) for x in v):
            return ", ".join(format_value("", x) for x in v) if len(v) <= 12 \
                else f"{len(v)} items: " + ", ".join(str(x) for x in v[:6]) + ", …"
        return "; ".join(_compact(x) for x in v)
    if isinstance(v, dict):
        return _compact(v) if v else "none"
    return str(v)


def _compact(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_compact(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(_compact(x) for x in v) + "]"
    return format_value("", v)


def flatten(obj: dict[str, Any], prefix: str = "", depth: int = 2) -> list[tuple[str, Any]]:
    """Nested mappings as dotted keys, ``depth`` levels deep; deeper ones stay whole."""
    rows: list[tuple[str, Any]] = []
    for k, v in obj.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v and depth > 0:
            rows += flatten(v, key, depth - 1)
        else:
            rows.append((key, v))
    return rows
