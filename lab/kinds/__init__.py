"""Scenario kinds: the mechanism that turns a scenario's data into traffic and metrics.

A kind module provides ``SCHEMA`` (its scenario keys), ``plan(topo_desc, params, rng)``
returning the flows to run, and ``analyse(result, params)`` returning ``metrics``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from lab.model.errors import ScenarioError

KINDS = ("ecmp", "streaming", "collective")


def get(name: str) -> ModuleType:
    if name not in KINDS:
        raise ScenarioError("kind", f"unknown scenario kind {name!r} (known: {', '.join(KINDS)})")
    return importlib.import_module(f"lab.kinds.{name}")
