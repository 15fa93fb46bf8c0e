"""A multi-ISP BGP edge of FRR routers in Mininet hosts, on real packets.

``border1`` (AS 65000) has two parallel links to ``isp1`` (AS 65001) and one to ``isp2``
(AS 65002, with BFD); no switches: routers are linked directly by shaped veths. isp1 and isp2
both announce the CDN prefix 203.0.113.0/24 (``cdn1`` and ``cdn2`` share its anycast
address), isp1 alone announces 198.51.100.0/24 (``cdn1``), border1 announces the DC prefix
192.0.2.0/24 (``dc1``) and nothing else. Asserted from FRR's own output and the kernel's:
every session Established, 2 nexthops for isp1's prefix (``maximum-paths``) and 3 for the CDN
prefix (``multipath-relax``); pings cross; ``fib_multipath_hash_policy`` 0 puts every flow of
one host pair on one link, 1 spreads them, counted from the links' tx byte counters. Then a
run is killed with ``kill -9`` and removed by its record: no daemon, directory, interface or
namespace of it survives.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lab.machine import state
from lab.model.errors import TopologyError
from lab.model.flows import HOST_EPHEMERAL_PORTS
from lab.net import frr
from tests.integration.support import REPO

pytestmark = pytest.mark.skipif(not frr.installed(), reason="FRR is not installed "
                                "(apt-get install frr, or make setup)")

DC, ISP1_ONLY, CDN = "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"
CDN1_IP, ANYCAST_IP = "198.51.100.10", "203.0.113.10"
NODES = ("border1", "isp1", "isp2", "dc1", "cdn1", "cdn2")
OUR_INTF = re.compile(rf"({'|'.join(NODES)})-eth\d+")
#: What an FRR with default paths (or ``-N <router>``) would leave in /var/run/frr.
FRR_DEFAULT_FILES = {*NODES, "zserv.api", "bfdd.sock", "zebra.pid", "bgpd.pid", "bfdd.pid",
                     "zebra.vty", "bgpd.vty", "bfdd.vty"}
CONVERGENCE_TARGET_S = 5.0
#: A flow's burst is 20 kB; keepalives, BFD and ARP add at most a few hundred bytes per link.
FLOW_BYTES, NOISE_BYTES = 20_000, 5_000


class EdgeTopo(frr.BgpTopo):
    def build(self, hash_policy: int = 0) -> None:
        self.addRouter("border1", asn=65000, networks=[DC], maximum_paths=4,
                       multipath_relax=True, transit=False, hash_policy=hash_policy)
        self.addRouter("isp1", asn=65001, networks=[ISP1_ONLY, CDN], maximum_paths=4)
        self.addRouter("isp2", asn=65002, networks=[CDN])
        for host in ("dc1", "cdn1", "cdn2"):
            self.addEndHost(host)
        self.addBgpLink("border1", "isp1", "10.0.1.0/30")            # border1-eth0
        self.addBgpLink("border1", "isp1", "10.0.1.4/30")            # border1-eth1
        self.addBgpLink("border1", "isp2", "10.0.2.0/30", bfd=True)  # border1-eth2
        self.addBgpLink("border1", "dc1", ("192.0.2.1/24", "192.0.2.10/24"))
        self.addBgpLink("isp1", "cdn1", ("198.51.100.1/24", "198.51.100.10/24"),
                        ("203.0.113.1/24", f"{ANYCAST_IP}/24"))
        self.addBgpLink("isp2", "cdn2", ("203.0.113.1/24", f"{ANYCAST_IP}/24"))


# -- what exists on the machine, to prove that nothing is left --------------------------------
def machine_snapshot() -> dict[str, set[str]]:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {
        "root_intfs": {m.group(0) for m in OUR_INTF.finditer(links)},
        "ip_netns": {n for n in netns.split() if n in NODES},
        "var_run_frr": set(os.listdir("/var/run/frr")) if os.path.isdir("/var/run/frr")
        else set(),
    }


def assert_machine_clean(before: dict[str, set[str]]) -> None:
    """Nothing of ours outside the run dir. Other engineers may run labs (and FRR) at the same
    time, so only names this test could have created count."""
    after = machine_snapshot()
    assert not after["root_intfs"], f"interfaces in the root namespace: {after['root_intfs']}"
    assert not after["ip_netns"], f"named namespaces: {after['ip_netns']}"
    new_frr = (after["var_run_frr"] - before["var_run_frr"]) & FRR_DEFAULT_FILES
    assert not new_frr, f"FRR wrote to /var/run/frr: {new_frr}"


def netns_members(record: state.RunRecord) -> set[tuple[int, int | None]]:
    """Every process in one of the run's network namespaces (those of its node shells).

    Namespace inode numbers are recycled (another lab run may get one a moment later), so
    "gone" is checked on the processes: a namespace lives only while a process (or a bind
    mount, which ``ip netns`` would list) holds it.
    """
    inodes = set()
    for p in record.pids:
        if str(p["what"]).startswith("shell "):
            with contextlib.suppress(OSError):
                inodes.add(os.stat(f"/proc/{p['pid']}/ns/net").st_ino)
    members = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.stat(entry / "ns" / "net").st_ino in inodes:
                    members.add((int(entry.name), state.proc_start_time(int(entry.name))))
            except OSError:
                continue
    assert inodes, "no namespaces found for the run"
    return members


def assert_gone(record: state.RunRecord, members: set[tuple[int, int | None]],
                before: dict[str, set[str]]) -> None:
    alive = [p for p in record.pids if state.pid_alive(int(p["pid"]), p["start"])]
    assert not alive, f"still running: {alive}"
    assert not state.marked_pids(record.run_id), "processes with the run marker survive"
    assert not [p for p in record.paths if os.path.exists(p)], "run paths survive"
    assert not record.path.exists(), "the run record survives"
    in_netns = [pid for pid, start in members if state.pid_alive(pid, start)]
    assert not in_netns, f"processes still in the run's namespaces: {in_netns}"
    crash_dirs = [f"{p['what'].split()[1]}.{p['pid']}" for p in record.pids
                  if str(p["what"]).startswith("frr ")]
    assert not [d for d in crash_dirs if (frr.FRR_TMP / d).exists()], "FRR crash-log dirs left"
    assert_machine_clean(before)


# -- traffic -----------------------------------------------------------------------------------
SENDER = textwrap.dedent("""
    import socket, sys
    dst = sys.argv[1]
    chunk = b"x" * 1000
    for line in sys.stdin:
        proto, sport, dport = line.split()
        if proto == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("", int(sport)))
            for _ in range(20):
                s.sendto(chunk, (dst, int(dport)))
        else:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", int(sport)))
            s.settimeout(5)
            s.connect((dst, int(dport)))
            s.sendall(chunk * 20)
            s.shutdown(socket.SHUT_WR)
            s.recv(1)          # the sink closes once it has read everything
        s.close()
        print("sent", flush=True)
