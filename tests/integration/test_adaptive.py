"""adaptive on real packets: ecmp-one-pair's 8 streams, hashed at arrival, then moved.

Seed 1's hash leaves one of the 4 uplinks empty and puts 3 streams on two others. The lab
hands the controller every queue sample; a port whose queue stayed above the threshold for
two samples loses one flow to the shortest queue. Checked against the run's own series:
every move left a port whose reported queue was above the threshold just before it, and the
uplinks end up more even than the hash alone would have them.
"""

from __future__ import annotations

from pathlib import Path

from controllers.policies.adaptive import Adaptive
from tests.integration.support import run_to

#: A move is installed after the sample that triggered it; the report's series may carry
#: that sample up to one period later than the controller saw it.
SLACK_S = 0.15


def test_flows_leave_a_queue_that_stays_hot(tmp_path: Path) -> None:
    r = run_to(tmp_path / "out", "ecmp-one-pair", "--policy", "adaptive")
    a = r["controller"]["adaptive"]
    assert a["samples_sent"] > 0 and a["samples_failed"] == 0, a
    assert a["moved"] >= 1 and len(a["moves"]) == a["moved"], a
    series = {(ln["node"], ln["port"]): ln["series"] for ln in r["links"]}
    for m in a["moves"]:
        s = series[(m["switch"], m["from"])]
        before = [q for t, q in zip(s["t"], s["queue_bytes"], strict=True)
                  if m["t"] - Adaptive.hold_samples * 0.1 - SLACK_S <= t <= m["t"] + SLACK_S]
        assert max(before, default=0) > a["threshold_bytes"], (m, before)
    mt = r["metrics"]
    print(mt["uplinks"], mt["imbalance"], mt["predicted"]["imbalance"], len(a["moves"]))
    assert mt["imbalance"] < mt["predicted"]["imbalance"], (mt["uplinks"], mt["predicted"])
