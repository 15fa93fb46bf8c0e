"""ecmp-polarisation: stop the aggregation tier from repeating the edge's choice."""

from __future__ import annotations

from typing import Any

from lab.grade.exercise import Exercise, Outcome, one_path


def _used(result: dict[str, Any], tier: str) -> tuple[int, int]:
    up = result["metrics"]["upward_links_used"][tier]
    return len(up["used"]), up["of"]


def checks(result: dict[str, Any]) -> list[Outcome]:
    core, core_of = _used(result, "agg->core")
    edge, edge_of = _used(result, "edge->agg")
    return [
        Outcome("core links used", core == core_of,
                f"agg->core links used {core} of {core_of}",
                "the aggregation switch computes the edge's hash again and so repeats its "
                "choice: give each tier (the switch name without its number) its own seed"),
        Outcome("edge uplinks used", edge == edge_of,
                f"edge->agg links used {edge} of {edge_of}",
                "keep hashing the 5-tuple at the edge"),
        one_path(result, "decide alike for one flow every time (no randomness, no state "
                         "that changes the answer)"),
    ]


EXERCISE = Exercise(
    name="anti-polarisation", lesson="ecmp-polarisation", file="anti_polarisation.py",
    kind="policy", scenario="ecmp-polarisation", duration=3.0, checks=checks,
    probes=[("edge1", [3, 4]), ("agg1", [3, 4])],
    forbidden=("lab", "controllers.policies.hash5_tier"))