""")
SINK = textwrap.dedent("""
    import socket
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("", 5001))
    srv.listen(16)
    print("listening", flush=True)
    while True:
        c, _ = srv.accept()
        while c.recv(65536):
            pass
        c.close()
""")


def flows_per_link(rnet: frr.RouterNet, policy: int, sport_base: int) -> Counter:
    """Send 16 flows (8 UDP, 8 TCP) dc1 -> cdn1 one after the other; which link each took.

    The link a flow took is the one of border1's two isp1 links whose tx byte counter rose
    by the flow's bytes while it ran; real packets, kernel counters.
    """
    border1, dc1 = rnet.get("border1"), rnet.get("dc1")
    border1.set_hash_policy(policy)
    assert border1.hash_policy() == policy
    links = ["border1-eth0", "border1-eth1"]
    sender = dc1.popen([sys.executable, "-c", SENDER, CDN1_IP], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, text=True)
    taken: Counter = Counter()
    try:
        for i in range(16):
            proto = "udp" if i % 2 else "tcp"
            before = border1.tx_bytes(links)
            sender.stdin.write(f"{proto} {sport_base + i} {5001 if proto == 'tcp' else 6001}\n")
            sender.stdin.flush()
            assert sender.stdout.readline().strip() == "sent"
            time.sleep(0.02)         # let the last UDP datagrams leave the shaper
            delta = {k: v - before[k] for k, v in border1.tx_bytes(links).items()}
            busy = [k for k, v in delta.items() if v >= FLOW_BYTES]
            assert len(busy) == 1 and all(v < NOISE_BYTES for k, v in delta.items()
                                          if k not in busy), (proto, delta)
            taken[busy[0]] += 1
    finally:
        sender.stdin.close()
        sender.wait(timeout=10)
    return taken


def ping_ok(host, ip: str) -> bool:
    out = host.cmd(f"ping -c3 -i0.2 -W1 -q {ip}")
    return " 0% packet loss" in out


def check_daemons_by_record(rnet: Any, record: state.RunRecord) -> None:
    """Every daemon by PID in the record, each in its router's namespace."""
    frr_pids = [p for p in record.pids if str(p["what"]).startswith("frr ")]
    assert sorted(p["what"] for p in frr_pids) == sorted(
        f"frr {d} {r}" for r, ds in (("border1", "zebra bfdd bgpd"), ("isp1", "zebra bgpd"),
                                      ("isp2", "zebra bfdd bgpd")) for d in ds.split())
    assert {int(p["pid"]) for p in frr_pids} <= set(state.marked_pids(record.run_id))
    for r in rnet.routers:
        # Fixed source ports (below 61000) never meet a port the kernel picks itself.
        assert r.cmd("sysctl -n net.ipv4.ip_local_port_range").split() == \
            [str(p) for p in HOST_EPHEMERAL_PORTS]
        for d in r.daemons.values():
            assert os.readlink(f"/proc/{d['pid']}/ns/net") == \
                os.readlink(f"/proc/{r.pid}/ns/net")


