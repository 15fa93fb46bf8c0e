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

The streams are real media where ffmpeg and nginx-rtmp are installed (``media``: the cached
clip, the nginx-rtmp servers, the pushers; the viewers are ``lab.agents.rtmpview``,
``hlsview`` and ``hlsjsview``), else the lab's own sender and player (``streams.media``).

The package: ``plan`` (the scenario's keys, its phases and their streams), ``run`` (the
edge brought up and driven phase by phase: ``setup`` sets a phase's routing, ``programs``
starts its players and senders, ``failover`` cuts and restores), ``metrics`` (the kind's
part of result.json, the lines ``fabriclab run`` prints, what regress holds a policy to)
and ``plots`` (stalls per phase and over time).
"""

from __future__ import annotations

from lab.kinds.base import Kind
from lab.kinds.streaming import metrics, plan, plots, run

KIND = Kind(name="streaming", schema=plan.SCHEMA, plan=plan.streams, run=run.on_fabric,
            summary_rows=metrics.summary_rows, regress_metrics=metrics.regress_metrics,
            topology_defaults=plan.topology_defaults, prepare=run.prepare,
            keep_logs=run.keep_logs, warnings=plan.warnings,
            run_plots=plots.run_plots, section_plots=plots.section_plots)
