"""Splitting a fabric over workers (cluster mode / MaxiNet planning), without building it."""

import os
import subprocess
import sys

import pytest

from lab.analysis.partition import partition
from lab.model.errors import LabError, TopologyError
from lab.net.topologies import describe, make_topology

CASES = [
    ({"type": "fattree", "k": 4}, 1),
    ({"type": "fattree", "k": 4}, 2),
    ({"type": "fattree", "k": 4}, 3),
    ({"type": "fattree", "k": 4}, 4),
    ({"type": "fattree", "k": 6}, 4),
    ({"type": "fattree", "k": 8}, 3),
    ({"type": "leafspine", "spines": 2, "leaves": 4, "hosts_per_leaf": 2}, 2),
    ({"type": "leafspine", "spines": 4, "leaves": 7, "hosts_per_leaf": 3}, 3),
    ({"type": "leafspine", "spines": 1, "leaves": 3, "hosts_per_leaf": 2}, 4),
]


def desc_of(spec):
    return describe(make_topology(spec))


@pytest.mark.parametrize("spec, n", CASES)
def test_every_node_is_on_exactly_one_worker(spec, n):
    d = desc_of(spec)
    plan = partition(d, n)
    names = [s["name"] for s in d["switches"]] + [h["name"] for h in d["hosts"]]
    assert set(plan.assignment) == set(names)
    assert all(0 <= plan.assignment[x] < n for x in names)
    listed = [x for w in plan.workers for x in (*w.switches, *w.hosts)]
    assert sorted(listed) == sorted(names)          # once each, nowhere twice


@pytest.mark.parametrize("spec, n", CASES)
def test_balance_within_one_switch(spec, n):
    d = desc_of(spec)
    plan = partition(d, n)
    switches = [c[0] for c in plan.counts()]
    hosts = [c[1] for c in plan.counts()]
    assert max(switches) - min(switches) <= 1
    # Hosts ride with their switch, so host counts can differ by one switch's hosts at most.
    per_switch = max(sum(1 for ln in d["links"] if ln["b"] == s["name"]
                         and ln["a"].startswith("h")) for s in d["switches"])
    assert max(hosts) - min(hosts) <= per_switch


@pytest.mark.parametrize("spec, n", CASES)
def test_cut_links_recomputed_independently(spec, n):
    d = desc_of(spec)
    plan = partition(d, n)
    where = {x: w.index for w in plan.workers for x in (*w.switches, *w.hosts)}
    expected = {(ln["a"], ln["b"]) for ln in d["links"] if where[ln["a"]] != where[ln["b"]]}
    assert {(c.a, c.b) for c in plan.cut} == expected
    assert plan.cut_mbps == pytest.approx(sum(ln["bw_mbps"] for ln in d["links"]
                                              if (ln["a"], ln["b"]) in expected))
    for w in plan.workers:
        assert w.tunnel_mbps == pytest.approx(sum(
            ln["bw_mbps"] for ln in d["links"] if (ln["a"], ln["b"]) in expected
            and w.index in (where[ln["a"]], where[ln["b"]])))
    assert not any(c.a.startswith("h") or c.b.startswith("h") for c in plan.cut)


def test_fattree_k4_on_two_workers_cuts_only_pod_core_links():
    d = desc_of({"type": "fattree", "k": 4})
    plan = partition(d, 2)
    role = {s["name"]: s["role"] for s in d["switches"]}
    pod = {s["name"]: s["pod"] for s in d["switches"]}
    assert plan.cut and all({role[c.a], role[c.b]} == {"agg", "core"} for c in plan.cut)
    # Whole pods per worker (two each), cores spread two and two.
    for w in plan.workers:
        assert len({pod[s] for s in w.switches if role[s] != "core"}) == 2
        assert sum(role[s] == "core" for s in w.switches) == 2
    # Each core keeps its 2 links into its own worker's pods and tunnels the other 2.
    assert len(plan.cut) == 8
    assert plan.cut_mbps == pytest.approx(800.0)


def test_leafspine_spreads_leaves_and_spines():
    d = desc_of({"type": "leafspine", "spines": 2, "leaves": 4, "hosts_per_leaf": 2})
    plan = partition(d, 2)
    for w in plan.workers:
        assert sum(s.startswith("leaf") for s in w.switches) == 2
        assert sum(s.startswith("spine") for s in w.switches) == 1
    assert len(plan.cut) == 4        # each spine's two leaves on the other worker


def test_one_worker_cuts_nothing():
    d = desc_of({"type": "fattree", "k": 6})
    plan = partition(d, 1)
    assert plan.cut == () and plan.cut_mbps == 0
    assert plan.counts() == [(45, 54)]


def test_deterministic():
    d = desc_of({"type": "fattree", "k": 6})
    assert partition(d, 4) == partition(desc_of({"type": "fattree", "k": 6}), 4)


@pytest.mark.parametrize("n, words", [
    (21, "21 workers for 20 switches"),
    (0, "expected a whole number of workers"),
    (True, "expected a whole number of workers"),
])
def test_impossible_worker_counts_name_the_field(n, words):
    d = desc_of({"type": "fattree", "k": 4})
    with pytest.raises(TopologyError) as exc:
        partition(d, n)
    assert isinstance(exc.value, LabError)
    assert exc.value.field == "workers"
    assert str(exc.value).startswith("workers:") and words in str(exc.value)


# -- the CLI: `fabriclab topo ... --workers N` plans and prints, starting nothing -----------

FABRICLAB = [sys.executable, "-m", "lab.cli"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(*args):
    cmd = FABRICLAB + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)


def test_cli_prints_the_plan():
    r = run_cli("topo", "fattree", "--k", "4", "--workers", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("fattree: 20 switches, 16 hosts on 2 workers; 8 links cross workers "
                        "(tunnels), 800 Mbit/s per direction at full load")
    assert "worker 0: 10 switches, 8 hosts, tunnels 800 Mbit/s" in lines
    assert "worker 1: 10 switches, 8 hosts, tunnels 800 Mbit/s" in lines
    assert "  hosts:    h1..h8" in lines and "  hosts:    h9..h16" in lines
    tunnels = [ln for ln in lines if " - core" in ln]
    assert len(tunnels) == 8 and all(ln.strip().startswith("agg") for ln in tunnels)


def test_cli_workers_never_reaches_bring_up(monkeypatch, capsys):
    """In-process, with every way to start something booby-trapped.

    (Comparing /sys/class/net before and after is no proof here: other runs on the
    machine add and remove interfaces while the test runs.)"""
    from lab import cli, run
    from lab.machine import environment, state

    def started(*_a, **_k):
        raise AssertionError("--workers must only plan")
    for mod, name in ((run, "fabric_session"), (state, "require_root"),
                      (environment, "detect")):
        monkeypatch.setattr(mod, name, started)
    assert cli.main(["topo", "leafspine", "--spines", "2", "--leaves", "4",
                     "--workers", "2"]) == 0
    assert capsys.readouterr().out.startswith("leafspine: 6 switches, 16 hosts on 2 workers")


def test_cli_leafspine_plan_lists_cut_links():
    r = run_cli("topo", "leafspine", "--spines", "2", "--leaves", "4", "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert "  leaf1 (worker 0) - spine2 (worker 1)  100 Mbit/s" in r.stdout.splitlines()


def test_cli_too_many_workers_is_one_line_exit_2():
    r = run_cli("topo", "fattree", "--k", "4", "--workers", "21")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == ["fabriclab: error: workers: 21 workers for 20 switches: every worker "
                     "needs at least one switch to be worth a machine"]
    assert r.stdout == ""
