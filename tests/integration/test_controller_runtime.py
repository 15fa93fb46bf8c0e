"""The controller on a real (tiny) OVS fabric, under both runtimes, with real packets.

The fabric is built by hand (``ctlfabric``), not by the lab, so this tests the controller alone:
two leaves and two spines as OVS userspace bridges joined by veth pairs, and one host per
leaf as a network namespace. Two spines (rather than two leaves joined by two links) give
every flow a path through one spine and *another path* through the other, so the switches'
own per-flow counters can say which one the packets took, and that the other saw nothing.

    ns1 --1-[leaf1]-2--1-[spine1]-2--2-[leaf2]-1-- ns2
               3 --1-[spine2]-2-- 3

Everything created is named ``fct<tag>...`` and removed by the fixture, by name and PID.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from controllers import policies
from controllers.policies import FlowKey
from tests.integration.ctlfabric import (
    H1,
    H2,
    PING,
    POLICIES,
    REPO,
    RUNTIMES,
    SEED,
    TCP_CLIENT,
    TCP_SERVER,
    UDP_COUNT,
    UDP_FRAME,
    UDP_PAYLOAD,
    UDP_RECV,
    UDP_SEND,
    UPLINKS,
    Controller,
    Fabric,
    bring_up,
    free_port,
    listening,
    ovs_running,
    runtime_python,
    sh,
    start_controller,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not ovs_running(),
                                reason="needs root and a running Open vSwitch")


@pytest.fixture
def fabric() -> Iterator[Fabric]:
    fab = Fabric()
    try:
        fab.create()
        yield fab
    finally:
        fab.destroy()


@pytest.fixture
def controllers() -> Iterator[list[Controller]]:
    """Started controllers are registered here; any still running at the end are killed."""
    started: list[Controller] = []
    yield started
    for ctl in started:
        if ctl.proc.poll() is None:
            ctl.proc.kill()             # only the PID this test started
            ctl.proc.wait()


# -- tests ---------------------------------------------------------------------------------------

def check_tables(fab: Fabric, policy: str) -> None:
    """What ``dump-flows``/``dump-groups`` must show right after programming."""
    to_h1, to_h2 = "ip,nw_dst=10.0.0.1", "ip,nw_dst=10.0.0.2"
    for sw in fab.dpids:
        assert fab.flows(sw, 0) == ["priority=0 actions=goto_table:1"], sw
    for spine in ("spine1", "spine2"):
        assert fab.flows(spine, 1) == [f"priority=10,{to_h1} actions=output:1",
                                       f"priority=10,{to_h2} actions=output:2"]
        assert fab.groups(spine) == []
    leaf1 = fab.flows("leaf1", 1)
    assert f"priority=10,{to_h1} actions=output:1" in leaf1
    if policy == "ovs-select":
        assert leaf1 == sorted([f"priority=10,{to_h1} actions=output:1",
                                f"priority=10,{to_h2} actions=group:1"])
        (group,) = fab.groups("leaf1")
        assert "group_id=1,type=select" in group
        buckets = re.findall(r"bucket=([^ ]*?)(?=,bucket=|$)", group)
        assert len(buckets) == 2, group
        for port, bucket in zip((2, 3), buckets, strict=True):
            # OVS prints a bucket's weight only when it is not the default, 1.
            assert "weight:" not in bucket and f"watch_port:{port}" in bucket, bucket
            assert bucket.endswith(f"actions=output:{port}"), bucket
    elif policy == "hash-l3":
        want = policies.get("hash-l3")(SEED).choose(FlowKey(H1[0], H2[0], 0, 0, 0), "leaf1",
                                                     [2, 3])
        assert leaf1 == sorted([f"priority=10,{to_h1} actions=output:1",
                                f"priority=20,ip,nw_src=10.0.0.1,nw_dst=10.0.0.2 "
                                f"actions=output:{want}",
                                f"priority=10,{to_h2} actions=output:2"])
        assert fab.groups("leaf1") == []
    else:
        # TCP and UDP wait for the policy's decision; everything else (ICMP) takes the
        # select group, so reachability never queues at the controller.
        assert leaf1 == sorted([f"priority=10,{to_h1} actions=output:1",
                                f"priority=10,{to_h2} actions=group:1",
                                "priority=15,tcp,nw_dst=10.0.0.2 actions=CONTROLLER:65535",
                                "priority=15,udp,nw_dst=10.0.0.2 actions=CONTROLLER:65535"])
        (group,) = fab.groups("leaf1")
        assert "group_id=1,type=select" in group
    for sw in fab.dpids:
        for line in fab.flows(sw, 1):
            assert "FLOOD" not in line and "NORMAL" not in line and "ALL" not in line


def predicted_spine(policy: str, key: FlowKey, first: str) -> str | None:
    """The spine a flow must cross, when the controller (not OVS) decides."""
    if policy == "ovs-select":
        return None
    if policy == "hash-l3":
        key = FlowKey(key.src, key.dst, 0, 0, 0)
    return UPLINKS[policies.get(policy)(SEED).choose(key, first, [2, 3])]


def check_path(all_counts: dict[str, dict[int, tuple[int, int]]], policy: str, cookie: int,
               key: FlowKey, first: str, last: str, min_bytes: int,
               exact: tuple[int, int] | None = None) -> str:
    """The watch counters say the flow crossed both leaves and exactly one spine."""
    counts = {sw: c.get(cookie, (0, 0)) for sw, c in all_counts.items()}
    crossed = [sp for sp in ("spine1", "spine2") if counts[sp][1] > 0]
    assert len(crossed) == 1, f"cookie {cookie:#x}: {counts}"
    other = "spine2" if crossed[0] == "spine1" else "spine1"
    assert counts[other] == (0, 0), counts
    for sw in (first, crossed[0], last):
        assert counts[sw][1] >= min_bytes, (sw, counts)
        if exact is not None:
            assert counts[sw] == exact, (sw, counts)
    want = predicted_spine(policy, key, first)
    if want is not None:
        assert crossed[0] == want, f"{key} took {crossed[0]}, the policy chose {want}"
    return crossed[0]


def pick_sports(policy: str) -> tuple[int, int]:
    """Two UDP source ports that the policy (if it decides) sends over different spines."""
    if policy != "hash5":
        return 40001, 40002
    first = 40001
    want = predicted_spine(policy, FlowKey(H1[0], H2[0], 17, first, 5001), "leaf1")
    for sport in range(40002, 40100):
        if predicted_spine(policy, FlowKey(H1[0], H2[0], 17, sport, 5001), "leaf1") != want:
            return first, sport
    raise AssertionError("no second port found")


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_programs_forwards_and_counts(runtime: str, policy: str, fabric: Fabric,
                                      controllers: list[Controller], tmp_path: Path) -> None:
    ctl, _ = bring_up(runtime, policy, fabric, tmp_path, controllers)
    status = ctl.request({"cmd": "status"})
    assert (status["ok"], status["runtime"], status["policy"], status["seed"]) == \
        (True, runtime, policy, SEED)
    assert status["switches"] == dict.fromkeys(fabric.dpids, "programmed")
    assert oct(ctl.sock.stat().st_mode & 0o777) == "0o600"

    # Only 127.0.0.1: the OpenFlow listener, nothing else on any network.
    addrs = listening(ctl.proc.pid)
    assert addrs == [f"127.0.0.1:{ctl.port}"], addrs

    check_tables(fabric, policy)

    # Real packets both ways (ICMP: a protocol without ports, so flow keys with ports 0).
    print(fabric.in_ns("h1", PING, H2[0], "3").strip())
    print(fabric.in_ns("h2", PING, H1[0], "3").strip())

    # Per-flow counters: two UDP flows, a TCP flow both ways, and one that never runs.
    s1, s2 = pick_sports(policy)
    udp = [FlowKey(H1[0], H2[0], 17, s1, 5001), FlowKey(H1[0], H2[0], 17, s2, 5001)]
    tcp = FlowKey(H1[0], H2[0], 6, 40100, 5201)
    idle = FlowKey(H2[0], H1[0], 17, 5001, s1)
    watched = {0xFAB1: udp[0], 0xFAB2: udp[1], 0xFAB3: tcp, 0xFAB4: tcp.reversed(),
               0xFAB5: idle}
    reply = ctl.request({"cmd": "watch", "flows": [
        {"cookie": c, "proto": k.proto, "src": k.src, "dst": k.dst, "sport": k.sport,
         "dport": k.dport} for c, k in watched.items()]})
    assert reply == {"ok": True, "installed": len(watched) * 4}
    for sw in fabric.dpids:
        assert set(fabric.counters(sw)) == set(watched), sw
        assert all(v == (0, 0) for v in fabric.counters(sw).values())
    table0 = fabric.flows("leaf1", 0)
    assert ("cookie=0xfab3, priority=100,tcp,nw_src=10.0.0.1,nw_dst=10.0.0.2,tp_src=40100,"
            "tp_dst=5201 actions=goto_table:1") in [re.sub(r"duration=[^ ]* ", "", x)
                                                     for x in table0], table0

    # Receivers count what the *hosts* accept, not just what the switches forwarded: a
    # packet-out with a broken checksum is counted by every switch and then dropped.
    receiver = fabric.spawn_in_ns("h2", UDP_RECV, H2[0], "5001")
    server = fabric.spawn_in_ns("h2", TCP_SERVER, tcp.dst, str(tcp.dport))
    for key in udp:
        fabric.in_ns("h1", UDP_SEND, key.src, str(key.sport), key.dst, str(key.dport),
                     str(UDP_COUNT), str(UDP_PAYLOAD))
    size = 300_000
    got, connect_s = fabric.in_ns("h1", TCP_CLIENT, tcp.src, str(tcp.sport), tcp.dst,
                                  str(tcp.dport), str(size)).split()
    assert got == str(size)
    # No SYN or SYN-ACK lost on the way (each loss costs a 1 s retransmission timeout).
    assert float(connect_s) < 0.5, f"TCP connect took {connect_s} s"
    assert server.communicate(timeout=10)[0].split()[-1] == str(size)
    received = json.loads(receiver.communicate(timeout=15)[0].splitlines()[-1])
    assert received == {str(k.sport): UDP_COUNT for k in udp}, received
    counts = fabric.settled_counters(set(watched))
    spines = [check_path(counts, policy, c, k, "leaf1", "leaf2", UDP_COUNT * UDP_FRAME,
                         exact=(UDP_COUNT, UDP_COUNT * UDP_FRAME))
              for c, k in ((0xFAB1, udp[0]), (0xFAB2, udp[1]))]
    fwd = check_path(counts, policy, 0xFAB3, tcp, "leaf1", "leaf2", size)
    rev = check_path(counts, policy, 0xFAB4, tcp.reversed(), "leaf2", "leaf1", 1)
    assert all(counts[sw][0xFAB5] == (0, 0) for sw in fabric.dpids)
    print(f"[{runtime}/{policy}] UDP flows via {spines}, TCP via {fwd} / back via {rev}")
    if policy == "hash5":
        assert spines[0] != spines[1]          # per-flow hashing split them, as predicted
    if policy == "hash-l3":
        assert spines[0] == spines[1] == fwd   # one host pair, one uplink: polarised

    if policy == "hash5":
        # The decisions became exact, expiring entries on the leaves only.
        reactive = [x for x in fabric.flows("leaf1", 1) if "priority=30" in x]
        assert any("udp" in x and f"tp_src={s1}" in x and "idle_timeout=30" in x
                   for x in reactive), reactive
        assert any("tcp" in x and "tp_src=40100" in x for x in reactive), reactive
        assert not [x for x in fabric.flows("spine1", 1) if "priority=30" in x]
        assert ctl.request({"cmd": "status"})["decisions"] >= 4
        assert "port" in ctl.log.read_text()   # decisions logged at debug level

    assert ctl.stop() == 0
    assert not ctl.sock.exists(), "the control socket outlived the controller"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_reconnect_is_a_clean_resync(runtime: str, fabric: Fabric,
                                     controllers: list[Controller], tmp_path: Path) -> None:
    ctl, _ = bring_up(runtime, "ovs-select", fabric, tmp_path, controllers)
    key = FlowKey(H1[0], H2[0], 17, 40001, 5001)
    assert ctl.request({"cmd": "watch", "flows": [
        {"cookie": 0xFAB9, "proto": 17, "src": key.src, "dst": key.dst, "sport": key.sport,
         "dport": key.dport}]})["installed"] == 4
    before = fabric.flows("leaf1", 1), fabric.flows("leaf1", 0)
    br = fabric.br("leaf1")
    # Stale state the controller must not keep: a flow and a group it never installed.
    sh("ovs-vsctl", "del-controller", br)
    ctl.wait(lambda s: s["switches"]["leaf1"] == "absent", "leaf1 seen as disconnected")
    sh("ovs-ofctl", "-O", "OpenFlow13", "add-flow", br,
       "table=1,priority=5,cookie=0x77,ip,nw_dst=10.9.9.9,actions=drop")
    sh("ovs-ofctl", "-O", "OpenFlow13", "add-group", br,
       "group_id=77,type=select,bucket=output:2")
    assert any("10.9.9.9" in x for x in fabric.flows("leaf1", 1))
    fabric_ctl = f"tcp:127.0.0.1:{ctl.port}"
    sh("ovs-vsctl", "set-controller", br, fabric_ctl)
    ctl.wait(lambda s: s["ready"], "leaf1 programmed again")
    assert not any("10.9.9.9" in x for x in fabric.flows("leaf1", 1))
    assert not any("group_id=77" in g for g in fabric.groups("leaf1"))
    after = fabric.flows("leaf1", 1), fabric.flows("leaf1", 0)
    strip = [[re.sub(r"duration=[^ ]* ", "", x) for x in t] for t in (*before, *after)]
    assert strip[0] == strip[2] and strip[1] == strip[3]        # watch entry reinstalled
    assert "leaf1 (dpid 0x201) connected" in ctl.log.read_text()
    fabric.in_ns("h1", UDP_SEND, key.src, str(key.sport), key.dst, str(key.dport), "5", "100")
    assert fabric.settled_counters({0xFAB9})["leaf1"][0xFAB9] == (5, 5 * (100 + 42))
    assert ctl.stop() == 0


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_control_errors_and_unknown_switches(runtime: str, fabric: Fabric,
                                             controllers: list[Controller],
                                             tmp_path: Path) -> None:
    cfg = fabric.config("hash5", tmp_path / "controller.sock")
    cfg["switches"] = [s for s in cfg["switches"] if s["name"] != "spine2"]
    cfg["links"] = [lk for lk in cfg["links"] if lk["b"] != "spine2"]
    cfg["ecn"] = {"mechanism": "tc-bpf", "build_dir": str(tmp_path)}
    ctl = start_controller(runtime, cfg, tmp_path)
    controllers.append(ctl)
    ctl.wait_socket()
    bad_json = ctl.request(b"{not json")
    assert bad_json["ok"] is False and bad_json["error"].startswith("bad JSON"), bad_json
    assert ctl.request(b"[1]") == {"ok": False, "error": "bad request: expected a JSON object"}
    assert ctl.request({"cmd": "reboot"}) == {
        "ok": False,
        "error": "unknown cmd 'reboot' (known: status, watch, pin, jobs, queues, ecn, "
                 "ecn_stats, pfc)"}
    # hash5 cannot be told which job a flow is: one line saying so, nothing changed
    jobs = ctl.request({"cmd": "jobs", "flows": []})
    assert jobs["ok"] is False and "not job-aware" in jobs["error"], jobs
    # nor does it read queues
    queues = ctl.request({"cmd": "queues", "ports": {}, "threshold_bytes": 1000})
    assert queues["ok"] is False and "does not read queues" in queues["error"], queues
    bad = ctl.request({"cmd": "watch", "flows": [{"cookie": 1, "proto": 6, "src": "10.0.0.1",
                                                  "dst": "nowhere"}]})
    assert bad["ok"] is False and "flows[0].dst" in bad["error"]
    pin = ctl.request({"cmd": "pin", "flows": [{"proto": 6, "src": "10.0.0.1",
                                                "dst": "10.0.0.5", "switch": "spine2",
                                                "port": 1}]})
    assert pin["ok"] is False and "flows[0].switch" in pin["error"], pin
    ecn = ctl.request({"cmd": "ecn", "ports": [{"intf": "leaf9-eth3", "k_bytes": 30000}]})
    assert ecn["ok"] is False and "ports[0].intf" in ecn["error"], ecn
    fabric.connect(ctl.port)
    # spine2 is not in this config: it connects but is left alone (and stays empty).
    ctl.wait(lambda s: s["ready"], "configured switches programmed")
    assert fabric.flows("spine2", 0) == [] and fabric.flows("spine2", 1) == []
    assert "dpid 0x102" in ctl.log.read_text() and "not in the config" in ctl.log.read_text()
    # Several requests on one connection, one reply line each.
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(ctl.sock))
        s.sendall(b'{"cmd": "status"}\n{"cmd": "nope"}\n')
        buf = b""
        while buf.count(b"\n") < 2:
            buf += s.recv(65536)
    first, second = (json.loads(x) for x in buf.splitlines())
    assert first["ready"] is True and second["ok"] is False
    assert ctl.stop() == 0


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_bad_config_fails_fast(runtime: str, tmp_path: Path) -> None:
    cfg_path = tmp_path / "bad.json"
    cfg_path.write_text(json.dumps({"policy": "foo", "control_socket": "/tmp/x",
                                    "switches": [], "hosts": [], "links": []}))
    r = subprocess.run([runtime_python(runtime), "-m", "controllers.launch", "--runtime",
                        runtime, "--config", str(cfg_path), "--ofp-port", str(free_port())],
                       cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    known = ", ".join(policies.available())
    assert f"policy: unknown policy 'foo' (known: {known})" in r.stderr


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_runtime_shim_exports_and_never_imports_ryu_wsgi(runtime: str) -> None:
    code = ("import sys; from controllers import runtime as r; "
            "names = ['app_manager', 'ofp_event', 'CONFIG_DISPATCHER', 'MAIN_DISPATCHER', "
            "'DEAD_DISPATCHER', 'set_ev_cls', 'ofproto_v1_3', 'hub', 'cfg', 'packet', "
            "'ethernet', 'ipv4', 'tcp', 'udp', 'icmp', 'RUNTIME_NAME', 'RUNTIME_VERSION']; "
            "missing = [n for n in names if not hasattr(r, n)]; "
            "import controllers.fabric_app; "
            "w = sys.modules.get('ryu.app.wsgi'); "
            "print(r.RUNTIME_NAME, r.RUNTIME_VERSION, r.ofp_event.__name__.split('.')[0], "
            "missing, 'placeholder' if w is None or getattr(w, 'FABRICLAB_PLACEHOLDER', 0) "
            "else 'REAL', 'webob' in sys.modules)")
    out = subprocess.run([runtime_python(runtime), "-W", "ignore", "-c", code], cwd=str(REPO),
                         env=dict(os.environ, PYTHONPATH=str(REPO), FABRICLAB_RUNTIME=runtime),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    name, version, pkg, missing, wsgi, webob = out.stdout.split(maxsplit=5)
    assert (name, pkg, missing) == (runtime, {"os-ken": "os_ken", "ryu": "ryu"}[runtime], "[]")
    assert version[0].isdigit()
    assert wsgi == "placeholder" and webob.strip() == "False"
