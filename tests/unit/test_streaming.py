"""streaming-incident as data: the edge topology, the stream plan, refusals, router counters.

No root, no packets: what the lab would build and run, checked before anything starts.
"""

import random

import pytest

from lab import kinds
from lab.kinds.streaming.metrics import fidelity_span
from lab.kinds.streaming.plan import PHASES
from lab.measure import routerstats
from lab.model import scenario
from lab.model.errors import ScenarioError, TopologyError
from lab.net.topologies import describe, make_topology


def plan_for(sets=()):
    sc = scenario.load("streaming-incident")
    kind = kinds.get(sc.kind)
    params = scenario.apply_sets(sc.params, scenario.parse_set(list(sets)), kind.schema)
    params.setdefault("duration", 8.0)
    scenario.validate(params, kind.schema)
    desc = describe(make_topology(params["topology"]))
    return desc, params, kind.plan(desc, params, random.Random(params.get("seed", 1)))


def test_edge_topology_names_every_link_and_router():
    desc = describe(make_topology({"type": "streaming-edge"}))
    roles = [ln["role"] for ln in desc["router_links"]]
    assert roles.count("uplink") == 2 * 2 * 2          # borders x ISPs x parallel uplinks
    assert roles.count("core") == 2 * 2                 # borders x core links
    assert {r["name"] for r in desc["routers"]} == {"dccore", "border1", "border2", "isp1",
                                                     "isp2"}
    # The fabric sees its hosts and the gateway, nothing behind the routers.
    assert {h["name"] for h in desc["hosts"]} == {"h1", "h2", "h3", "h4", "h5", "dccore"}
    assert all(ln["a"] not in {"isp1", "border1"} for ln in desc["links"])
    ports = routerstats.router_ports(desc)
    assert len({p.name for p in ports}) == len(ports)  # parallel links are told apart


def test_border_announces_only_the_dc_prefix():
    topo = make_topology({"type": "streaming-edge"})
    conf = topo.bgp.configs("border1")["bgpd.conf"]
    assert "ip prefix-list FL-OWN seq 5 permit 10.0.0.0/8" in conf
    assert " network " not in conf          # the border does not originate it
    assert conf.count("bfd profile fabriclab") == 6


def test_a_source_port_serves_one_stream_per_run():
    """Real media reconnects to the same servers every phase: a port used twice would meet
    its own TIME_WAIT."""
    _, _, streams = plan_for([])
    ports = [s.sport for s in streams]
    assert len(ports) == len(set(ports))


def test_plan_has_every_phase_and_distinct_5tuples():
    _, _, streams = plan_for()
    assert [p for p in PHASES if any(s.phase == p for s in streams)] == \
        list(PHASES)
    tuples = [(s.src_ip, s.dst_ip, s.sport, s.dport) for s in streams]
    assert len(set(tuples)) == len(tuples)
    inc = [s for s in streams if s.phase == "incident"]
    big = [s for s in inc if s.role == "big"]
    assert len(big) == 4 and {s.dst for s in big} == {"cdn1"}
    assert sum(s.rate_mbps for s in big) > 20      # more than one upgraded uplink
    before = [s for s in streams if s.phase == "before-upgrade" and s.role == "big"]
    assert sum(s.rate_mbps for s in before) < 8    # fits one old uplink


def test_phases_subset_keeps_order():
    _, _, streams = plan_for(["phases=failover-link,incident"])
    assert streams[0].phase == "incident"
    assert {s.phase for s in streams} == {"incident", "failover-link"}


