"""The gloo job without a fabric: its bad input, the worker's own checks, how gloo's
connections become flows, the sockets a rank finds, and the venv's torch and NumPy."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from lab import run
from lab.agents.common import tcp_info
from lab.agents.gloorank import GlooRank, own_tcp_sockets
from lab.kinds.collective import gloo
from lab.machine import environment
from lab.model.errors import MachineError, ScenarioError
from tests.unit.test_cli_errors import assert_nothing_started, run_cli

#: IPPROTO_MPTCP (Python's socket module names it only from 3.10 on some builds).
IPPROTO_MPTCP = 262
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_TORCH = bool(environment.collective_library()["torch"])


@pytest.mark.parametrize("scenario, sets, field", [
    ("allreduce-ecmp", ["job.library=nccl"], "job.library"),
    ("allreduce-ecmp", ["library=gloo", "job.size_bytes=1048574"], "job.size_bytes"),
    ("allreduce-ecmp", ["library=gloo", "job.workers=1"], "job.workers"),
    ("allreduce-ecmp", ["library=gloo", "job.buckets=2"], "job.buckets"),
    ("allreduce-ecmp", ["phases.placed.job.library=gloo", "phases.placed.job.size_bytes=6"],
     "phases.placed.job.size_bytes"),
    ("incast-ecn", ["job.library=gloo"], "job.library"),
    ("allreduce-ecmp", ["job.transport=mptcp", "phases.placed.job.transport=tcp"],
     "job.transport"),                                         # the synthetic ring
    ("allreduce-ecmp", ["library=gloo", "job.transport=mptcp"],  # placed: pins
     "job.transport"),
    ("allreduce-mptcp", ["phases.gloo-mptcp.job.subflows=4"], "phases.gloo-mptcp.job.subflows"),
    ("allreduce-mptcp", ["phases.gloo-mptcp.job.subflows=9"], "phases.gloo-mptcp.job.subflows"),
])
def test_bad_gloo_input_names_the_field(scenario, sets, field):
    with pytest.raises(ScenarioError) as err:
        run.check_input(scenario, sets=sets)
    assert err.value.field == field, str(err.value)


def test_a_size_gloo_can_split_need_not_split_into_ring_chunks():
    """gloo splits any whole number of float32s; the synthetic ring wants N equal chunks."""
    run.check_input("allreduce-ecmp", sets=["library=gloo", "job.size_bytes=1000004"])
    with pytest.raises(ScenarioError):
        run.check_input("allreduce-ecmp", sets=["job.size_bytes=1000004"])


def test_unknown_library_on_the_command_line_exits_2_with_one_line(tmp_path):
    # Isolated as the CLI error tests are: other runs coming and going cannot fail it.
    r, interfaces = run_cli(tmp_path / "state", "run", "allreduce-ecmp", "--set",
                            "job.library=nccl")
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "job.library" in lines[0] and "synthetic, gloo" in lines[0]
    assert_nothing_started(tmp_path / "state", interfaces)


def refused_without_torch(monkeypatch, scenario: str, sets: list[str]) -> tuple[run.Plan,
                                                                                 MachineError]:
    """Prepare ``scenario`` on a machine whose probe says there is no torch: the machine
    check, before the lab's session, must refuse it with job.library."""
    from lab.kinds.collective import plan as collective
    monkeypatch.setattr(environment, "collective_library",
                        lambda: {"torch": None, "gloo": False, "numpy": None,
                                 "numpy_bridge": False})
    given = run.check_input(scenario, sets=sets)
    plan = run.Plan(given.scenario, given.kind, given.params, "hash5", given.topo_desc,
                    given.flows, environment.Environment(
                        kernel="", datapath="user", userspace_tso=True, netem=False, red=False,
                        ecn="none", delay="none", congestion_controls=["cubic", "reno"],
                        dctcp=False), "os-ken")
    with pytest.raises(MachineError) as err:
        collective.prepare(plan)
    assert err.value.field == "job.library"
    return plan, err.value


