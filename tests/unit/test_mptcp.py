"""MPTCP flows: the path manager's set-up per host, subflows found in ``ss`` and grouped by
their connection, iperf3 made MPTCP, the scenario's refusals, and the prediction's split."""

from __future__ import annotations

import random

import pytest

from lab import kinds
from lab.analysis import predict
from lab.model import scenario
from lab.model.errors import MachineError, ScenarioError
from lab.model.flows import FlowSpec
from lab.net.topologies import describe, make_topology
from lab.workloads import mptcp
from lab.workloads.traffic import _iperf_client_cmd, _iperf_server_cmd

# ``ss -tniH state established`` in a sender's namespace (abridged from a run): the data
# connection's first subflow (sport 40001, token 999886bc) and two joined ones, then the
# control connection's first subflow and one joined (token 9b7ece60). With a state filter,
# ss leaves the State column out.
SS = """\
0      310072 10.0.0.1:40001 10.0.0.3:5201
\t bbr wscale:9,9 rto:204 tcp-ulp-mptcp flags:Mmec token:0000(id:0)/999886bc(id:0) seq:1
0      0      10.0.0.1:61385 10.0.0.3:5201
\t bbr wscale:9,9 tcp-ulp-mptcp flags:Mmec token:0000(id:0)/9b7ece60(id:0) seq:ad
0      393016 10.0.0.1:63073 10.0.0.3:5102
\t bbr tcp-ulp-mptcp flags:Jjec token:b267143b(id:0)/999886bc(id:0) seq:12 sfseq:0
0      0      10.0.0.1:62055 10.0.0.3:5101
\t bbr tcp-ulp-mptcp flags:Jjec token:fece0ce4(id:0)/9b7ece60(id:0) seq:ad sfseq:0
0      262944 10.0.0.1:64787 10.0.0.3:5101
\t bbr tcp-ulp-mptcp flags:Jjec token:b267143b(id:0)/999886bc(id:0) seq:12 sfseq:0
0      0      10.0.0.1:5000 10.0.0.9:22
\t cubic wscale:7,7 rto:204
"""


def flow(subflows: int = 3, **kw) -> FlowSpec:
    base = dict(id="f1", src="h1", dst="h3", src_ip="10.0.0.1", dst_ip="10.0.0.3",
                proto="tcp", sport=40001, dport=5201, rate_bps=20e6, cc="cubic",
                subflows=subflows)
    return FlowSpec(**{**base, **kw})


def test_subflows_are_grouped_by_their_connections_token():
    found = mptcp.parse_subflows(SS)
    assert len(found) == 5                        # the plain TCP socket is not a subflow
    subs = mptcp.joined(flow(), found)
    assert [(s.id, s.sport, s.dport) for s in subs] == [("f1~1", 64787, 5101),
                                                        ("f1~2", 63073, 5102)]
    assert all(s.subflow_of == "f1" and s.rate_bps == 0 and s.subflows == 1 for s in subs)


def test_ss_lines_with_the_state_column_parse_alike():
    with_state = "\n".join(("ESTAB " + ln) if ln[0].isdigit() else ln
                           for ln in SS.splitlines())
    assert mptcp.parse_subflows(with_state) == mptcp.parse_subflows(SS)


def test_a_connection_not_yet_up_has_no_subflows():
    assert mptcp.joined(flow(sport=40002), mptcp.parse_subflows(SS)) == []


def test_receivers_announce_one_port_per_extra_subflow_and_senders_accept_them():
    flows = [flow(4), flow(4, id="f2", sport=40002, dport=5202),
             flow(2, id="f3", src="h2", src_ip="10.0.0.2")]
    cmds = mptcp.host_commands(flows)
    assert cmds["h3"] == [f"ip mptcp endpoint add 10.0.0.3 port {p} signal"
                          for p in (5101, 5102, 5103)] + \
        ["ip mptcp limits set add_addr_accepted 0 subflows 3"]
    assert cmds["h1"] == ["ip mptcp limits set add_addr_accepted 3 subflows 3"]
    assert cmds["h2"] == ["ip mptcp limits set add_addr_accepted 1 subflows 1"]
    assert mptcp.host_commands([flow(1)]) == {}


# A rank's namespace while gloo's job on MPTCP hung (``ss -tniH state established``,
# abridged from a run): the connection's first subflow holds 3.5 MB, a joined one nothing,
# and a plain TCP socket with bytes queued is no subflow.
HUNG = """\
3504816 0      10.0.0.5:61946 10.0.0.2:61823
\t cubic bytes_received:4672696 tcp-ulp-mptcp flags:Mmecv token:0000(id:0)/c6174a0(id:0)
0      0      10.0.0.5:5101  10.0.0.2:63855
\t cubic tcp-ulp-mptcp flags:Jjec token:c0de(id:1)/c6174a0(id:0) seq:1
1200   0      10.0.0.5:5000  10.0.0.9:22
\t cubic wscale:7,7 rto:204
"""


def test_a_subflow_holding_bytes_is_what_a_hung_mptcp_job_shows():
    assert mptcp.held_by_subflows(HUNG) == [("10.0.0.5", 61946, "10.0.0.2", 61823, 3504816)]
    assert mptcp.held_by_subflows(SS) == []


def test_a_mesh_announces_half_the_joins_from_each_end():
    """gloo's ranks connect either way: every host accepts joins under a limit with room
    for crossing ones, and each end announces two of a 5-subflow connection's four."""
    ips = {"h1": "10.0.0.1", "h2": "10.0.0.2"}
    assert mptcp.mesh_limits(ips)["h2"] == [
        "ip mptcp endpoint flush", "sysctl -qw net.mptcp.add_addr_timeout=1",
        "ip mptcp limits set add_addr_accepted 8 subflows 8"]
    assert mptcp.mesh_announce(ips, 5) == {
        h: [f"ip mptcp endpoint add {ip} port {p} signal" for p in (5101, 5102)]
        for h, ip in ips.items()}


