"""The streaming kind: the live-streaming incident, phase by phase, on one running edge network.

Moved into a package; the kind's interface is re-exported here.
"""

from __future__ import annotations

from lab.kinds.streaming.edgerun import (
    PHASES,
    SCHEMA,
    analyse,
    keep_logs,
    plan,
    run,
    summary_rows,
    wan_fidelity,
)

__all__ = ["PHASES", "SCHEMA", "analyse", "keep_logs", "plan", "run", "summary_rows",
           "wan_fidelity"]
