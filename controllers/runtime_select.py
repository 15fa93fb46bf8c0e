"""Which controller runtime to use, decided without importing it.

Separate from ``controllers.runtime`` (which imports the whole Ryu API) so that the
launcher can patch the runtime's hub *before* anything else of it is imported: eventlet's
``monkey_patch`` walks every lock that already exists and runs a full ``gc.collect()`` for
each, which after importing all of Ryu costs ~1.5 s of start-up and only ~0.8 s before.
"""

from __future__ import annotations

import importlib.util
import os

RUNTIME_ENV = "FABRICLAB_RUNTIME"
#: Runtime name (as the lab and the config say it) -> Python package.
RUNTIMES = {"os-ken": "os_ken", "ryu": "ryu"}


class RuntimeUnavailableError(ImportError):
    """The runtime asked for is unknown or not installed in this interpreter."""


def pick() -> str:
    """``FABRICLAB_RUNTIME`` if set, else os-ken when importable (maintained), else Ryu."""
    wanted = os.environ.get(RUNTIME_ENV, "").strip()
    if wanted:
        if wanted not in RUNTIMES:
            raise RuntimeUnavailableError(f"{RUNTIME_ENV}={wanted!r}: unknown runtime "
                                          f"(known: {', '.join(RUNTIMES)})")
        return wanted
    return "os-ken" if importlib.util.find_spec("os_ken") is not None else "ryu"


def package(name: str) -> str:
    """The package of runtime ``name``, refusing one this interpreter does not have."""
    pkg = RUNTIMES[name]
    if importlib.util.find_spec(pkg) is None:
        raise RuntimeUnavailableError(f"controller runtime {name} ({pkg}) is not installed "
                                      "for this interpreter")
    return pkg
