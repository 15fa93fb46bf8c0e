"""Exercise: write a policy that ends the incident (skeleton).

Eight streams from one anchor (h1) to one media server (h3) cross four equal-cost uplinks.
This skeleton sends every flow out of the first candidate port: what an L3-only hash does to
flows that share their addresses. Run it and watch one uplink drop while three idle:

    sudo fabriclab run ecmp-one-pair --policy scenarios/ecmp-one-pair/exercises/end_the_incident.py

Then change ``choose`` so that the eight flows use all four uplinks, two each, on every seed.
Hints:
- ``flow`` is a FlowKey: src, dst, proto, sport, dport. Which of them differ between the
  eight flows?
- A hash of them (``hash5``) spreads them, but only like balls into bins: some seeds still
  leave an uplink idle. To be sure of 2/2/2/2 the policy must remember what it placed.
- The controller may ask about one flow more than once (its first packets can all reach the
  controller before the switch entry is installed). Answer the same port each time, or the
  flow's packets take two paths and arrive out of order.
Check yourself: ``sudo fabriclab regress --policy-file <your file> --scenarios ecmp-one-pair``.
A solution is in ../solutions/.
"""

from __future__ import annotations

from collections.abc import Sequence

from controllers.policies import FlowKey, HashPolicy

EXERCISE = "end-the-incident"     # `fabriclab grade` finds the exercise by this line


class EndTheIncident(HashPolicy):
    name = "end-the-incident"
    granularity = "flow"          # decided per 5-tuple, on each flow's first packet

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        # TODO: spread the flows over every port in `ports`.
        return ports[0]