def check_frr_view(rnet: Any, border1: Any, t0: float) -> None:
    """FRR's own view: sessions, prefixes, multipath, BFD."""
    for r in rnet.routers:
        peers = r.bgp_summary()["peers"]
        print(f"{r.name}: " + ", ".join(f"{a} {p['state']} pfxRcd={p.get('pfxRcd')}"
                                        for a, p in sorted(peers.items())))
        assert {a: p["state"] for a, p in peers.items()} == {
            str(n.address): "Established" for n in r.router.neighbors}
    isp1_peers = rnet.get("isp1").bgp_summary()["peers"]
    # border1 is no transit: it announces its DC prefix only, not isp2's routes.
    assert [p["pfxRcd"] for p in isp1_peers.values()] == [1, 1]
    frr_routes = border1.ip_routes()
    for prefix, count in ((ISP1_ONLY, 2), (CDN, 3)):
        best = [e for e in frr_routes[prefix] if e.get("selected")]
        assert best and best[0]["protocol"] == "bgp"
        assert len([nh for nh in best[0]["nexthops"] if nh.get("fib")]) == count, best
    border1.wait_bfd_up(timeout=10)
    t_bfd = time.monotonic() - t0
    print(f"BFD border1-isp2 up at {t_bfd:.2f} s")
    bfd = border1.bfd_peers()
    assert [(p["peer"], p["status"]) for p in bfd] == [("10.0.2.2", "up")], bfd


def check_hashing_and_refusal(rnet: Any, border1: Any) -> None:
    """L3 vs L4 hashing of one host pair's flows over the two parallel isp1 links; a hash
    policy the kernel does not have is refused, naming the field, and nothing changes."""
    sink = rnet.get("cdn1").popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE,
                                  text=True)
    try:
        assert sink.stdout.readline().strip() == "listening"
        l3 = flows_per_link(rnet, 0, 41000)
        l4 = flows_per_link(rnet, 1, 42000)
    finally:
        sink.kill()
        sink.wait()
    print(f"16 flows dc1->cdn1, links used: hash policy 0 (L3) {dict(l3)}; "
          f"policy 1 (L4) {dict(l4)}")
    assert len(l3) == 1, l3
    assert len(l4) == 2, l4

    # A value the kernel does not have is refused, naming the field; nothing changes.
    with pytest.raises(TopologyError) as exc:
        border1.set_hash_policy(99)
    assert exc.value.field == "routers.border1.hash_policy"
    print(f"refused: {exc.value}")
    assert border1.hash_policy() == 1
    with pytest.raises(TopologyError):
        frr.probe_hash_policy(99, "routers.border1.hash_policy")


