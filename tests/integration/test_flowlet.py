"""flowlet on real packets: a flow that pauses for longer than the idle timeout may move.

One UDP 5-tuple from h1 to h3 (ecmp-one-pair: 4 spines) sends 6 bursts of 0.3 s with 2.5 s
pauses. Each pause outlives the flow entry's 1 s idle timeout, so the next burst comes back
to the controller as a new flowlet and is hashed again; the per-flow counters at the spines
show it crossing more than one. Under ``hash5`` the same bursts stay on one spine: a pause
changes nothing for a hash.
"""

from __future__ import annotations

import pytest

from lab import run, telemetry

BURSTS, BURST_S, PAUSE_S = 6, 0.3, 2.5
SPORT, DPORT, COOKIE = 41000, 6000, 0xFAB1_0000_0000_0001
SENDER = (
    "import socket, time\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "s.bind(('{src}', {sport}))\n"
    "for b in range({bursts}):\n"
    "    end = time.monotonic() + {burst}\n"
    "    while time.monotonic() < end:\n"
    "        s.sendto(b'x' * 1000, ('{dst}', {dport}))\n"
    "        time.sleep(0.002)\n"
    "    time.sleep({pause})\n"
)


def spines_crossed(policy: str) -> tuple[dict[str, int], int]:
    """Bytes of the on/off flow counted at each spine, and the controller's decisions."""
    (plan,) = run.make_plans("ecmp-one-pair", policy=policy, seed=1)
    hosts = {h["name"]: h["ip"] for h in plan.topo_desc["hosts"]}
    src, dst = hosts["h1"], hosts["h3"]
    with run.fabric_session(f"flowlet-test-{policy}", plan.topology(), plan.env, plan.runtime,
                            plan.policy, 1) as fabric:
        run.bring_up(plan, fabric, print)
        assert fabric.controller is not None
        fabric.controller.request({"cmd": "watch", "flows": [
            {"cookie": COOKIE, "proto": 17, "src": src, "dst": dst, "sport": SPORT,
             "dport": DPORT}]})
        before = fabric.controller.request({"cmd": "status"})["decisions"]
        code = SENDER.format(src=src, dst=dst, sport=SPORT, dport=DPORT, bursts=BURSTS,
                             burst=BURST_S, pause=PAUSE_S)
        proc = fabric.host("h1").popen(["python3", "-c", code])
        fabric.record.add_pid(proc.pid, "flowlet test sender")
        assert proc.wait(timeout=BURSTS * (BURST_S + PAUSE_S) + 20) == 0
        decisions = fabric.controller.request({"cmd": "status"})["decisions"] - before
        spines = [s["name"] for s in plan.topo_desc["switches"] if s["role"] == "spine"]
        counted = {sw: telemetry.flow_counters(sw).get(COOKIE, (0, 0))[1] for sw in spines}
    return counted, decisions


@pytest.mark.parametrize("policy", ["flowlet", "hash5"])
def test_a_pause_longer_than_the_idle_timeout_starts_a_new_flowlet(policy: str) -> None:
    counted, decisions = spines_crossed(policy)
    used = [sw for sw, b in counted.items() if b > 0]
    print(f"{policy}: bytes per spine {counted}, {decisions} controller decisions")
    assert sum(counted.values()) > BURSTS * 100_000          # every burst crossed a spine
    if policy == "flowlet":
        assert len(used) >= 2, counted        # seed 1: the 6 flowlets hash to several spines
        assert decisions >= BURSTS            # a new decision at leaf1 for every burst
    else:
        assert len(used) == 1, counted        # same 5-tuple, same hash, same spine
