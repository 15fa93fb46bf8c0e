"""Split a fabric over N machines, as Mininet's cluster mode or MaxiNet would have to run it.

One machine forwards every emulated packet through one ``ovs-vswitchd`` userspace datapath
(about one core, measured), so a fabric too large for it has to be spread over several
machines ("workers"). Each worker then runs some switches, their hosts, and one end of a
tunnel (GRE or VXLAN) for every link whose two ends landed on different workers. Those cut
links are what a plan must keep small: their traffic crosses a real network between the
workers, and a worker's tunnel endpoints must carry it at full load or the emulated link is
no longer the bottleneck the experiment thinks it is.

This module only plans: it reads ``lab.net.topologies.describe`` output and starts nothing. The
plan is deterministic (the same fabric and N give the same answer on every machine, so a
plan can be checked into a lab notebook) and balanced: switch counts per worker differ by at
most one, and hosts ride with the switch they hang off (a host link is never a tunnel), so
host counts differ by at most the hosts of one switch (in the fabrics the lab builds, every
leaf or edge switch has the same number of hosts).

The method is what the structure of a Clos suggests, then a local improvement:

1. switches with hosts (leaves, fat-tree edges) are dealt out in contiguous runs in pod and
   name order, so a pod's edges share a worker where the counts allow;
2. switches without hosts (aggregation, core, spine) go, one at a time, where they have the
   most link bandwidth already, within each worker's remaining share, so an aggregation
   switch follows its pod and the cores/spines are spread over the workers;
3. swaps of two switches with the same host count (balance unchanged) are applied while one
   lowers the cut bandwidth, as Kernighan-Lin does; METIS, which MaxiNet uses, is the
   multilevel form of the same idea.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lab.model.errors import TopologyError


@dataclass(frozen=True)
class CutLink:
    """A link whose ends are on different workers: one tunnel in cluster mode."""

    a: str
    b: str
    a_worker: int
    b_worker: int
    bw_mbps: float


@dataclass(frozen=True)
class Worker:
    """What one machine runs, and the tunnel bandwidth its endpoints carry at full load.

    ``tunnel_mbps`` is per direction: every cut link can carry its rate each way at once.
    """

    index: int
    switches: tuple[str, ...]
    hosts: tuple[str, ...]
    tunnel_mbps: float


@dataclass(frozen=True)
class Partition:
    """A placement of every switch and host on one of ``len(workers)`` workers."""

    assignment: Mapping[str, int]
    workers: tuple[Worker, ...]
    cut: tuple[CutLink, ...]

    @property
    def cut_mbps(self) -> float:
        """Tunnel bandwidth of the whole plan (per direction): the sum over cut links."""
        return sum(link.bw_mbps for link in self.cut)

    def counts(self) -> list[tuple[int, int]]:
        """(switches, hosts) per worker, in worker order."""
        return [(len(w.switches), len(w.hosts)) for w in self.workers]

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``-style output and notebooks."""
        return {
            "workers": [{"index": w.index, "switches": list(w.switches), "hosts": list(w.hosts),
                         "tunnel_mbps": w.tunnel_mbps} for w in self.workers],
            "cut": [{"a": c.a, "b": c.b, "a_worker": c.a_worker, "b_worker": c.b_worker,
                     "bw_mbps": c.bw_mbps} for c in self.cut],
            "cut_mbps": self.cut_mbps,
        }


def natural_key(name: str) -> tuple[str, int]:
    """``edge10`` after ``edge9``: names carry numbers, and order must not depend on digits."""
    m = re.fullmatch(r"(.*?)(\d*)", name)
    assert m is not None
    return m.group(1), int(m.group(2) or 0)


def partition(desc: Mapping[str, Any], workers: int) -> Partition:
    """Place a described fabric on ``workers`` machines; see the module docstring for how."""
    switches = sorted((s["name"] for s in desc["switches"]), key=natural_key)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise TopologyError("workers", f"expected a whole number of workers >= 1, "
                            f"got {workers!r}")
    if workers > len(switches):
        raise TopologyError("workers", f"{workers} workers for {len(switches)} switches: "
                            "every worker needs at least one switch to be worth a machine")
    graph = _SwitchGraph(desc, switches)
    place = _deal_host_switches(graph, desc, workers)
    quota = _quotas(len(switches), workers)
    _place_hostless(graph, place, quota)
    _improve_by_swaps(graph, place)
    return _result(desc, graph, place, workers)