# -- the tests ---------------------------------------------------------------------------------
def test_bgp_edge_sessions_multipath_hash_policy_and_teardown():
    before = machine_snapshot()
    with frr.router_session(EdgeTopo(hash_policy=0), "bgp-edge", lock_wait_s=120) as rnet:
        record = rnet.record
        t0 = time.monotonic()
        rnet.start()
        t_daemons = time.monotonic() - t0
        rnet.wait_established(timeout=15)
        t_established = time.monotonic() - t0
        border1 = rnet.get("border1")
        border1.wait_nexthops(ISP1_ONLY, 2, timeout=15)
        border1.wait_nexthops(CDN, 3, timeout=15)
        t_routes = time.monotonic() - t0
        print(f"\nFRR daemons up {t_daemons:.2f} s after start; all sessions Established at "
              f"{t_established:.2f} s; multipath routes in border1's kernel at {t_routes:.2f} s "
              f"(target <= {CONVERGENCE_TARGET_S:g} s)")
        assert t_routes <= CONVERGENCE_TARGET_S

        check_daemons_by_record(rnet, record)
        check_frr_view(rnet, border1, t0)

        # The kernel's view (ip route in border1's namespace).
        isp1_hops = border1.kernel_nexthops(ISP1_ONLY)
        cdn_hops = border1.kernel_nexthops(CDN)
        print(f"kernel {ISP1_ONLY}: {isp1_hops}\nkernel {CDN}: {cdn_hops}")
        assert sorted(h["dev"] for h in isp1_hops) == ["border1-eth0", "border1-eth1"]
        assert sorted(h["dev"] for h in cdn_hops) == [
            "border1-eth0", "border1-eth1", "border1-eth2"]

        # End to end across the edge: the DC host reaches both CDN prefixes.
        dc1 = rnet.get("dc1")
        assert ping_ok(dc1, CDN1_IP) and ping_ok(dc1, ANYCAST_IP)
        check_hashing_and_refusal(rnet, border1)

        # Stopping one router's daemons by PID: border1 drops to isp1's two nexthops.
        t_stop = time.monotonic()
        rnet.get("isp2").stop_daemons()
        border1.wait_nexthops(CDN, 2, timeout=5)
        print(f"isp2's daemons stopped by PID: {CDN} down to isp1's 2 nexthops in "
              f"{time.monotonic() - t_stop:.2f} s (bgpd's Cease on SIGTERM, not BFD)")
        assert sorted(h["dev"] for h in border1.kernel_nexthops(CDN)) == [
            "border1-eth0", "border1-eth1"]
        members = netns_members(record)
    t_left = time.monotonic()
    assert_gone(record, members, before)
    print(f"teardown by record: {rnet.timings['stop_s']:.2f} s; nothing left "
          f"(checked in {time.monotonic() - t_left:.2f} s)")


CHILD = textwrap.dedent("""
    import time
    from lab.net import frr
    from tests.integration.test_bgp_edge import EdgeTopo
    with frr.router_session(EdgeTopo(), "bgp-edge-kill9", lock_wait_s=120) as rnet:
        rnet.start()
        rnet.wait_established(timeout=15)
        print("RECORD", rnet.record.path, flush=True)
        time.sleep(120)
""")


def test_kill9_then_remove_by_record():
    before = machine_snapshot()
    proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while not line.startswith("RECORD") and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"child ended early (rc {proc.poll()})"
        record = state.RunRecord.load(Path(line.split(maxsplit=1)[1].strip()))
        members = netns_members(record)
        frr_pids = [p for p in record.pids if str(p["what"]).startswith("frr ")]
        assert len(frr_pids) == 8
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    time.sleep(0.2)
    survivors = [p for p in frr_pids if state.pid_alive(int(p["pid"]), p["start"])]
    print(f"\nafter kill -9: {len(survivors)} of {len(frr_pids)} FRR daemons still running, "
          f"{len(members)} processes in its namespaces")
    assert survivors, "the daemons should outlive their killed owner (else nothing is tested)"
    assert not record.owner_alive()
    t0 = time.monotonic()
    removed = state.remove(record)
    print(f"removed by record in {time.monotonic() - t0:.2f} s: {removed}")
    assert_gone(record, members, before)


def test_a_hash_policy_the_kernel_lacks_is_refused_before_anything_starts():
    runs = set(state.records_dir().glob("bgp-edge-*.json"))
    with (pytest.raises(TopologyError) as exc,
          frr.router_session(EdgeTopo(hash_policy=7), "bgp-edge-bad")):
        raise AssertionError("must not get here")
    assert exc.value.field == "routers.border1.hash_policy"
    assert set(state.records_dir().glob("bgp-edge-*.json")) == runs
