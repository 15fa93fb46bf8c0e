"""Scenario kinds: the mechanism that turns a scenario's data into traffic and metrics.

Each kind is a package whose façade builds one ``lab.kinds.base.Kind`` (``KIND``): what it
provides, typed, with the optional hooks defaulted. ``get`` is the one way to find it.
"""

from __future__ import annotations

import importlib

from lab.kinds.base import Kind
from lab.model.errors import ScenarioError

KINDS = ("ecmp", "streaming", "collective", "roce")


def get(name: str) -> Kind:
    """The kind called ``name`` (as a scenario's ``kind:`` and a result's ``kind`` say it)."""
    if name not in KINDS:
        raise ScenarioError("kind", f"unknown scenario kind {name!r} (known: {', '.join(KINDS)})")
    kind = importlib.import_module(f"lab.kinds.{name}").KIND
    assert isinstance(kind, Kind) and kind.name == name, f"lab.kinds.{name}.KIND is not {name}"
    return kind
