"""One fabric split over two machines (two VMs with their own kernels), on real packets:
paths as on one machine, bytes reconciled across every tunnel, faults on a cut link, the
controller's resync, and nothing left on any worker after a ``kill -9`` and ``clean``."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from lab.machine.vmcluster import GUEST_CLUSTER_FILE as CLUSTER
from tests.integration.support import ABS_TOL, REL_TOL, check_links_agree_with_flows

pytestmark = pytest.mark.cluster


def tunnel_hops(r: dict) -> list[tuple[str, str, str]]:
    """(flow, switch, next switch) for every tunnel a flow's forward path crosses."""
    where = r["cluster"]["placement"]
    return [(f["id"], a, b) for f in r["flows"] for a, b in itertools.pairwise(f["path"])
            if where[a] != where[b]]


def split_and_one(lane, scenario: str, policy: str, *extra: str) -> tuple[dict, dict]:
    """The same run split over the cluster and on the head alone."""
    args = ("--policy", policy, "--seed", "3", *(extra or ("--duration", "5")))
    split = lane.run(f"/root/{scenario}-{policy}-split", scenario, *args)
    one = lane.run(f"/root/{scenario}-{policy}-one", scenario, *args, cluster=False)
    return split, one


def check_split_as_one_machine(lane, split: dict, one: dict, out: str) -> None:
    """What a split run must show against the same run on one machine: hosts with their
    switch, every flow on its one-machine path, bytes reconciled across every tunnel a flow
    crosses and on every link, clocks known, a report that draws the tunnels, and nothing
    left on either worker."""
    where = split["cluster"]["placement"]
    hosts = {h["name"] for h in split["topology"]["hosts"]}
    assert all(where[ln["a"]] == where[ln["b"]] for ln in split["topology"]["links"]
               if ln["a"] in hosts), where                # a host stays with its switch
    # Every flow took the path it takes on one machine (the policy decides, not the split).
    assert {f["id"]: f["path"] for f in split["flows"]} == \
        {f["id"]: f["path"] for f in one["flows"]}
    assert all(f["path_clean"] and f["bytes"] > 0 for f in split["flows"])
    # Bytes agree on both sides of every tunnel a flow crosses, and on every link.
    hops = tunnel_hops(split)
    assert hops, "no flow crossed a tunnel"
    # What entered a tunnel came out of it: nothing appears on the far side (frames are
    # counted alike on both: one frame per packet in a cluster), and what is missing there
    # stays within what a link is held to against its flows on one machine (under TCG the
    # workers run at 0 % idle and their datapaths lose a few packets; a valid run's
    # fidelity check holds it to zero).
    flows = {f["id"]: f for f in split["flows"]}
    for fid, a, b in hops:
        sent, came = flows[fid]["hop_bytes"][a], flows[fid]["hop_bytes"][b]
        assert 0 <= sent - came <= max(ABS_TOL, REL_TOL * sent), (fid, a, b, sent, came)
    assert check_links_agree_with_flows(split) == []
    tunnels = split["cluster"]["tunnels"]
    assert {(t["node"], t["peer"]) for t in tunnels} >= {(a, b) for _, a, b in hops}
    # A tunnel drops only at its configured queue (a hash-l3 collision fills it): one that
    # dropped had its queue seen at least half full; the NIC between the workers, nothing.
    limit = {(ln[a], ln[b]): ln["queue_bytes"] for ln in split["topology"]["links"]
             for a, b in (("a", "b"), ("b", "a"))}
    links = {(e["node"], e["peer"]): e for e in split["links"]}
    for t in tunnels:
        if t["drops"]:
            seen = max(links[(t["node"], t["peer"])]["series"]["queue_bytes"], default=0)
            assert seen >= limit[(t["node"], t["peer"])] / 2, (t, seen)
    assert not [n for n in split["fidelity"]["notes"] if "NIC" in n], split["fidelity"]
    # Clocks known well enough to place every worker's samples.
    (clock,) = split["cluster"]["clock"].values()
    assert clock["error_ms"] + abs(clock["drift_ms"]) < 50, clock
    assert set(split["cluster"]["fidelity"]) == {"w1", "w2"}
    assert all(e["up"] for e in split["links"])          # a tunnel is up like a veth
    # The report of a split run draws its tunnels (one direction per entry).
    lane.sh(f"fabriclab report {out}")
    index = json.loads(lane.sh(f"cat {out}/plots/index.json").stdout)
    (wmap,) = [p for p in index["plots"] if p["kind"] == "weathermap"]
    assert "tunnel" in wmap["legend"]
    assert f"the {len(tunnels)} directions that are tunnels" in wmap["caption"]
    for w in (1, 2):
        assert lane.leftovers(w) == {"bridges": [], "interfaces": [], "records": [],
                                     "processes": []}


