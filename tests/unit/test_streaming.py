"""streaming-incident as data: the edge topology, the stream plan, refusals, router counters.

No root, no packets: what the lab would build and run, checked before anything starts.
"""

import random

import pytest

from lab import kinds
from lab.kinds.streaming.metrics import fidelity_span
from lab.kinds.streaming.plan import PHASES
from lab.machine import cpuclass
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
    ("streams.browser=maybe", "streams.browser"),
    ("streams.browser=off", "streams.browser"),      # YAML's false, not a choice
    ("streams.media=synthetic streams.browser=always", "streams.browser"),
    ("streams.gop_s=9", "streams.gop_s"),
    ("streams.gop_s=0", "streams.gop_s"),
])
def test_bad_values_name_their_field(item, field):
    with pytest.raises((ScenarioError, TopologyError)) as exc:
        plan_for(item.split())
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


def test_the_browser_viewer_is_where_installed_unless_asked(monkeypatch):
    """``streams.browser``: auto follows what is installed, never turns it off, and always
    without Chromium or hls.js is one error naming the field and what to install."""
    from lab.kinds.streaming import media
    _, params, _ = plan_for(["streams.browser=never"])
    assert media.browser(params) is False
    _, params, _ = plan_for([])
    assert media.browser(params) is media.browser_ready()
    monkeypatch.setattr(media, "HLSJS", media.CACHE_DIR / "nosuch-hls.min.js")
    _, params, _ = plan_for([])
    assert media.browser(params) is False
    if not media.missing_packages():
        with pytest.raises(ScenarioError, match=r"nosuch-hls\.min\.js") as exc:
            plan_for(["streams.media=real", "streams.browser=always"])
        assert exc.value.field == "streams.browser"


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


def test_streams_above_their_access_link_are_a_warning_naming_the_key(real_media):
    """Each way on its own: with real media the origin's link carries the relays in and the
    streams out, each 27 Mbit/s in the incident, and only the over-full ways are named."""
    from lab.kinds.streaming.plan import access_warnings
    desc, _, streams = plan_for(["streams.media=synthetic"])
    assert access_warnings(desc, streams) == []
    desc, _, streams = plan_for(["topology.host_bw=20", "streams.media=synthetic"])
    warned = access_warnings(desc, streams)
    assert warned and all("topology.host_bw" in w and "out of h5" in w for w in warned), warned
    assert any("[incident]" in w and "27 Mbit/s" in w for w in warned), warned
    desc, _, streams = plan_for(["topology.host_bw=20", "streams.media=real"])
    real = access_warnings(desc, streams)
    into = [w for w in real if "into h5" in w]
    assert sorted(set(real) - set(into)) == sorted(warned), real
    assert any("[incident]" in w and "27 Mbit/s" in w for w in into), into
    desc, _, streams = plan_for(["topology.host_bw=30", "streams.media=real"])
    assert access_warnings(desc, streams) == []


@pytest.fixture
def real_media(monkeypatch):
    """Real media plannable without its packages: the plan only names what would run."""
    from lab.kinds.streaming import media
    monkeypatch.setattr(media, "missing_packages", lambda: [])


def test_real_media_relays_each_origin_stream_from_a_media_server(real_media):
    """An origin stream is published into one of the phase's media servers in turn, whose
    relay to the origin is a planned stream of its own; the other streams keep the 5-tuples
    the seed gives them without relays, and synthetic media has none."""
    from lab.kinds.streaming.plan import ORIGIN_ROLES
    _, params, real = plan_for(["streams.media=real"])
    _, _, synthetic = plan_for(["streams.media=synthetic"])
    assert not any(s.role == "relay" for s in synthetic)
    assert [(s.id, s.src, s.dst, s.sport) for s in real if s.role != "relay"] == \
        [(s.id, s.src, s.dst, s.sport) for s in synthetic]
    by_id = {s.id: s for s in real}
    assert len({s.sport for s in real}) == len(real)
    assert sorted(s.index for s in real) == list(range(len(real)))
    for phase in PHASES:
        mine = [s for s in real if s.phase == phase]
        origin = [s for s in mine if s.role in ORIGIN_ROLES]
        relays = [s for s in mine if s.role == "relay"]
        servers = params["before" if phase == "before-upgrade" else "after"]["servers"]
        assert len(relays) == len(origin) and origin
        assert len({s.stream_id for s in mine}) == len(mine)
        for j, st in enumerate(origin):
            relay = by_id[st.relayed_by]
            assert relay.relay_of == st.id and relay.role == "relay"
            assert relay.src == f"h{j % servers + 1}" and relay.dst == st.src == "h5"
            assert (relay.dst_ip, relay.dport, relay.proto) == (st.src_ip, 1935, "tcp")
            assert relay.rate_mbps == st.rate_mbps
            assert relay.id == f"{phase}/relay{relay.stream_id}"


