"""flowlet on real packets: a flow that pauses for longer than the idle timeout may move.

One UDP 5-tuple from h1 to h3 (ecmp-one-pair: 4 spines) sends 6 bursts of 0.3 s with 2.5 s
pauses. Each pause outlives the flow entry's 1 s idle timeout, so the next burst comes back
to the controller as a new flowlet and is hashed again; the per-flow counters at the spines
show it crossing more than one. Under ``hash5`` the same bursts stay on one spine: a pause
changes nothing for a hash.
"""

from __future__ import annotations

import pytest

from tests.integration.support import spine_bytes_on_one_pair

BURSTS, BURST_S, PAUSE_S = 6, 0.3, 2.5
SPORT, DPORT, COOKIE = 41000, 6000, 0xFAB1_0000_0000_0001
SENDER = (
    "import socket, time\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    f"s.bind(('{{src}}', {SPORT}))\n"
    f"for b in range({BURSTS}):\n"
    f"    end = time.monotonic() + {BURST_S}\n"
    "    while time.monotonic() < end:\n"
    f"        s.sendto(b'x' * 1000, ('{{dst}}', {DPORT}))\n"
    "        time.sleep(0.002)\n"
    f"    time.sleep({PAUSE_S})\n"
)


@pytest.mark.parametrize("policy", ["flowlet", "hash5"])
def test_a_pause_longer_than_the_idle_timeout_starts_a_new_flowlet(policy: str) -> None:
    counted, decisions = spine_bytes_on_one_pair(policy, [(COOKIE, SPORT, DPORT)], SENDER,
                                                 timeout=BURSTS * (BURST_S + PAUSE_S) + 20)
    per_spine = counted[COOKIE]
    used = [sw for sw, b in per_spine.items() if b > 0]
    print(f"{policy}: bytes per spine {per_spine}, {decisions} controller decisions")
    assert sum(per_spine.values()) > BURSTS * 100_000        # every burst crossed a spine
    if policy == "flowlet":
        assert len(used) >= 2, per_spine      # seed 1: the 6 flowlets hash to several spines
        assert decisions >= BURSTS            # a new decision at leaf1 for every burst
    else:
        assert len(used) == 1, per_spine      # same 5-tuple, same hash, same spine