@pytest.mark.parametrize("policy", ["hash5", pytest.param("hash-l3",
                                                           marks=pytest.mark.cluster_full)])
def test_ecmp_basic_split_takes_the_paths_of_one_machine(lane, policy: str) -> None:
    split, one = split_and_one(lane, "ecmp-basic", policy)
    where = split["cluster"]["placement"]
    assert where["leaf1"] != where["leaf2"], where        # the leaves on two machines
    check_split_as_one_machine(lane, split, one, f"/root/ecmp-basic-{policy}-split")


@pytest.mark.cluster_full          # 8.5 minutes a policy under TCG: make test-cluster only
@pytest.mark.parametrize("policy", ["hash5", "hash-l3"])
def test_polarisation_fat_tree_split_by_pods_takes_the_paths_of_one_machine(
        lane, policy: str) -> None:
    split, one = split_and_one(lane, "ecmp-polarisation", policy)
    where = split["cluster"]["placement"]
    pods: dict[int, set[str]] = {}
    for sw in split["topology"]["switches"]:
        if sw.get("pod") is not None:
            pods.setdefault(sw["pod"], set()).add(where[sw["name"]])
    assert len(pods) == 4 and all(len(w) == 1 for w in pods.values()), pods   # pods whole
    assert {w for (w,) in pods.values()} == {"w1", "w2"}, pods                 # and split
    check_split_as_one_machine(lane, split, one, f"/root/ecmp-polarisation-{policy}-split")


@pytest.mark.cluster_full          # 5 minutes under TCG: make test-cluster only
def test_allreduce_ring_crosses_the_workers_as_on_one_machine(lane) -> None:
    split, one = split_and_one(lane, "allreduce-ecmp", "hash5", "--set", "job.steps=8")
    where = split["cluster"]["placement"]
    (w2_clock,) = split["cluster"]["clock"].values()
    for name, details in split["phase_details"].items():
        m = split["metrics"]["phases"][name]
        assert m["errors"] == [], (name, m["errors"])      # every rank's output came back
        assert {where[h] for h in m["hosts"]} == {"w1", "w2"}, (name, m["hosts"])
        ring = [f for f in details["flows"] if f["kind"] == "allreduce"]
        assert ring and all(f["path_clean"] and f["bytes"] > 0 for f in ring), name
        # Each connection on its one-machine path, and the ring crosses the tunnels.
        alone = one["phase_details"][name]["flows"]
        assert {f["id"]: f["path"] for f in ring} == \
            {f["id"]: f["path"] for f in alone if f["kind"] == "allreduce"}, name
        hops = tunnel_hops({"flows": ring, "cluster": split["cluster"]})
        assert hops, name
        flows = {f["id"]: f for f in ring}
        for fid, a, b in hops:
            sent, came = flows[fid]["hop_bytes"][a], flows[fid]["hop_bytes"][b]
            assert 0 <= sent - came <= max(ABS_TOL, REL_TOL * sent), (fid, a, b, sent, came)
        assert check_links_agree_with_flows({**details, "topology": split["topology"]}) == []
        assert m["steps"] == one["metrics"]["phases"][name]["steps"], name
        # Every rank stamped its steps on the head's clock: a ring's ranks end a step
        # together (within 0.15 s under TCG), and so do the two machines' ranks on
        # average, though their clocks are a boot apart.
        out = f"/root/allreduce-ecmp-hash5-split/job/{name}"
        ranks = [json.loads(lane.sh(f"cat {out}/rank{r}.json").stdout)
                 for r in range(len(m["hosts"]))]
        assert abs(w2_clock["offset_s"]) > 0.5, w2_clock
        for k in range(len(ranks[0]["steps"])):
            ends = {w: [rk["steps"][k]["t_end"] for h, rk in zip(m["hosts"], ranks,
                                                                 strict=True) if where[h] == w]
                    for w in ("w1", "w2")}
            mean = {w: sum(e) / len(e) for w, e in ends.items()}
            assert abs(mean["w1"] - mean["w2"]) < 0.2, (name, k, ends)


