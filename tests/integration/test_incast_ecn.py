"""Incast with tail-drop vs ECN marking programmed by the controller, on real packets.

One `fabriclab run incast-ecn` (both phases, same load). The marker's own counter is not
taken on trust: a capture at the receiver must show the CE-marked segments, the receiver's
ECE echoes and the senders' CWR answers, and the UDP micro-bursts (crafted with scapy) must
arrive CE-marked from about K bytes into the queue on.
"""

from __future__ import annotations

import pytest

from lab.model.result import validate
from tests.integration.support import fabriclab, kill_9_mid_run, lab_leftovers, phase, run_to


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    return run_to(tmp_path_factory.mktemp("incast") / "run", "incast-ecn")


def test_result_is_sound(result):
    assert validate(result) == [], validate(result)
    assert result["fidelity"]["valid"], result["fidelity"]
    assert result["environment"]["ecn"] in ("tc-bpf", "red")
    for name in ("tail-drop", "ecn"):
        m = phase(result, name)
        assert m["errors"] == [] and m["steps"] == 29, (name, m["errors"], m["steps"])
        assert m["busbw_bps"] == m["algbw_bps"] > 0


def test_marking_cuts_retransmits_timeouts_and_queue_delay(result):
    td, ecn = phase(result, "tail-drop"), phase(result, "ecn")
    port = "leaf1-eth1"
    qt, qe = td["queues"][port], ecn["queues"][port]
    print(f"tail-drop: {td['retransmits']} retransmits, {td['tcp'].get('TCPTimeouts')} RTOs, "
          f"{qt['drops']} drops, queue delay p99 {qt['delay_ms']['p99']} ms, step p99 "
          f"{td['step_p99_s'] * 1000:.0f} ms | ecn: {ecn['retransmits']} retransmits, "
          f"{ecn['tcp'].get('TCPTimeouts')} RTOs, {qe['drops']} drops, {qe['ce_marked']} CE, "
          f"queue delay p99 {qe['delay_ms']['p99']} ms, step p99 "
          f"{ecn['step_p99_s'] * 1000:.0f} ms")
    assert ecn["marking"]["config"] == {"k_bytes": 30000}
    assert ecn["marking"]["ports"] == [port] and td["marking"]["ports"] == []
    # CE marks counted on the bottleneck port only, and only with marking on.
    assert qe["ce_marked"] > 0 and qt["ce_marked"] == 0
    assert sum(ln["ce_marked"] for ln in result["phase_details"]["ecn"]["links"]
               if ln["intf"] != port) == 0
    # Same load, fewer losses, shorter queue.
    assert qt["drops"] > 0
    assert ecn["retransmits"] < td["retransmits"] / 2
    assert ecn["tcp"].get("TCPTimeouts", 0) <= td["tcp"].get("TCPTimeouts", 0)
    assert qe["delay_ms"]["p99"] < qt["delay_ms"]["p99"]
    # ECN keeps the steps at the wire's pace: no step waits for a timeout, nine in ten within
    # 5 % of the ideal, and at most one of the 29 beyond 10 % (measured: none in six runs,
    # 240-244 ms p99 against 238, and none in two fresh clones since, the slowest step 0.6 %
    # and 1.9 % over; once in CI one step of about 280 ms with no timeout and the usual
    # retransmits, a single late step on a busy 2-core machine). Tail-drop's tail is
    # longer only when a retransmission timeout fires (287-372 ms in five runs of seven), so
    # the two tails are not compared: without a timeout they tie within a millisecond. The
    # p99 itself is a fidelity number: bench/collective.py and bench/fidelity_threshold.py.
    steps = sorted(s["step_s"] for s in ecn["step_series"] if not s["warmup"])
    assert steps[int(0.9 * (len(steps) - 1))] <= ecn["ideal_comm_s"] * 1.05, steps
    assert sum(s > ecn["ideal_comm_s"] * 1.1 for s in steps) <= 1, steps


def test_ce_ece_cwr_are_on_the_wire(result):
    td, ecn = phase(result, "tail-drop")["wire"], phase(result, "ecn")["wire"]
    senders = phase(result, "ecn")["workers"] - 1
    # Every connection negotiated ECN (SYN with ECE+CWR, SYN-ACK with ECE) in both phases.
    assert ecn["tcp"]["ecn_syn"] == senders and ecn["tcp"]["ecn_synack"] == senders
    assert td["tcp"]["ecn_syn"] == senders
    assert td["ecn"]["ce"] == 0
    assert ecn["ecn"]["ce"] > 0 and ecn["tcp"]["ece"] > 0 and ecn["tcp"]["cwr"] > 0
    marked = phase(result, "ecn")["queues"]["leaf1-eth1"]
    # The marker marks before the queue; a marked packet the queue then dropped never
    # reaches the wire at the receiver.
    assert marked["ce_marked"] - marked["drops"] <= ecn["ecn"]["ce"] <= marked["ce_marked"]
    for fid, f in ecn["flows"].items():
        if fid.startswith("s"):
            assert f["forward"]["ecn"]["ce"] > 0 and f["reverse"]["tcp"]["ece"] > 0, fid


def test_udp_microbursts_are_marked_from_about_k_bytes(result):
    mb = phase(result, "ecn")["microburst"]
    size = result["params"]["microburst"]["size"]
    k = phase(result, "ecn")["marking"]["config"]["k_bytes"]
    recv = mb["recv"]
    assert recv["received"] > 0 and recv["ce"] > 0
    first = min(p for b in recv["bursts"] for p in b["ce_arrival_positions"])
    # Marking starts once about K bytes queue (the port drains a little during the burst).
    assert first >= 0.5 * k / (size + 42), first
    assert phase(result, "tail-drop")["microburst"]["recv"]["ce"] == 0


def test_marking_on_a_port_that_does_not_exist_starts_nothing():
    r = fabriclab("run", "incast-ecn", "--set", "ecn.ports=[leaf9-eth3]", check=False)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("fabriclab: error: ecn.ports:")
    assert not any(lab_leftovers().values())


def test_kill_9_mid_job_then_clean_leaves_nothing(tmp_path):
    """Workers, capture and the marker's programs all go: by record, by PID."""
    kill_9_mid_run(["incast-ecn", "--set", "phases.tail-drop.job.steps=200",
                    "--out", str(tmp_path / "killed")],
                   lambda what: "incast sender" in what, settle_s=1.0)
