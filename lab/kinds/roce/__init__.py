"""The roce kind: RoCEv2 queue pairs on a fabric with a lossless class, phase by phase -
PFC's pauses and where they spread, ECN with DCQCN, and a lossy fabric's go-back-N.

The package: ``plan`` (the scenario's keys, the QPs, every check before anything starts),
``run`` (classes on the ports, then per phase marking, PFC, the transport's programs and one
measurement window) and ``metrics`` (per group goodput and a NIC's counters, per class drops,
the pause tree, the lines ``fabriclab run`` prints, what regress holds a policy to).
"""

from __future__ import annotations

from lab.kinds.base import Kind
from lab.kinds.roce import metrics, plan, plots, run

KIND = Kind(name="roce", schema=plan.SCHEMA, plan=plan.flows, run=run.on_fabric,
            summary_rows=metrics.summary_rows, regress_metrics=metrics.regress_metrics,
            defaults=plan.DEFAULTS, prepare=run.prepare,
            run_plots=plots.run_plots, section_plots=plots.section_plots,
            predictions=metrics.predictions)
