"""The collective kind: GPUs waiting for the network, a synthetic data-parallel job phase by
phase on one fabric.

``plan`` checks the scenario and plans connections, ``run`` drives the job on the fabric,
``metrics`` turns the workers' records into nccl-tests-style numbers.
"""

from __future__ import annotations

from typing import Any

from lab.kinds.collective.metrics import phase_line
from lab.kinds.collective.plan import DEFAULTS, SCHEMA, plan
from lab.kinds.collective.runner import keep_logs, prepare, run

__all__ = ["DEFAULTS", "SCHEMA", "analyse", "keep_logs", "plan", "prepare", "run", "summary_rows"]


def analyse(result: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The job's metrics are made while it runs (per phase): nothing to add afterwards."""
    return result["metrics"]


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [(name, phase_line(mt)) for name, mt in result["metrics"]["phases"].items()]
    return rows + list((result["metrics"].get("phases_skipped") or {}).items())
