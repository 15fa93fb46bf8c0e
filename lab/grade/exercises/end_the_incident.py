"""ecmp-one-pair: write a policy that ends the incident (eight streams, four uplinks, 2/2/2/2)."""

from __future__ import annotations

from typing import Any

from lab.grade.exercise import Exercise, Outcome, one_path

MAX_IMBALANCE = 1.05          # max/mean bytes over the uplinks: TCP's noise, no more
MAX_SHORTFALL = 0.05          # goodput below what was offered


def checks(result: dict[str, Any]) -> list[Outcome]:
    mt = result["metrics"]
    per = [mt["flows_per_uplink"][k] for k in sorted(mt["flows_per_uplink"])]
    fair = len(result["flows"]) / len(per)
    return [
        Outcome("two streams per uplink", all(n == fair for n in per),
                "flows per uplink " + "/".join(str(n) for n in per),
                "a hash spreads only like balls into bins: count the streams you placed "
                "on each port and give the next one the least used"),
        one_path(result, "the controller may ask about one flow twice: remember your "
                         "decision and answer the same port"),
        Outcome("imbalance", mt["imbalance"] < MAX_IMBALANCE,
                f"max/mean uplink bytes {mt['imbalance']:.3f} (want < {MAX_IMBALANCE})",
                "count streams (destination and its port), not connections: the iperf3 "
                "control connections are connections too"),
        Outcome("goodput", mt["goodput_shortfall"] < MAX_SHORTFALL,
                f"{mt['aggregate_goodput_bps'] / 1e6:.1f} of {mt['offered_bps'] / 1e6:.1f} "
                f"Mbit/s (shortfall {mt['goodput_shortfall'] * 100:.1f}%, want < "
                f"{MAX_SHORTFALL * 100:.0f}%)",
                "a shortfall is a congested uplink: spread the streams"),
    ]


EXERCISE = Exercise(
    name="end-the-incident", lesson="ecmp-one-pair", file="end_the_incident.py",
    kind="policy", scenario="ecmp-one-pair", duration=3.0, checks=checks,
    probes=[("leaf1", [5, 6, 7, 8])],
    forbidden=("lab",))
