"""Wall time of `fabriclab run streaming-incident` (six phases), its BGP/failover times, each
phase's least idle second, and what a stream's programs cost, with real or synthetic media.

Usage: python bench/streaming_incident.py [--runs N] [--media real synthetic] [--json FILE]

A real stream's programs are its pusher (ffmpeg), its viewer (the lab's viewer and its
ffprobe) and its share of the nginx-rtmp servers; a synthetic one's are the lab's sender and
its share of a player. CPU per stream is in % of one core over the phase, from each
process's own counters (``programs_cpu`` of every phase in result.json).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from clirun import finish, run_scenario


def cpu_per_stream(r: dict[str, Any]) -> dict[str, float]:
    """% of a core per stream, averaged over the phases: senders, players, servers."""
    send = play = serve = secs = 0.0
    for d in r["phase_details"].values():
        c, n = d["programs_cpu"], d["programs_cpu"]["streams"]
        send += c["senders_s"] / n
        play += c["players_s"] / n
        serve += sum(c["servers_s"].values()) / n
        secs += d["duration_s"]
    k = 100 / (secs / len(r["phase_details"]))
    return {"sender_pct": round(k * send / len(r["phase_details"]), 2),
            "player_pct": round(k * play / len(r["phase_details"]), 2),
            "servers_pct": round(k * serve / len(r["phase_details"]), 2)}


def measure(media: str, wall: float, r: dict[str, Any]) -> dict[str, Any]:
    ph = r["metrics"]["phases"]
    return {"media": r["metrics"].get("media", "synthetic"), "asked": media,
            "wall_s": round(wall, 1), "routing_ready_s": r["timings"]["routing_ready_s"],
            "incident_stalls": ph["incident"]["stalls"],
            "fix_stalls": ph["fix-hash"]["stalls"] + ph["fix-placement"]["stalls"],
            "withdrawn_s": [ph[p]["failover"]["withdrawn_after_s"]
                            for p in ("failover-link", "failover-border")],
            "least_idle_pct": {n: d["cpu_idle_min_pct"] for n, d in r["phase_details"].items()},
            "cpu_idle_min_pct": r["fidelity"]["cpu_idle_min_pct"],
            "fidelity_valid": r["fidelity"]["valid"], "cpu_per_stream": cpu_per_stream(r)}


def show(row: dict[str, Any]) -> None:
    print(f"streaming-incident [{row['media']}]: {row['wall_s']:.1f} s wall, BGP multipath "
          f"ready in {row['routing_ready_s']:.2f} s, incident stalls {row['incident_stalls']}, "
          f"fix stalls {row['fix_stalls']}, route withdrawn after {row['withdrawn_s']} s, "
          f"least idle per phase {row['least_idle_pct']}, valid {row['fidelity_valid']}, "
          f"CPU per stream {row['cpu_per_stream']}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--media", nargs="*", default=["real", "synthetic"])
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for media in args.media:
            for i in range(args.runs):
                out = Path(tmp) / f"{media}-{i}"
                wall, r = run_scenario("streaming-incident", out, "--set",
                                       f"streams.media={media}")
                rows.append(measure(media, wall, r))
                show(rows[-1])
    summary = {m: statistics.median(r["wall_s"] for r in rows if r["asked"] == m)
               for m in args.media}
    return finish(args.json, {"runs": rows, "wall_s_median": summary}, True)


if __name__ == "__main__":
    sys.exit(main())
