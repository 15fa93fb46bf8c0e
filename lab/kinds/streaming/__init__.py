"""The live-streaming incident, phase by phase, on one running edge network.

Phases (``metrics.phases``, in this order):

* ``before-upgrade`` - the old uplinks (``before.uplink_bw``), half the media servers, the
  default L3 hash: every big stream from the origin to the main CDN node shares one uplink,
  and it fits.
* ``incident`` - uplinks upgraded (``topology.uplink_bw``), twice the servers, bigger
  streams, the same hash: the big streams still share one uplink, which now saturates,
  drops and stalls the viewers - while every interface and BGP session is up and the other
  uplinks idle.
* ``fix-hash`` - L4 hash (5-tuple) with a seed per router tier chosen by asking the
  kernel (``ip route get``) where each stream would go; different seeds per tier avoid
  polarisation (the same hash at two tiers sends all of a border's flows to one uplink).
* ``fix-placement`` - L3 hash as before, and a route controller pins each big stream to the
  least-loaded uplink by the rates measured in ``incident``.
* ``failover-link`` / ``failover-border`` - the ``fix-hash`` set-up with the busiest uplink,
  then a border router, cut silently mid-phase (BFD must notice) and restored later.

Mechanism lives in ``lab.net.edge`` (topology), ``lab.net.edgecontrol`` (hash, pinning, cuts),
``lab.measure.routerstats`` (router counters) and ``lab.agents.streamer`` (senders and players).

The package: ``plan`` (the scenario's keys, its phases and their streams), ``edgerun`` (the
running edge, driven phase by phase), ``runner`` (the run and the logs kept) and ``metrics``
(result.json and the lines ``fabriclab run`` prints).
"""

from __future__ import annotations

from typing import Any

from lab.kinds.streaming.metrics import analyse, summary_rows, wan_fidelity
from lab.kinds.streaming.plots import run_plots, section_plots
from lab.kinds.streaming.runner import keep_logs, run
from lab.kinds.streaming.streamplan import PHASES, SCHEMA, plan, topology_defaults

__all__ = ["PHASES", "SCHEMA", "analyse", "keep_logs", "plan", "regress_metrics", "run",
           "run_plots", "section_plots", "summary_rows", "topology_defaults", "wan_fidelity"]


def regress_metrics(result: dict[str, Any]) -> dict[str, float]:
    """Per phase: viewers' stalls and drops at the uplinks."""
    out = {}
    for name, mt in result["metrics"]["phases"].items():
        out[f"{name}.stalls"] = float(mt["stalls"])
        out[f"{name}.drops"] = float(sum(mt.get("uplink_drops", {}).values()))
    return out