def test_gloo_without_torch_is_refused_before_anything_starts(monkeypatch):
    from lab.kinds.collective import plan as collective
    plan, err = refused_without_torch(monkeypatch, "allreduce-ecmp", ["library=gloo"])
    assert "not installed (run: make setup)" in str(err)
    # A synthetic job on the same machine is not held up.
    given = run.check_input("allreduce-ecmp")
    plan.params = given.params
    assert collective.prepare(plan)[0]


@pytest.mark.parametrize("args, field", [
    (["--world", "1", "--rank", "0", "--peers", "10.0.0.1"], "world"),
    (["--size", "6"], "size_bytes"),
    (["--peers", "10.0.0.1"], "peers"),
    (["--rank", "2"], "rank"),
])
def test_the_worker_refuses_bad_input_before_importing_torch(args, field, tmp_path):
    refuses_before_torch("gloo", {}, args, field, tmp_path)


def refuses_before_torch(cmd: str, defaults: dict[str, str], args: list[str], field: str,
                         tmp_path) -> None:
    """A gloo rank (``cmd``: gloo or ddp) given ``args`` over a valid command line exits 2
    with one line naming ``field``, before it is ready (torch would take seconds)."""
    base = {"--rank": "0", "--world": "2", "--master": "10.0.0.1:7200",
            "--peers": "10.0.0.1,10.0.0.2", "--iface": "h1-eth0", "--size": "1024",
            "--steps": "2", "--conns-out": str(tmp_path / "c.json"),
            "--ready-file": str(tmp_path / "r"), **defaults}
    for k, v in zip(args[::2], args[1::2], strict=True):
        base[k] = v
    argv = [a for kv in base.items() for a in kv]
    r = subprocess.run([sys.executable, "-m", "lab.agents.worker", cmd, *argv],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and f"error: {field}:" in r.stderr, r.stderr
    assert not (tmp_path / "r").exists()


def _report(rank: int, conns: list[tuple[int, int, int, int, int]]) -> dict:
    """A rank's report: (epoch, local rank, local port, peer rank, peer port)."""
    ip = "10.0.0.{}".format
    groups: dict[int, list] = {}
    for e, a, pa, b, pb in conns:
        groups.setdefault(e, []).append({"epoch": e, "src": ip(a + 1), "sport": pa,
                                         "dst": ip(b + 1), "dport": pb, "peer_rank": b})
    return {"rank": rank, "groups": [{"epoch": e, "connections": c}
                                     for e, c in sorted(groups.items())]}


def test_gloo_connections_become_ring_flows_oriented_along_the_data():
    hosts = ["h1", "h2", "h3", "h4"]
    ips = {h: f"10.0.0.{i + 1}" for i, h in enumerate(hosts)}
    # A full mesh of 4 ranks, each connection reported by both ends; gloo's ring sends
    # from rank r to rank r-1, so that is the direction of a ring hop's flow.
    mesh = [(0, 1, 61001, 0, 61002), (0, 1, 61003, 2, 61004), (0, 1, 61005, 3, 61006),
            (0, 0, 61007, 2, 61008), (0, 0, 61009, 3, 61010), (0, 2, 61011, 3, 61012)]
    reports = [_report(r, [(e, a, pa, b, pb) if a == r else (e, b, pb, a, pa)
                           for e, a, pa, b, pb in mesh if r in (a, b)]) for r in range(4)]
    conns = gloo.conns_from_reports(reports, hosts, ips, "cubic", next_index=10)
    assert len(conns) == 6
    ring = {c.spec.id: c for c in conns if c.spec.kind == "allreduce"}
    assert sorted(ring) == ["r0e0", "r1e0", "r2e0", "r3e0"]
    assert (ring["r1e0"].spec.src, ring["r1e0"].spec.sport) == ("h2", 61001)
    assert (ring["r1e0"].spec.dst, ring["r1e0"].spec.dport) == ("h1", 61002)
    assert (ring["r0e0"].spec.src, ring["r0e0"].spec.dst) == ("h1", "h4")
    assert all(ring[f"r{r}e0"].rank == r for r in range(4))
    mesh_ids = sorted(c.spec.id for c in conns if c.spec.kind == gloo.MESH_KIND)
    assert mesh_ids == ["m0-2e0", "m1-3e0"]
    assert sorted(c.index for c in conns) == list(range(10, 16))
    assert gloo.connections_per_pair(conns, 4) == {"min": 1, "max": 1, "pairs": 6,
                                                   "epochs": 1, "total": 6}


def test_a_rank_finds_its_own_connections_in_its_namespace():
    """own_tcp_sockets reads the namespace's TCP table and this process's descriptors."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        cli = socket.create_connection(("127.0.0.1", port))
        acc, _ = srv.accept()
        try:
            found = {(loc, rem) for _fd, loc, rem in own_tcp_sockets().values()}
            assert (cli.getsockname(), cli.getpeername()) in found
            assert (acc.getsockname(), acc.getpeername()) in found
            assert all(rem != ("0.0.0.0", 0) for _, rem in found)   # no listener
        finally:
            cli.close()
            acc.close()


def test_an_mptcp_connection_is_found_by_its_own_names_not_its_subflows():
    """Under mptcpize gloo's sockets are MPTCP: the connection is found once, by the
    socket's names (its first subflow's), which its joined subflows are found from."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        cli = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
        cli.connect(srv.getsockname())
        acc, _ = srv.accept()
        try:
            found = [(loc, rem) for _fd, loc, rem in own_tcp_sockets().values()]
            assert found.count((cli.getsockname(), cli.getpeername())) == 1
            assert found.count((acc.getsockname(), acc.getpeername())) == 1
        finally:
            cli.close()
            acc.close()


