"""ECMP collisions: N elephant flows from one leaf's hosts to another leaf's, across S uplinks.

The offered load fits the source leaf's uplinks in total (``load`` < 1 of their capacity), so
with a perfect split nothing congests; only a hash collision - several elephants on one
uplink - does. The metrics put the measured split beside the balls-into-bins expectation.
"""

from __future__ import annotations

from lab.kinds.base import Kind, splits_anywhere
from lab.kinds.ecmp import metrics, plan, run

KIND = Kind(name="ecmp", schema=plan.SCHEMA, plan=plan.flows, run=run.on_fabric,
            summary_rows=metrics.summary_rows, regress_metrics=metrics.regress_metrics,
            cluster_refusal=splits_anywhere, predictions=metrics.predictions)