def test_each_server_pushes_on_what_it_relays(real_media, tmp_path):
    """The chain in nginx's own configuration: a media server pushes each origin stream
    published into it to the origin, the origin to the stream's CDN node, a CDN node
    nowhere."""
    from lab.kinds.streaming.programs import EdgePrograms, stream_name
    desc, _, streams = plan_for(["streams.media=real"])
    edge = EdgePrograms()
    edge.desc, edge.streams = desc, streams
    edge.fabric = type("F", (), {"run_dir": tmp_path})()
    servers = {sv.host: sv for sv in edge.media_servers()}
    assert {h: sv.role for h, sv in servers.items()} == {
        "h1": "ingest", "h2": "ingest", "h3": "ingest", "h4": "ingest", "h5": "origin",
        "cdn1": "cdn", "cdn2": "cdn"}
    ips = {h["name"]: h["ip"] for h in desc["hosts"] + desc["external_hosts"]}
    big = next(s for s in streams if s.id == "incident/big7")
    relay = next(s for s in streams if s.id == big.relayed_by)
    assert stream_name(relay) == stream_name(big) == "incident-big7"
    assert f"push rtmp://{ips['h5']}:1935/live name=incident-big7;" in \
        servers[relay.src].conf()
    assert f"push rtmp://{ips['cdn1']}:1935/live name=incident-big7;" in servers["h5"].conf()
    assert all("push " not in servers[c].conf() for c in ("cdn1", "cdn2"))
    pushed = sum(sv.conf().count("push rtmp://") for sv in servers.values())
    assert pushed == sum(1 for s in streams if s.role != "ingest")


def _flow(fid, role, stalls=0, **kw):
    base = {"id": fid, "role": role, "stalls": stalls, "stall_s": 0.5 * (stalls or 0),
            "frames_expected": 200, "frames_lost": 0, "offered_bps": 6e6, "retransmits": 1,
            "received": True, "end_reason": "duration", "router_hops": [], "bytes": 6_000_000,
            "max_gap_s": 0.2}
    return {**base, **kw}


def test_a_relay_is_neither_a_stream_nor_a_missing_viewer():
    """A phase's stalls, frames, offered load and fidelity are its viewers'; its relays
    (no viewer, viewer keys None) are summed apart, and a failover does not call them lost."""
    from lab.kinds.streaming.metrics import RELAY_UNVIEWED, phase_metrics
    relay = _flow("incident/relay3", "relay", relay_of="incident/big2", retransmits=4,
                  bytes=6_100_000, **{k: None for k in RELAY_UNVIEWED})
    flows = [_flow("incident/ingest1", "ingest", 0), _flow("incident/big2", "big", 2,
                                                             relayed_by="incident/relay3"),
             relay]
    ph = {"flows": flows, "links": [], "duration_s": 8.0, "cpu_idle_min_pct": 40.0,
          "config": {}, "events": {"cut": "border1", "phase_start_unix": 0.0}}
    mt = phase_metrics(ph)
    assert (mt["streams"], mt["stalls"], mt["stall_s"]) == (2, 2, 1.0)
    assert mt["offered_mbps"] == 12.0 and mt["retransmits"] == 2
    assert mt["fidelity_valid"] and mt["failover"]["streams_lost"] == []
    assert mt["relays"] == {"streams": 1, "bytes": 6_100_000, "retransmits": 4}
    flows[1]["received"] = False
    assert not phase_metrics(ph)["fidelity_valid"]


def test_a_failover_names_streams_whose_viewer_was_not_yet_watching():
    """An outage is only measured by a viewer that had frames before the cut."""
    from lab.kinds.streaming.metrics import phase_metrics
    hop = [{"link": "border1-eth2->isp1-eth0", "from": "border1", "to": "isp1"}]
    flows = [_flow(f"failover-link/big{i}", "big", router_hops=hop,
                   playout={"first_arrival_unix": first}) for i, first in
             ((1, 99.0), (2, 101.0), (3, None))]
    ph = {"flows": flows, "links": [], "duration_s": 8.0, "cpu_idle_min_pct": 40.0,
          "config": {}, "events": {"cut": "border1-eth2->isp1-eth0", "cut_unix": 100.0,
                                   "phase_start_unix": 95.0}}
    fo = phase_metrics(ph)["failover"]
    assert fo["streams_on_cut"] == [f["id"] for f in flows]
    assert fo["unwatched_at_cut"] == ["failover-link/big2", "failover-link/big3"]


def test_diagnose_shows_a_flow_without_a_viewer():
    from lab.analysis.diagnose import render
    flows = [{"id": i, "src": "h5", "dst": "cdn1", "path": ["leaf1"], "lost_bytes": 0,
              "lost_on": None, "goodput_bps": g, "retransmits": 0, "stalls": st}
             for i, g, st in (("incident/big2", 6e6, 1), ("incident/relay3", None, None))]
    text = render({"scenario": "s", "policy": "p", "links": 1, "links_up": 1,
                   "congested_link": None, "unexplained": {}, "flows": flows})
    big, relay = text.splitlines()[-2:]
    assert big.split()[-1] == "1" and "6.0 M" in big
    assert relay.split()[-4:] == ["-", "-", "0", "-"], relay


class _ThisMachine:
    """A host that is this machine's own namespace: enough of a fabric for a server's
    start to run for real (processes, the run record's PIDs)."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.record = self
        self.cgroups: list[str] = []
        # No CPU controller: the programs stay in this test's own group.
        self.cpu = cpuclass.CpuClasses("unit", self, cpuclass.Mechanism("none", None, None))

    def save(self) -> None:
        """Nothing to write: this record lives as long as the test."""

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