class _SwitchGraph:
    """Switch-to-switch link bandwidth, and which switch each host hangs off.

    Hosts are folded into their switch: moving a switch moves its hosts, so only switch
    links can ever become tunnels when hosts follow their switch.
    """

    def __init__(self, desc: Mapping[str, Any], switches: list[str]) -> None:
        self.switches = switches
        is_switch = set(switches)
        self.adj: dict[str, dict[str, float]] = {s: {} for s in switches}
        self.host_of: dict[str, str] = {}
        host_bw: dict[str, float] = {}
        for link in desc["links"]:
            a, b, bw = link["a"], link["b"], float(link["bw_mbps"])
            if a in is_switch and b in is_switch:
                self.adj[a][b] = self.adj[a].get(b, 0.0) + bw
                self.adj[b][a] = self.adj[b].get(a, 0.0) + bw
                continue
            host, sw = (a, b) if b in is_switch else (b, a)
            if sw in is_switch and bw > host_bw.get(host, -1.0):
                # A multi-homed host follows its widest link (first one on a tie).
                self.host_of[host], host_bw[host] = sw, bw
        self.hosts_on: dict[str, int] = {s: 0 for s in switches}
        for sw in self.host_of.values():
            self.hosts_on[sw] += 1

    def weight_to(self, sw: str, worker: int, place: Mapping[str, int]) -> float:
        """Link bandwidth from ``sw`` to switches already placed on ``worker``."""
        return sum(bw for n, bw in self.adj[sw].items() if place.get(n) == worker)


def _quotas(n_switches: int, workers: int) -> list[int]:
    """Switches per worker, differing by at most one (the first workers take the extra)."""
    base, extra = divmod(n_switches, workers)
    return [base + (1 if i < extra else 0) for i in range(workers)]


def _deal_host_switches(graph: _SwitchGraph, desc: Mapping[str, Any],
                        workers: int) -> dict[str, int]:
    """Switches with hosts, in contiguous runs of pod then name order.

    Contiguous runs keep a pod's edges (or neighbouring leaves) together; dealing them in
    balanced runs (again, the first workers take the extra) is what balances the hosts.
    """
    pods = {s["name"]: s.get("pod") or 0 for s in desc["switches"]}
    with_hosts = sorted((s for s in graph.switches if graph.hosts_on[s]),
                        key=lambda s: (pods[s], natural_key(s)))
    place: dict[str, int] = {}
    start = 0
    for worker, count in enumerate(_quotas(len(with_hosts), workers)):
        for sw in with_hosts[start:start + count]:
            place[sw] = worker
        start += count
    return place


def _place_hostless(graph: _SwitchGraph, place: dict[str, int], quota: list[int]) -> None:
    """Each remaining switch where it already has the most link bandwidth, within quota.

    The switch placed next is the one with the strongest pull anywhere, so aggregation
    switches (pulled by their pod's edges) settle before cores (pulled by aggregations).
    Ties go to the worker with the most room left, which is what spreads cores and spines.
    ``_deal_host_switches`` never exceeds a quota: both deal their extras to the first
    workers, and there are at least as many switches as switches with hosts.
    """
    room = [q - sum(1 for w in place.values() if w == i) for i, q in enumerate(quota)]
    todo = [s for s in graph.switches if s not in place]
    while todo:
        best: tuple[float, int, int, int] | None = None
        for order, sw in enumerate(todo):
            for worker, left in enumerate(room):
                if left <= 0:
                    continue
                score = (graph.weight_to(sw, worker, place), left, -worker, -order)
                if best is None or score > best:
                    best = score
        assert best is not None
        worker, sw = -best[2], todo[-best[3]]
        place[sw] = worker
        room[worker] -= 1
        todo.remove(sw)


def _improve_by_swaps(graph: _SwitchGraph, place: dict[str, int]) -> None:
    """Swap pairs of switches (equal host counts, so balance holds) while the cut shrinks.

    Each applied swap lowers the cut bandwidth strictly, so this ends; taking the best swap
    each round (first in name order on a tie) keeps the answer deterministic.
    """
    while True:
        best_gain, best_pair = 1e-9, None
        for i, u in enumerate(graph.switches):
            for v in graph.switches[i + 1:]:
                if place[u] == place[v] or graph.hosts_on[u] != graph.hosts_on[v]:
                    continue
                gain = _swap_gain(graph, place, u, v)
                if gain > best_gain:
                    best_gain, best_pair = gain, (u, v)
        if best_pair is None:
            return
        u, v = best_pair
        place[u], place[v] = place[v], place[u]


