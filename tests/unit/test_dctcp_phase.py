"""DCTCP's K, the dctcp phase's checks and when a phase is skipped, without a network."""

from __future__ import annotations

import pytest

from controllers.marking import DCTCP_K_FLOOR_BYTES, dctcp_k_bytes
from lab import run
from lab.kinds.collective import plan as kind
from lab.kinds.collective.setup import parse_ping_min_ms
from lab.model.errors import MachineError, ScenarioError


@pytest.mark.parametrize("rate_bps, rtt_s, k", [
    (10e9, 100e-6, 17_858),     # the paper's 10 Gbit/s, 100 us: > 12 packets of 1500 B
    (1e9, 1e-3, 17_858),        # 125 MB/s x 1 ms / 7 = 17857.14 -> the next byte up
    (50e6, 7e-3, 6_251),        # 6.25 MB/s x 7 ms / 7 = 6250 exactly: K must exceed it
    (50e6, 0.5e-3, DCTCP_K_FLOOR_BYTES),   # 446 B: below one frame, the floor
])
def test_k_is_the_smallest_whole_byte_above_c_rtt_over_7(rate_bps, rtt_s, k):
    got, why = dctcp_k_bytes(rate_bps, rtt_s)
    assert got == k and why["k_bytes"] == k
    assert got > rate_bps / 8 * rtt_s / 7
    assert why["rtt_ms"] == pytest.approx(rtt_s * 1000) and "C*RTT/7" in why["rule"]


@pytest.mark.parametrize("rate_bps, rtt_s, field", [
    (0, 1e-3, "rate_bps"), (-1e6, 1e-3, "rate_bps"), (float("inf"), 1e-3, "rate_bps"),
    (True, 1e-3, "rate_bps"), (1e6, 0, "rtt_s"), (1e6, float("nan"), "rtt_s"),
    (1e6, "1ms", "rtt_s"),
])
def test_k_refuses_impossible_inputs_naming_them(rate_bps, rtt_s, field):
    with pytest.raises(ValueError) as exc:
        dctcp_k_bytes(rate_bps, rtt_s)
    assert str(exc.value).startswith(f"{field}:")


def test_ping_summary_is_parsed_for_its_minimum():
    out = ("PING 10.0.0.5 (10.0.0.5) 56(84) bytes of data.\n\n--- 10.0.0.5 ping statistics ---\n"
           "10 packets transmitted, 10 received, 0% packet loss, time 460ms\n"
           "rtt min/avg/max/mdev = 0.081/0.142/0.377/0.081 ms\n")
    assert parse_ping_min_ms(out) == pytest.approx(0.081)
    lost = ("--- 10.0.0.5 ping statistics ---\n"
            "10 packets transmitted, 0 received, 100% packet loss, time 9200ms\n")
    assert parse_ping_min_ms(lost) is None


def test_incast_ecn_has_a_dctcp_phase_by_the_rule():
    plan = run.make_plans("incast-ecn")[0]
    pp = kind.check(plan.params, plan.topo_desc)
    assert list(pp) == ["tail-drop", "ecn", "dctcp"]
    assert pp["dctcp"]["job"]["cc"] == "dctcp"
    assert pp["dctcp"]["ecn"]["marking"] == "step" and pp["dctcp"]["ecn"]["k_rule"] == "dctcp"
    assert pp["ecn"]["ecn"]["k_rule"] == "fixed"


def test_the_dctcp_rule_needs_step_marking():
    with pytest.raises(ScenarioError) as exc:
        run.make_plans("incast-ecn", sets=["phases.dctcp.ecn.marking=red"])
    assert exc.value.field == "phases.dctcp.ecn.k_rule"


def _phases(**params):
    plan = run.make_plans("incast-ecn")[0]
    merged = {**plan.params, **params}
    return merged, kind.check(merged, plan.topo_desc)


def test_a_phase_asking_for_a_missing_cc_is_skipped_with_the_reason():
    params, pp = _phases()
    skip = kind.phases_to_skip(params, pp, ["reno", "cubic", "bbr"])
    assert list(skip) == ["dctcp"] and "no dctcp" in skip["dctcp"]
    assert kind.phases_to_skip(params, pp, ["reno", "cubic", "dctcp"]) == {}


def test_a_missing_cc_the_scenario_itself_asks_for_is_an_error():
    params, pp = _phases(job={**run.make_plans("incast-ecn")[0].params["job"], "cc": "reno"})
    with pytest.raises(MachineError) as exc:
        kind.phases_to_skip(params, pp, ["cubic", "dctcp"])
    assert exc.value.field == "job.cc"


def test_no_phase_left_to_run_is_an_error():
    params, pp = _phases(phases={"only": {"job": {"cc": "dctcp"}}})
    with pytest.raises(MachineError) as exc:
        kind.phases_to_skip(params, pp, ["cubic"])
    assert exc.value.field == "phases.only.job.cc"