@pytest.mark.skipif(not HAS_TORCH, reason="torch " + environment.TORCH_MISSING)
def test_torch_and_matplotlib_work_in_one_interpreter():
    """Debian's torch 1.13 and the venv's matplotlib: the NumPy both need must be one."""
    code = ("import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt; "
            "import torch, torch.distributed as d; assert d.is_gloo_available(); "
            "a = torch.arange(3.0).numpy(); assert a.tolist() == [0.0, 1.0, 2.0]; "
            "plt.plot(a); print('ok')")
    r = subprocess.run([sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    lib = environment.collective_library()
    assert lib["gloo"] and lib["numpy_bridge"], lib



def _acked(sock: socket.socket, want: int) -> None:
    """Wait until TCP says ``want`` bytes of ``sock`` were acknowledged (loopback: at once)."""
    deadline = time.monotonic() + 5
    while tcp_info(sock).get("bytes_acked", 0) < want and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_gloo_ranks_connection_counters_start_at_the_go(tmp_path):
    """gloo opens its connections at rendezvous, long before the job: what the rank reports
    of each (TCP_INFO's bytes acked, retransmits, ...) and its ``t_open`` start at the
    lab's go, so rendezvous and set-up bytes are not the job's (real sockets, the real go)."""
    setup, job = 50_000, 200_000
    server = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(server.getsockname())
    receiver, _ = server.accept()
    rank = GlooRank(argparse.Namespace(seed=1, rank=0, ready_file=str(tmp_path / "ready"),
                                       connect_timeout_s=5.0))
    src, sport = sender.getsockname()
    rank.groups = [{"epoch": 0, "connections": [
        {"epoch": 0, "src": src, "sport": sport, "dst": src,
         "dport": server.getsockname()[1], "peer_rank": 1}]}]
    rank.socks = [[sender]]

    def move(n: int) -> None:
        sender.sendall(b"s" * n)
        got = 0
        while got < n:
            got += len(receiver.recv(65536))

    try:
        move(setup)                               # rendezvous: before the go
        _acked(sender, setup)
        before_go = tcp_info(sender)["bytes_acked"]
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        try:
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)   # the lab's go
            rank.wait_for_go()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, masked)
        move(job)                                 # the job: after it
        _acked(sender, before_go + job)
        rank.close()
    finally:
        for s in (receiver, server):
            s.close()
    (conn,) = rank.connections
    assert before_go >= setup
    assert conn["bytes_acked"] == job, conn
    assert conn["retransmits"] == 0
    assert rank.t_go is not None and conn["t_open"] == round(rank.t_go, 6) <= conn["t_close"]
    assert (tmp_path / "ready").read_text() == "ready\n"