def _swap_gain(graph: _SwitchGraph, place: Mapping[str, int], u: str, v: str) -> float:
    """Cut bandwidth saved by exchanging the workers of ``u`` and ``v``.

    Moving u gains its links to v's worker and loses those to its own; a u-v link is cut
    before and after, and counting it in both moves would claim it twice.
    """
    wu, wv = place[u], place[v]
    gain_u = graph.weight_to(u, wv, place) - graph.weight_to(u, wu, place)
    gain_v = graph.weight_to(v, wu, place) - graph.weight_to(v, wv, place)
    return gain_u + gain_v - 2 * graph.adj[u].get(v, 0.0)


def _result(desc: Mapping[str, Any], graph: _SwitchGraph, place: Mapping[str, int],
            workers: int) -> Partition:
    """Hosts join their switch's worker; every link with ends on two workers is cut."""
    assignment = dict(place)
    hosts = [h["name"] for h in desc["hosts"]]
    for host in hosts:
        # A host with no switch link (none in a fabric the lab builds) stays with worker 0.
        assignment[host] = place.get(graph.host_of.get(host, ""), 0)
    cut = tuple(CutLink(link["a"], link["b"], assignment[link["a"]], assignment[link["b"]],
                        float(link["bw_mbps"]))
                for link in desc["links"]
                if link["a"] in assignment and link["b"] in assignment
                and assignment[link["a"]] != assignment[link["b"]])
    per_worker = []
    for i in range(workers):
        sws = tuple(s for s in graph.switches if place[s] == i)
        hs = tuple(sorted((h for h in hosts if assignment[h] == i), key=natural_key))
        tunnel = sum(c.bw_mbps for c in cut if i in (c.a_worker, c.b_worker))
        per_worker.append(Worker(index=i, switches=sws, hosts=hs, tunnel_mbps=tunnel))
    return Partition(assignment=assignment, workers=tuple(per_worker), cut=cut)


def _ranges(names: tuple[str, ...]) -> str:
    """``h1..h8, h11``: a worker's hosts on one line even for a k=8 fat-tree."""
    parts: list[str] = []
    run: list[tuple[str, int]] = []
    for name in names:
        key = natural_key(name)
        if run and key[0] == run[-1][0] and key[1] == run[-1][1] + 1:
            run.append(key)
            continue
        if run:
            parts.append(_run_text(run))
        run = [key]
    if run:
        parts.append(_run_text(run))
    return ", ".join(parts) if parts else "-"


def _run_text(run: list[tuple[str, int]]) -> str:
    first, last = run[0], run[-1]
    if len(run) == 1:
        return f"{first[0]}{first[1]}"
    return f"{first[0]}{first[1]}..{last[0]}{last[1]}"


def render(plan: Partition, desc: Mapping[str, Any]) -> str:
    """The plan as ``fabriclab topo --workers N`` prints it: per worker, then the tunnels."""
    n_sw, n_h = len(desc["switches"]), len(desc["hosts"])
    lines = [f"{desc['type']}: {n_sw} switches, {n_h} hosts on {len(plan.workers)} workers; "
             f"{len(plan.cut)} links cross workers (tunnels), {plan.cut_mbps:g} Mbit/s "
             "per direction at full load"]
    for w in plan.workers:
        lines.append(f"worker {w.index}: {len(w.switches)} switches, {len(w.hosts)} hosts, "
                     f"tunnels {w.tunnel_mbps:g} Mbit/s")
        lines.append(f"  switches: {_ranges(w.switches)}")
        lines.append(f"  hosts:    {_ranges(w.hosts)}")
    if plan.cut:
        lines.append("cut links (one tunnel each):")
        for c in plan.cut:
            lines.append(f"  {c.a} (worker {c.a_worker}) - {c.b} (worker {c.b_worker})  "
                         f"{c.bw_mbps:g} Mbit/s")
    else:
        lines.append("cut links: none")
    return "\n".join(lines)