class _Host:
    """A host whose ``ss`` shows the next text each time it is asked."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def cmd(self, _line: str) -> str:
        return self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]


class _Fabric:
    def __init__(self, texts: list[str]) -> None:
        self.h1 = _Host(texts)

    def host(self, _name: str) -> _Host:
        return self.h1


def test_settled_subflows_are_taken_as_they_are_and_a_short_count_raises_unsettled():
    """f1 wants 4 subflows and has 3: waiting for all raises at the timeout; with a settle
    time, what stayed unchanged that long is what the connection has."""
    with pytest.raises(MachineError) as exc:
        mptcp.wait_subflows(_Fabric([SS]), [flow(4)], timeout_s=0.1, poll_s=0.01)
    assert "f1 (3 of 4)" in str(exc.value)
    fewer = "\n".join(SS.splitlines()[:6])           # one joined subflow not up yet
    subs = mptcp.wait_subflows(_Fabric([fewer, SS]), [flow(4)], timeout_s=5, poll_s=0.01,
                               settle_s=0.1)
    assert [s.id for s in subs] == ["f1~1", "f1~2"]


def test_iperf3_is_made_mptcp_and_paced_by_itself():
    cmd = _iperf_client_cmd(flow(4), 5)
    assert cmd[:2] == mptcp.WRAPPER and "--fq-rate" not in cmd
    assert cmd[cmd.index("-b") + 1] == "20000000"
    assert _iperf_server_cmd(flow(4))[:2] == mptcp.WRAPPER
    assert _iperf_server_cmd(flow(1))[0] == "iperf3"


def _one_pair(*sets: tuple[str, object]) -> tuple[dict, dict]:
    sc = scenario.load("ecmp-one-pair")
    schema = {**scenario.COMMON_SCHEMA, **kinds.get("ecmp").schema}
    p = scenario.validate(dict(sc.params), schema)
    p = scenario.apply_sets(p, list(sets), schema)
    return describe(make_topology(p["topology"])), p


def test_an_mptcp_scenario_plans_connections_of_its_subflows(monkeypatch):
    monkeypatch.setattr(mptcp, "unavailable", lambda: None)
    d, p = _one_pair(("traffic.proto", "mptcp"), ("traffic.subflows", 8))
    flows = kinds.get("ecmp").plan(d, p, random.Random(1))
    assert {(f.proto, f.subflows) for f in flows} == {("tcp", 8)}


@pytest.mark.parametrize("sets, field, words", [
    ([("traffic.proto", "mptcp"), ("traffic.subflows", 9)], "traffic.subflows",
     "path manager's limit of 8"),
    ([("traffic.subflows", 4)], "traffic.subflows", "only an mptcp flow"),
    ([("traffic.spray", 8)], "traffic.spray", "cannot be sprayed"),
])
def test_bad_subflows_are_refused_naming_the_key(monkeypatch, sets, field, words):
    monkeypatch.setattr(mptcp, "unavailable", lambda: None)
    d, p = _one_pair(*sets)
    with pytest.raises(ScenarioError) as exc:
        kinds.get("ecmp").plan(d, p, random.Random(1))
    assert exc.value.field == field and words in str(exc.value)


def test_mptcp_on_a_kernel_without_it_names_the_sysctl(monkeypatch, tmp_path):
    monkeypatch.setattr(mptcp, "SYSCTL", "net.nosuch.enabled")
    why = mptcp.unavailable()
    assert why is not None and "net.nosuch.enabled" in why
    d, p = _one_pair(("traffic.proto", "mptcp"))
    with pytest.raises(ScenarioError) as exc:
        kinds.get("ecmp").plan(d, p, random.Random(1))
    assert exc.value.field == "traffic.proto" and "net.nosuch.enabled" in str(exc.value)


def test_the_prediction_splits_a_connection_evenly_over_its_subflows():
    def entry(i: str, sport: int, dport: int, of: str | None, offered: float) -> dict:
        return {"id": i, "src_ip": "10.0.0.1", "dst_ip": "10.0.0.3", "proto": "tcp",
                "sport": sport, "dport": dport, "offered_bps": offered,
                **({"subflow_of": of} if of else {})}
    links = [{"node": "leaf1", "port": p, "peer": f"spine{p}", "bw_mbps": 50}
             for p in (1, 2)]
    result = {"policy": "hash5", "seed": 1, "links": links,
              "topology": {"hosts": [{"name": "h1"}]},
              "flows": [entry("f1", 40001, 5201, None, 30e6),
                        entry("f1~1", 61001, 5101, "f1", 0.0),
                        entry("f1~2", 61002, 5102, "f1", 0.0)]}
    pred = predict.uplink_prediction(result, "leaf1")
    assert sum(pred["carried_bps"].values()) == pytest.approx(30e6)
    assert sorted(pred["carried_bps"].values()) in ([0, 30e6], [10e6, 20e6])


def test_the_adaptive_threshold_must_be_below_the_queue():
    from lab.measure import queuefeed
    d, p = _one_pair()
    assert queuefeed.threshold(p, d) == 75_000 // 2
    d, p = _one_pair(("adaptive.threshold_bytes", 75_000))
    with pytest.raises(ScenarioError) as exc:
        kinds.get("ecmp").plan(d, p, random.Random(1))
    assert exc.value.field == "adaptive.threshold_bytes" and "queue size" in str(exc.value)