@pytest.mark.cluster_full
def test_fault_on_a_cut_link_and_controller_resync(lane) -> None:
    # The controller is back long before the traffic ends: under TCG its restart took up
    # to 15 s (an 8 s run ended while it was still starting).
    faults = "faults=[{at: 1.5, link: leaf1-spine2}, {at: 3.5, controller: kill, for: 2}]"
    r = lane.run("/root/faults-split", "ecmp-basic", "--policy", "hash5", "--seed", "3",
                 "--duration", "30", "--set", f"'{faults}'")
    where = r["cluster"]["placement"]
    assert where["leaf1"] != where["spine2"]                  # the failed link is a tunnel
    f, s = r["faults"], r["metrics"]["faults"]
    assert not f["errors"], f["errors"]
    assert s["link_changes"] == 1 and s["unanswered_link_changes"] == 0, f["reactions"]
    assert s["flows_black_holed"] == []
    (c,) = f["controller_restarts"]
    assert (c["lost"], c["new"], c["duplicated"], c["counters_reset"]) == (0, 0, 0, 0)
    # Once rerouted, leaf1 sends nothing into the dead tunnel.
    link = next(e for e in r["links"] if e["node"] == "leaf1" and e["peer"] == "spine2")
    first = next(x for x in f["reactions"] if x["fault"] == 0)
    settled = first["t_s"] + first["rerouted_s"] + 0.3
    after = sum(b * 0.1 / 8 for t, b in zip(link["series"]["t"], link["series"]["tx_bps"],
                                             strict=True) if t > settled)
    assert after < 20_000, after


@pytest.mark.cluster_full          # 1.7 minutes under TCG: make test-cluster only
def test_kill_9_of_the_head_then_clean_leaves_nothing_on_either_machine(lane) -> None:
    pid = lane.sh(f"nohup fabriclab run ecmp-basic --cluster {CLUSTER} "
                  "--policy hash5 --duration 120 --out /root/killed > /root/killed.log 2>&1 "
                  "& echo $!").stdout.strip()
    deadline = time.monotonic() + 600
    while "flows for" not in lane.sh("cat /root/killed.log").stdout:
        assert time.monotonic() < deadline, lane.sh("cat /root/killed.log").stdout
        time.sleep(5)
    before = lane.leftovers(2)
    assert before["bridges"] and before["records"], before        # it was running there
    lane.sh(f"kill -9 {pid}")
    time.sleep(2)
    out = lane.sh(f"fabriclab clean --cluster {CLUSTER}").stdout
    assert "removed run" in out, out
    for w in (1, 2):
        assert lane.leftovers(w) == {"bridges": [], "interfaces": [], "records": [],
                                     "processes": []}, w


def refused(lane, line: str) -> str:
    """A command on the head that must exit 2 with one line; that line."""
    out = lane.sh(line, check=False)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_setup_brings_a_worker_to_the_head_and_bad_workers_are_refused(lane) -> None:
    # A worker at other code is refused before anything starts, naming it and the fix.
    lane.sh("echo '# changed on w2 only' >> /fabriclab/lab/__init__.py", worker=2)
    line = refused(lane, f"fabriclab run ecmp-basic --cluster {CLUSTER} --duration 2")
    assert "workers[w2]" in line and "cluster setup" in line, line
    assert lane.leftovers(1)["records"] == [] and lane.leftovers(2)["records"] == []
    # `cluster setup` copies the head's checkout there and provisions it; then it agrees.
    out = lane.sh(f"fabriclab cluster setup {CLUSTER}").stdout
    assert "w2: lab/provision.sh" in out, out
    heads = {ln.split(":")[0]: ln.split("lab ")[1].split(",")[0]
             for ln in lane.sh(f"fabriclab cluster check {CLUSTER}").stdout.splitlines()
             if ln.startswith("[cluster] w")}
    assert len(heads) == 2 and len(set(heads.values())) == 1, heads
    # An unreachable worker: one line naming its ssh, nothing started anywhere.
    lane.sh(f"sed 's/root@192.168.77.2/root@192.168.77.9/; s/address: 192.168.77.2/address: "
            f"192.168.77.9/' {CLUSTER} > /root/unreachable.yaml")
    line = refused(lane, "fabriclab run ecmp-basic --cluster /root/unreachable.yaml "
                         "--duration 2")
    assert "workers[w2].ssh" in line and "without a password" in line, line
    for w in (1, 2):
        assert lane.leftovers(w) == {"bridges": [], "interfaces": [], "records": [],
                                     "processes": []}
