"""Programs that run inside host namespaces. They import nothing of the lab outside this
package (the standard library, scapy, torch for the gloo rank, and each other), so what
runs in a host is small and its behaviour is its own.

The lab starts one as ``command(name, ...)``: one place says how an agent is invoked.
"""

from __future__ import annotations

import sys

#: The agents, by module name.
AGENTS = ("worker", "streamer", "rtmpview", "hlsview", "hlsjsview", "storage", "microburst",
          "probe", "udpwarm")


def command(name: str, *args: str) -> list[str]:
    """The argv that runs agent ``name`` with ``args`` under this interpreter."""
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r} (known: {', '.join(AGENTS)})")
    return [sys.executable, "-m", f"{__name__}.{name}", *args]
