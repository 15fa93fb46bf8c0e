"""Registry of hash policies: every ``HashPolicy`` subclass in this package's modules.

Adding a policy is adding a module here; nothing else has to be told about it (the lab's
``--policy all`` and its error messages come from ``available()``).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from controllers.policies.base import GRANULARITIES, FlowKey, HashPolicy

__all__ = ["FlowKey", "HashPolicy", "UnknownPolicy", "available", "get"]


class UnknownPolicy(ValueError):  # noqa: N818 - the lab's API name
    """A policy name that no module of this package defines."""


def _discover() -> dict[str, type[HashPolicy]]:
    found: dict[str, type[HashPolicy]] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if not issubclass(cls, HashPolicy) or cls is HashPolicy or not cls.name:
                continue
            if cls.__module__ != module.__name__:
                continue                      # imported from elsewhere, counted there
            if cls.granularity not in GRANULARITIES:
                raise TypeError(f"policy {cls.name!r} ({cls.__module__}): granularity "
                                f"{cls.granularity!r} is not one of {GRANULARITIES}")
            other = found.get(cls.name)
            if other is not None and other is not cls:
                raise TypeError(f"policy name {cls.name!r} is defined twice: "
                                f"{other.__module__} and {cls.__module__}")
            found[cls.name] = cls
    return found


_REGISTRY: dict[str, type[HashPolicy]] | None = None


def _registry() -> dict[str, type[HashPolicy]]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _discover()
    return _REGISTRY


def available() -> list[str]:
    """The known policy names, sorted."""
    return sorted(_registry())


def get(name: str) -> type[HashPolicy]:
    """The policy class called ``name``; ``UnknownPolicy`` names the field and the choices."""
    try:
        return _registry()[name]
    except (KeyError, TypeError):
        raise UnknownPolicy(f"policy: unknown policy {name!r} "
                            f"(known: {', '.join(available())})") from None
