"""least-loaded on real packets: a new flow avoids the uplink that *measures* busy.

On ecmp-one-pair (h1 -> h3 over 4 uplinks of 50 Mbit/s) UDP flows start 1.2 s apart, long
enough for the controller's port statistics (every 0.5 s) to show what runs: first an
elephant A at 40 Mbit/s, then three mice of 1 Mbit/s (which, one flow each, fill the other
three uplinks by count), then four 8 Mbit/s flows. Counting flows, every uplink looks alike
when they arrive; measuring bytes, A's uplink is the busy one. So no later flow may join A.
The same test with the measurements switched off (a subclass with
``port_stats_interval = 0``: it only counts what it placed) must put one of the four on A's
uplink (four flows, four equally counted uplinks): that is what shows the measurements, not
the counting, made the difference.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.support import spine_bytes_on_one_pair

#: (start s, seconds, rate bit/s) per flow; A first, then mice, then the late flows.
SCHEDULE = [(0.0, 10.8, 40e6), (1.2, 9.6, 1e6), (2.4, 8.4, 1e6), (3.6, 7.2, 1e6),
            (4.8, 6.0, 8e6), (6.0, 4.8, 8e6), (7.2, 3.6, 8e6), (8.4, 2.4, 8e6)]
FLOWS = [(0xFAB2_0000_0000_0000 + i, 42000 + i, 6100 + i) for i in range(len(SCHEDULE))]
SIZE = 1400
SENDER = (
    "import socket, threading, time\n"
    "def send(sport, dport, start, secs, rate):\n"
    "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "    s.bind(('{src}', sport))\n"
    "    time.sleep(start)\n"
    f"    gap, t = {SIZE * 8} / rate, time.monotonic()\n"
    "    end = t + secs\n"
    "    while t < end:\n"
    f"        s.sendto(b'x' * {SIZE}, ('{{dst}}', dport))\n"
    "        t += gap\n"
    "        time.sleep(max(0.0, t - time.monotonic()))\n"
    "ts = [threading.Thread(target=send, args=a) for a in "
    + repr([(sp, dp, *sch) for (_, sp, dp), sch in zip(FLOWS, SCHEDULE, strict=True)])
    + "]\n"
    "for t in ts: t.start()\n"
    "for t in ts: t.join()\n"
)
COUNT_ONLY = '''
from controllers.policies.least_loaded import LeastLoaded


class CountOnly(LeastLoaded):
    """least-loaded without measurements: only what it placed itself counts."""
    name = "count-only"
    port_stats_interval = 0.0
'''


def spines(policy: str) -> dict[int, str]:
    counted, _ = spine_bytes_on_one_pair(policy, FLOWS, SENDER, timeout=40)
    spine_of = {}
    for cookie, per_spine in counted.items():
        used = [sw for sw, b in per_spine.items() if b > 0]
        assert len(used) == 1, per_spine      # one path per flow: decisions stick
        spine_of[cookie] = used[0]
    return spine_of


@pytest.mark.parametrize("measured", [True, False], ids=["measured", "count-only"])
def test_late_flows_avoid_the_measured_elephant(measured: bool, tmp_path: Path) -> None:
    policy = "least-loaded"
    if not measured:
        (tmp_path / "count_only.py").write_text(COUNT_ONLY)
        policy = str(tmp_path / "count_only.py")
    spine_of = spines(policy)
    order = [spine_of[c] for c, _, _ in FLOWS]
    print(f"{'measured' if measured else 'count-only'}: A on {order[0]}, mice on {order[1:4]}, "
          f"late flows on {order[4:]}")
    assert len(set(order[:4])) == 4           # by count alone, A and the mice spread out
    if measured:
        assert order[0] not in order[4:], order
    else:
        assert order[0] in order[4:], order   # blind to bytes, it joins the elephant