@pytest.mark.parametrize("item, field", [
    ("phases=incident,nosuch", "phases"),
    ("failover.restore_at=2", "failover.restore_at"),
    ("failover.restore_at=30", "failover.restore_at"),
    ("after.servers=9", "after.servers"),
    ("streams.proto=sctp", "streams.proto"),
    ("before.big_streams=0", "before.big_streams"),
    ("topology.uplinks=0", "topology.uplinks"),
    ("topology.isps=9", "topology.isps"),
    ("topology.uplink_bw=5000", "topology.uplink_bw"),
    ("topology.nosuch=1", "topology.nosuch"),
    ("streams.media=vhs", "streams.media"),
    ("streams.gop_s=9", "streams.gop_s"),
    ("streams.gop_s=0", "streams.gop_s"),
])
def test_bad_values_name_their_field(item, field):
    with pytest.raises((ScenarioError, TopologyError)) as exc:
        plan_for([item])
    assert exc.value.field == field, str(exc.value)


def test_flow_counter_ruleset_and_parse():
    text = routerstats.flow_counter_ruleset(["r-eth0", "r-eth1"])
    assert 'oifname "r-eth1"' in text and 'iifname "r-eth0"' in text
    assert text.count("flags dynamic; counter") == 4
    doc = {"nftables": [{"metainfo": {}}, {"set": {"name": "out1", "elem": [
        {"elem": {"val": {"concat": ["10.0.0.5", "203.0.113.10", "tcp", 40000, 9001]},
                  "counter": {"packets": 3, "bytes": 4500}}}]}},
        {"set": {"name": "in0"}}]}
    got = routerstats.parse_flow_counters(doc, ["r-eth0", "r-eth1"])
    assert got[("r-eth1", "out")] == {("10.0.0.5", "203.0.113.10", "tcp", 40000, 9001): 4500}
    assert got[("r-eth0", "in")] == {}
    later = {("r-eth1", "out"): {("10.0.0.5", "203.0.113.10", "tcp", 40000, 9001): 6000}}
    assert routerstats.delta(later, got)[("r-eth1", "out")] == {
        ("10.0.0.5", "203.0.113.10", "tcp", 40000, 9001): 1500}


def test_bfd_runs_only_where_a_failover_needs_it():
    """BFD costs a bfdd per router sending every 100 ms: the edge runs it when a failover
    phase has a silent cut to notice, and a scenario cannot turn it off for one."""
    from lab import run
    from lab.model.errors import ScenarioError
    assert run.check_input("streaming-incident").topo_desc["params"]["bfd"] is True
    some = run.check_input("streaming-incident", sets=["phases=before-upgrade,incident"])
    assert some.topo_desc["params"]["bfd"] is False
    assert run.check_input("streaming-incident", sets=["phases=failover-link"]
                           ).topo_desc["params"]["bfd"] is True
    with pytest.raises(ScenarioError, match=r"topology\.bfd"):
        run.check_input("streaming-incident", sets=["phases=failover-link", "topology.bfd=false"])


def test_cpu_is_judged_while_every_stream_sends():
    """From the last sender's first frame to the first sender's last: the exit of programs
    whose stream ended, while backlogged ones drain, is the lab's teardown."""
    senders = [(10.0, 7.7), (10.1, 7.6), (10.0, 10.0), (10.05, 9.4)]
    assert fidelity_span(senders, 9.0, 30.0, 8.0) == (10.1, 17.7)
    # a sender cut short (failed after a second) does not shrink the judged seconds
    assert fidelity_span([*senders, (10.0, 1.0)], 9.0, 30.0, 8.0) == (10.1, 17.7)
    # nothing ran long enough: up to the longest; never outside the counters' window
    assert fidelity_span([(10.0, 1.0), (10.0, 2.0)], 9.0, 30.0, 8.0) == (10.0, 12.0)
    assert fidelity_span(senders, 9.0, 15.0, 8.0) == (10.1, 15.0)
    assert fidelity_span([], 9.0, 30.0, 8.0) == (9.0, 30.0)


