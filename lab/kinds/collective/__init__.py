"""The collective kind: GPUs waiting for the network, a synthetic or PyTorch (gloo)
data-parallel job phase by phase on one fabric.

The package: ``plan`` (the scenario's keys and their checks, placement, connections, the
machine checks of ``prepare``), ``run`` (the job driven phase by phase: ``setup`` sets a
phase's network, ``programs`` starts its programs, ``readout`` reads its counters;
``gloo`` finds gloo's own connections), ``metrics`` (nccl-tests-style numbers, the kind's
part of result.json, the lines ``fabriclab run`` prints, what regress holds a policy to)
and ``plots`` (step times, a sweep's busbw, a DDP step).
"""

from __future__ import annotations

from lab.kinds.base import Kind
from lab.kinds.collective import causes, metrics, plan, plots, run

KIND = Kind(name="collective", schema=plan.SCHEMA, plan=plan.flows, run=run.on_fabric,
            summary_rows=metrics.summary_rows, regress_metrics=metrics.regress_metrics,
            defaults=plan.DEFAULTS, prepare=plan.prepare, keep_logs=run.keep_logs,
            run_plots=plots.run_plots, warnings=causes.warnings,
            cluster_refusal=plan.cluster_refusal)