def test_real_media_is_rtmp_over_tcp_and_needs_its_packages(monkeypatch):
    """Real media is asked for by name or chosen where its packages are; asked for without
    them, the error names the Debian packages to install."""
    from lab.kinds.streaming import media
    with pytest.raises(ScenarioError) as exc:
        plan_for(["streams.media=real", "streams.proto=udp"])
    assert exc.value.field == "streams.proto"
    _, params, _ = plan_for(["streams.proto=udp"])
    assert media.resolve(params) == "synthetic"
    # A reduced rate profile (a TCG guest's) keeps the lab's own sender unless asked.
    _, params, _ = plan_for(["rate_scale=0.125"])
    assert media.resolve(params) == "synthetic" and params["rate_scale"] == 0.125
    if not media.missing_packages():
        _, params, _ = plan_for([])
        assert media.resolve(params) == "real"
    monkeypatch.setattr(media, "PACKAGES", {"nosuch-ffmpeg": media.CACHE_DIR / "nope"})
    with pytest.raises(ScenarioError, match="nosuch-ffmpeg") as exc:
        plan_for(["streams.media=real"])
    assert exc.value.field == "streams.media"
    _, params, streams = plan_for([])
    assert media.resolve(params) == "synthetic"
    assert {s.dport for s in streams} != {media.RTMP_PORT}


def test_nginx_listens_only_on_its_fabric_address(tmp_path):
    """Every listen directive names the host's own address; everything it writes is in its
    run directory."""
    from lab.kinds.streaming import media
    srv = media.Server("cdn1", "203.0.113.10", "cdn", tmp_path, {"a": "10.0.0.1"})
    conf = srv.conf()
    listens = [ln.split()[1].rstrip(";") for ln in conf.splitlines()
               if ln.strip().startswith("listen")]
    assert listens == ["203.0.113.10:1935", "203.0.113.10:8080"]
    paths = [tok.rstrip(";") for tok in conf.split()
             if tok.startswith("/") and not tok.startswith(("/hls/", "/player/"))]
    read_only = (str(media.RTMP_MODULE), str(media.HLSJS), f"{media.PLAYER_DIR}/")
    assert all(p.startswith(str(tmp_path)) or p in read_only for p in paths), paths
    assert "master_process off" in conf and "push rtmp://10.0.0.1:1935/live name=a" in conf


def test_streams_above_their_access_link_are_a_warning_naming_the_key():
    from lab.kinds.streaming.plan import access_warnings
    desc, _, streams = plan_for([])
    assert access_warnings(desc, streams) == []
    desc, _, streams = plan_for(["topology.host_bw=20"])
    warned = access_warnings(desc, streams)
    assert warned and all("topology.host_bw" in w and "out of h5" in w for w in warned), warned
    assert any("[incident]" in w and "27 Mbit/s" in w for w in warned), warned


class _ThisMachine:
    """A host that is this machine's own namespace: enough of a fabric for a server's
    start to run for real (processes, the run record's PIDs)."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.record = self

    def host(self, _name: str) -> "_ThisMachine":
        return self

    def add_pid(self, pid: int, _what: str) -> None:
        self.pids.append(pid)

    def cmd(self, line: str) -> str:
        import subprocess
        return subprocess.run(line, shell=True, capture_output=True, text=True).stdout

    def popen(self, argv: list[str], **kw):
        import subprocess
        return subprocess.Popen(argv, **kw)


def test_a_media_server_that_cannot_start_is_one_error_with_its_log(tmp_path):
    """nginx told to listen on an address the host lacks exits at once: the run stops with
    one line naming the host and nginx's own last words, and the process is gone."""
    from lab.kinds.streaming import media
    from lab.model.errors import MachineError
    if not media.RTMP_MODULE.exists():
        pytest.skip("nginx's RTMP module is not installed (make setup)")
    fabric = _ThisMachine()
    srv = media.Server("cdn9", "192.0.2.99", "cdn", tmp_path / "cdn9", {})
    with pytest.raises(MachineError) as exc:
        media.start_servers(fabric, [srv])
    assert exc.value.field == "streams.media"
    assert "nginx-rtmp on cdn9 did not start (exited)" in str(exc.value)
    assert "192.0.2.99" in str(exc.value), str(exc.value)
    assert srv.proc.poll() is not None and fabric.pids == [srv.proc.pid]
