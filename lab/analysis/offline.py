"""A policy class evaluated on synthetic flows, without emulation.

Why offline at all: a policy's decision is a pure function of (flow, switch, ports, seed)
(``controllers.policies.base``), so its statistics do not need a fabric. Thousands of
synthetic 5-tuples per second give the bucket distribution, the chance that N elephants
collide and whether two tiers polarise, each beside what a perfect random hash would do
(``lab.analysis.bins``: balls into bins). A few emulated runs then confirm on real packets what
thousands of offline sets have already measured; without the offline numbers, one emulated
run's imbalance cannot tell bad luck from a bad hash.

Decisions here are exactly the controller's: the same ``policy.choose`` on the same
candidate port sets (``controllers.routing``), a ``pair`` policy asked once per host pair
with the key the controller uses, and a single candidate taken without asking. A
``switch``-granularity policy (``ovs-select``) only has a *model* of the switch's hash; its
reports say so (``model_only``).
"""

from __future__ import annotations

import copy
import functools
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from controllers import config, routing
from controllers.policies.base import FlowKey, HashPolicy
from lab.analysis.bins import expected_max_load, imbalance, prob_max_at_most, prob_unbalanced
from lab.model.flows import BASE_DPORT

#: Linux's default ephemeral range (net.ipv4.ip_local_port_range), both ends included.
EPHEMERAL_PORTS = range(32768, 61000)
#: Server ports like the lab's: each iperf3 flow of a run listens on its own port from 5201.
IPERF_DPORTS = range(BASE_DPORT, BASE_DPORT + 512)
#: Protocols whose header carries ports; others get sport = dport = 0, as ``FlowKey`` says.
PORTED_PROTOS = frozenset({6, 17, 33, 132, 136})
#: Rate handed to ``placed`` when the caller gives none: an elephant filling a default host
#: link (lab.net.topobase.DEFAULT_HOST_MBPS). Only ratios matter to a load-tracking policy.
ELEPHANT_BPS = 50e6
#: A report calls two tiers polarised above this normalised mutual information. Independent
#: choices give ~1e-3 or less on a few thousand flows (sampling noise); ``hash5`` gives 1.
POLARISED_NMI = 0.1
#: Largest n^2 * s for which the balls-into-bins figures are computed exactly (~0.2 s).
EXACT_BUDGET = 70_000

PolicyArg = HashPolicy | type[HashPolicy]


# -- flows ------------------------------------------------------------------------------------

def synthetic_flows(n: int, rng: random.Random, src_ips: Sequence[str],
                    dst_ips: Sequence[str], proto: int = 6,
                    dports: Sequence[int] = IPERF_DPORTS) -> list[FlowKey]:
    """``n`` random 5-tuples between the given hosts, never from a host to itself.

    Source ports come from the ephemeral range, as a client's would; destination ports
    from ``dports`` (the lab's iperf3 ports by default; ``range(1, 65536)`` for random
    services). Deterministic for a given ``rng`` state, so tests and benchmarks repeat.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not src_ips or not dst_ips:
        raise ValueError("need at least one source and one destination address")
    if len(set(src_ips) | set(dst_ips)) < 2:
        raise ValueError("need two distinct addresses: a flow never goes from a host to itself")
    if proto in PORTED_PROTOS and not dports:
        raise ValueError("no destination ports to draw from")
    ported = proto in PORTED_PROTOS
    choice, randrange = rng.choice, rng.randrange
    lo, hi = EPHEMERAL_PORTS.start, EPHEMERAL_PORTS.stop
    flows = []
    while len(flows) < n:
        src, dst = choice(src_ips), choice(dst_ips)
        if src == dst:
            continue
        if ported:
            flows.append(FlowKey(src, dst, proto, randrange(lo, hi), choice(dports)))
        else:
            flows.append(FlowKey(src, dst, proto, 0, 0))
    return flows


# -- how the controller asks a policy ---------------------------------------------------------

def _instance(policy: PolicyArg, seed: int) -> HashPolicy:
    """The policy to read name and granularity from; a class is made with ``seed``, the
    way the controller makes it (``cls(seed=...)``)."""
    return policy(seed=seed) if isinstance(policy, type) else policy


def _fresh(policy: PolicyArg, seed: int) -> HashPolicy:
    """A policy in its initial state: a stateful policy's memory must not leak across sets
    that stand for independent experiments."""
    return policy(seed=seed) if isinstance(policy, type) else copy.deepcopy(policy)


def _placer(policy: HashPolicy) -> Callable[[FlowKey, str, int, float | None], None] | None:
    """The policy's ``placed`` hook, or None when it has none or only the base's no-op
    (skipping the call keeps the hot loop of a pure hash at full speed)."""
    method = getattr(type(policy), "placed", None)
    if method is None or method is getattr(HashPolicy, "placed", None):
        return None
    return getattr(policy, "placed", None)


def _decider(policy: HashPolicy) -> Callable[[FlowKey, str, Sequence[int]], int]:
    """``choose`` as the controller calls it for this policy's granularity.

    A ``pair`` policy is asked once per host pair, proactively, with the key
    ``FlowKey(src, dst, 0, 0, 0)`` (``controllers.plan.switch_plan``), so every flow of the
    pair gets that decision whatever its ports; ``flow`` and ``switch`` policies see the
    flow's own 5-tuple.
    """
    choose = policy.choose
    if policy.granularity != "pair":
        return choose

    def by_pair(flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        return choose(FlowKey(flow.src, flow.dst, 0, 0, 0), switch, ports)
    return by_pair


def _rates(rate_bps: float | Sequence[float], n: int) -> Sequence[float]:
    """One rate per flow, for ``placed``: a load-tracking policy weighs flows by it."""
    if isinstance(rate_bps, (int, float)):
        return [float(rate_bps)] * n
    if len(rate_bps) != n:
        raise ValueError(f"rate_bps has {len(rate_bps)} rates for {n} flows")
    return rate_bps


# -- statistics helpers -----------------------------------------------------------------------

def _p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile: a value that was actually observed."""
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)])


@dataclass(frozen=True)
class _Expectation:
    """Balls-into-bins figures for N flows on S ports: what a perfect random hash gives."""

    max_load: float
    max_load_p95: int
    prob_unbalanced: float
    exact: bool


@functools.cache
def _expectation(n: int, s: int) -> _Expectation:
    """Exact from ``lab.analysis.bins`` while that is cheap, else simulated.

    The exact counts cost about n^2 * s big-integer sums per threshold: 0.1 s at 64 flows on
    8 ports, minutes at 256 on 64. Past ``EXACT_BUDGET`` the same quantities are estimated
    from ~1M random throws (fixed seed), which is what the exact numbers describe anyway.
    """
    if n * n * s <= EXACT_BUDGET:
        p95 = next(m for m in range(n + 1) if prob_max_at_most(n, s, m) >= 0.95)
        return _Expectation(expected_max_load(n, s), p95, prob_unbalanced(n, s), True)
    rng = random.Random(0x0FF11E)
    bins = range(s)
    fair = -(-n // s)
    trials = max(2000, 1_000_000 // n)
    maxima = sorted(max(Counter(rng.choices(bins, k=n)).values()) for _ in range(trials))
    return _Expectation(sum(maxima) / trials, maxima[math.ceil(0.95 * trials) - 1],
                        sum(m > fair for m in maxima) / trials, False)


def _chi2_sf(x: float, dof: int) -> float:
    """P(chi-square with ``dof`` degrees of freedom > x), exact for integer dof.

    The closed forms (a Poisson tail for even dof, erfc plus a half-integer series for odd)
    spare a SciPy dependency for one p-value.
    """
    if dof < 1:
        return 1.0
    if x <= 0:
        return 1.0
    half = x / 2
    if dof % 2 == 0:
        terms = (math.exp(i * math.log(half) - half - math.lgamma(i + 1))
                 for i in range(dof // 2))
        return min(1.0, sum(terms))
    total = math.erfc(math.sqrt(half))
    total += sum(math.exp((i - 0.5) * math.log(half) - half - math.lgamma(i + 0.5))
                 for i in range(1, (dof - 1) // 2 + 1))
    return min(1.0, total)


def _entropy(counts: Mapping[Any, int], total: int) -> float:
    return -sum(c / total * math.log(c / total) for c in counts.values() if c)


# -- bucket distribution and collisions at one switch ----------------------------------------

@dataclass
class BucketReport:
    """One policy at one switch: N flows at a time on S ports, over many independent sets.

    Every measured figure sits beside its balls-into-bins expectation (``*_expected``): a
    perfect random hash collides too, and only a gap between the two indicts the policy.
    """

    policy: str
    granularity: str
    model_only: bool
    switch: str
    ports: list[int]
    flows_per_set: int
    sets: int
    flows_used: int
    #: Overall share of flows per port (all sets pooled); uniform is 1/S each.
    share: dict[int, float]
    #: Largest relative deviation of a port's share from 1/S (0.1 = 10 % off).
    share_max_dev: float
    chi2: float
    chi2_dof: int
    #: P(a uniform hash deviates at least this much); tiny means the buckets are biased.
    chi2_p: float
    fair_share: int
    max_load_mean: float
    max_load_p95: float
    max_load_expected: float
    max_load_p95_expected: float
    imbalance_mean: float
    imbalance_p95: float
    imbalance_expected: float
    imbalance_p95_expected: float
    #: Fraction of sets in which some port holds more than ``fair_share`` flows.
    collision_prob: float
    collision_expected: float
    #: Measured collisions or max load above the expectation by more than 3 standard
    #: errors, or a biased bucket distribution (chi2_p < 0.001).
    worse_than_random: bool
    #: The ``*_expected`` figures are exact (``lab.analysis.bins``), not simulated.
    expected_exact: bool = True
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: port keys become strings, as JSON would make them anyway."""
        out = asdict(self)
        out["share"] = {str(p): v for p, v in self.share.items()}
        return out


def _bucket_sets(ports: Sequence[int], n_flows: int,
                 flows_per_set: int) -> tuple[tuple[int, ...], int]:
    """The candidate ports in order, and how many whole sets the flows make; bad
    arguments are a ValueError naming what is wrong."""
    cand = tuple(sorted(ports))
    if not cand:
        raise ValueError("no candidate ports to evaluate")
    if len(set(cand)) != len(cand):
        raise ValueError(f"candidate ports repeat: {list(cand)}")
    if flows_per_set < 1:
        raise ValueError(f"flows_per_set must be >= 1, got {flows_per_set}")
    sets = n_flows // flows_per_set
    if sets == 0:
        raise ValueError(f"{n_flows} flows make no set of {flows_per_set}")
    return cand, sets


def _bucket_notes(template: HashPolicy, exact: bool, left_out: int) -> list[str]:
    """What a reader of a bucket report must know to read it right."""
    notes = []
    if template.granularity == "switch":
        notes.append("model only: the switch hashes by itself; this is the policy's model of "
                     "that hash, so measure the fabric's real choices from its counters")
    if template.granularity == "pair":
        notes.append("decided per host pair: every flow of a pair takes one port")
    if not exact:
        notes.append("random-hash figures simulated (the exact ones are too costly at this "
                     "size)")
    if left_out:
        notes.append(f"{left_out} flows beyond the last full set were left out")
    return notes


def bucket_eval(policy: PolicyArg, flows: Sequence[FlowKey], switch: str,
                ports: Sequence[int], flows_per_set: int, *, seed: int = 0,
                rate_bps: float | Sequence[float] = ELEPHANT_BPS) -> BucketReport:
    """Split ``flows`` into independent sets of ``flows_per_set`` and place each set at
    ``switch`` over ``ports`` (like that many elephants starting together).

    ``policy`` is an instance or a class (then made with ``seed``). Each set gets a fresh
    copy of it, so a stateful policy (one with ``placed``, told after every decision with
    the flow's ``rate_bps``) starts each experiment empty-handed. Flows beyond the last full
    set are left out (``flows_used`` says how many counted).
    """
    cand, sets = _bucket_sets(ports, len(flows), flows_per_set)
    s = len(cand)
    used = sets * flows_per_set
    rates = _rates(rate_bps, len(flows))
    index = {p: i for i, p in enumerate(cand)}
    totals = [0] * s
    max_loads: list[int] = []
    imbalances: list[float] = []
    fair = -(-flows_per_set // s)
    collided = 0
    template = _instance(policy, seed)
    for k in range(sets):
        inst = _fresh(policy, seed)
        decide, placed = _decider(inst), _placer(inst)
        counts = [0] * s
        for j in range(k * flows_per_set, (k + 1) * flows_per_set):
            flow = flows[j]
            port = decide(flow, switch, cand) if s > 1 else cand[0]
            i = index.get(port)
            if i is None:
                raise ValueError(f"policy {inst.name!r} chose port {port!r}, not one of "
                                 f"{list(cand)}")
            counts[i] += 1
            if placed is not None:
                placed(flow, switch, port, rates[j])
        for i, c in enumerate(counts):
            totals[i] += c
        top = max(counts)
        max_loads.append(top)
        imbalances.append(imbalance([float(c) for c in counts]))
        collided += top > fair
    expect = used / s
    chi2 = sum((c - expect) ** 2 / expect for c in totals)
    expect_bib = _expectation(flows_per_set, s)
    e_max, e_p95 = expect_bib.max_load, expect_bib.max_load_p95
    p_unbal = expect_bib.prob_unbalanced
    mean_max = sum(max_loads) / sets
    sd_max = math.sqrt(sum((m - mean_max) ** 2 for m in max_loads) / max(1, sets - 1))
    collision = collided / sets
    chi2_p = _chi2_sf(chi2, s - 1)
    worse = (collision > p_unbal + 3 * math.sqrt(p_unbal * (1 - p_unbal) / sets) + 1 / sets
             or mean_max > e_max + 3 * sd_max / math.sqrt(sets) + 1e-9
             or chi2_p < 1e-3)
    notes = _bucket_notes(template, expect_bib.exact, len(flows) - used)
    return BucketReport(
        policy=template.name, granularity=template.granularity,
        model_only=template.granularity == "switch", switch=switch, ports=list(cand),
        flows_per_set=flows_per_set, sets=sets, flows_used=used,
        share={p: totals[i] / used for i, p in enumerate(cand)},
        share_max_dev=max(abs(c - expect) for c in totals) / expect,
        chi2=chi2, chi2_dof=s - 1, chi2_p=chi2_p, fair_share=fair,
        max_load_mean=mean_max, max_load_p95=_p95(max_loads), max_load_expected=e_max,
        max_load_p95_expected=float(e_p95),
        imbalance_mean=sum(imbalances) / sets, imbalance_p95=_p95(imbalances),
        imbalance_expected=e_max * s / flows_per_set,
        imbalance_p95_expected=e_p95 * s / flows_per_set,
        collision_prob=collision, collision_expected=p_unbal,
        worse_than_random=bool(worse), expected_exact=expect_bib.exact, notes=notes)


# -- polarisation across two tiers ------------------------------------------------------------

@dataclass
class PolarisationReport:
    """How a flow's second equal-cost choice depends on its first.

    Choices are labelled by their position in the candidate list (the hash bucket), which
    is what a hash polarises on: in a fat-tree, bucket i at an edge switch is aggregation
    switch i of the pod, bucket j at that switch is its j-th core uplink. Independent tiers
    give every first bucket all second buckets (``second_used_per_first`` 1.0), mutual
    information near 0 and every second-tier link some flows; a second choice fully
    determined by the first gives NMI 1 and leaves links idle.
    """

    policy: str
    granularity: str
    model_only: bool
    #: Roles (or tier names) of the switches taking the first and the second choice.
    first_tier: list[str]
    second_tier: list[str]
    flows: int
    #: Flows with at least two multi-way choices on their path (the others are not counted).
    flows_evaluated: int
    first_buckets: int
    second_buckets: int
    #: {first bucket: {second bucket: share of that first bucket's flows}}
    conditional: dict[int, dict[int, float]]
    #: {first bucket: fraction of second buckets its flows used}
    second_used_per_first: dict[int, float]
    second_used_mean: float
    #: Share of flows whose second bucket is the most common one for their first bucket:
    #: 1.0 when the first choice decides the second, ~1/S2 when independent.
    determined: float
    #: I(first; second) / min(H(first), H(second)): 0 independent, 1 fully determined.
    nmi: float
    cramers_v: float
    second_links_total: int
    second_links_used: int
    #: Second-tier links (``switch:port``) offered as candidates that no flow took.
    second_links_unused: list[str]
    polarised: bool
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: bucket keys become strings, as JSON would make them anyway."""
        out = asdict(self)
        out["conditional"] = {str(x): {str(y): v for y, v in row.items()}
                              for x, row in self.conditional.items()}
        out["second_used_per_first"] = {str(x): v
                                        for x, v in self.second_used_per_first.items()}
        return out


def _controller_view(topo_desc: Mapping[str, Any]) -> Mapping[str, Any]:
    """The controller config's shape of a topology, which ``controllers.routing`` reads.

    ``lab.net.topologies.describe`` lists host links among the links and hosts without their
    switch; ``controllers.config.build`` is the one place that turns it into what the
    controller gets, so the routes here are the controller's own. A dict already in the
    controller's shape (hosts carry ``switch``) is used as it is.
    """
    hosts = topo_desc.get("hosts", [])
    if hosts and all("switch" in h for h in hosts):
        return topo_desc
    return config.build(dict(topo_desc), policy="", seed=0)


def _first_two_choices(flow: FlowKey, sw: str, dst: Mapping[str, Any],
                       routes: Mapping[str, Mapping[str, Sequence[int]]],
                       peer: Mapping[str, Mapping[int, str]], inst: HashPolicy,
                       rate: float) -> list[tuple[str, tuple[int, ...], int]]:
    """Walk ``flow`` from switch ``sw`` toward ``dst`` as the controller routes it: the
    first two multi-way choices on its way, each (switch, candidates, port taken)."""
    decide, placed = _decider(inst), _placer(inst)
    choices: list[tuple[str, tuple[int, ...], int]] = []
    for _ in range(len(routes) + 1):
        if sw == dst["switch"] or len(choices) == 2:
            break
        cand = tuple(routes[sw].get(dst["name"], ()))
        if not cand:
            break                                   # unreachable: dropped, by design
        if len(cand) > 1:
            port = decide(flow, sw, cand)
            if port not in cand:
                raise ValueError(f"policy {inst.name!r} chose port {port!r} at {sw}, not "
                                 f"one of {list(cand)}")
            choices.append((sw, cand, port))
            if placed is not None:
                placed(flow, sw, port, rate)
        else:
            port = cand[0]
        sw = peer[sw][port]
    return choices


def _dependence(joint: Mapping[tuple[int, int], int], n: int
                ) -> tuple[Counter[int], Counter[int], float, float, float, float]:
    """How much the second choice depends on the first: the marginal counts, their
    entropies, normalised mutual information and Cramer's V of the joint counts."""
    fx: Counter[int] = Counter()
    fy: Counter[int] = Counter()
    for (x, y), c in joint.items():
        fx[x] += c
        fy[y] += c
    hx, hy = _entropy(fx, n), _entropy(fy, n)
    mi = sum(c / n * math.log(c * n / (fx[x] * fy[y])) for (x, y), c in joint.items())
    nmi = max(0.0, mi / min(hx, hy)) if min(hx, hy) > 0 else 0.0
    chi2 = sum((joint.get((x, y), 0) - fx[x] * fy[y] / n) ** 2 / (fx[x] * fy[y] / n)
               for x in fx for y in fy)
    k = min(len(fx), len(fy)) - 1
    cramers_v = math.sqrt(chi2 / (n * k)) if k > 0 else 0.0
    return fx, fy, hx, hy, nmi, cramers_v


def polarisation_eval(policy: PolicyArg, flows: Sequence[FlowKey],
                      topo_desc: Mapping[str, Any], *, seed: int = 0,
                      rate_bps: float | Sequence[float] = ELEPHANT_BPS) -> PolarisationReport:
    """Route every flow hop by hop as the controller would and compare its first two
    multi-way choices (on a k=4 fat-tree: edge -> aggregation, then aggregation -> core).

    Candidates at each switch are ``controllers.routing.ecmp_routes`` of the topology
    (``describe()``'s dict or the controller config's); the next switch is the neighbour
    behind the chosen port, so the second choice is taken at the switch the first one
    actually reached. All flows share one policy instance, as on one live fabric.
    """
    topo = _controller_view(topo_desc)
    routes = routing.ecmp_routes(topo)
    peer = {sw: dict(links) for sw, links in routing.adjacency(topo).items()}
    host_of_ip = {h["ip"]: h for h in topo["hosts"]}
    roles = {s["name"]: s.get("role") for s in topo_desc.get("switches", [])}
    inst = _fresh(policy, seed)
    rates = _rates(rate_bps, len(flows))
    joint: Counter[tuple[int, int]] = Counter()
    tiers: tuple[set[str], set[str]] = (set(), set())
    offered: set[tuple[str, int]] = set()
    taken: set[tuple[str, int]] = set()
    s1 = s2 = 0
    skipped_unknown = 0
    for j, flow in enumerate(flows):
        src, dst = host_of_ip.get(flow.src), host_of_ip.get(flow.dst)
        if src is None or dst is None:
            skipped_unknown += 1
            continue
        choices = _first_two_choices(flow, src["switch"], dst, routes, peer, inst, rates[j])
        if len(choices) < 2:
            continue
        (sw1, c1, p1), (sw2, c2, p2) = choices
        joint[c1.index(p1), c2.index(p2)] += 1
        s1, s2 = max(s1, len(c1)), max(s2, len(c2))
        tiers[0].add(roles.get(sw1) or sw1.rstrip("0123456789_-."))
        tiers[1].add(roles.get(sw2) or sw2.rstrip("0123456789_-."))
        offered.update((sw2, p) for p in c2)
        taken.add((sw2, p2))
    n = sum(joint.values())
    if n == 0:
        raise ValueError("no flow meets two multi-way choices on its path: polarisation needs "
                         "two tiers of equal-cost choices (a fat-tree's edge and aggregation "
                         "switches, with flows between pods), which a leaf-spine does not have")
    fx, _fy, hx, hy, nmi, cramers_v = _dependence(joint, n)
    conditional = {x: {y: joint[x, y] / fx[x] for y in range(s2) if joint.get((x, y))}
                   for x in sorted(fx)}
    used = {x: len(row) / s2 for x, row in conditional.items()}
    determined = sum(max(joint.get((x, y), 0) for y in range(s2)) for x in fx) / n
    notes = []
    if inst.granularity == "switch":
        notes.append("model only: the switches hash by themselves; this is the policy's "
                     "model of their hash")
    if skipped_unknown:
        notes.append(f"{skipped_unknown} flows had an address that is no host of the topology")
    if n < len(flows) - skipped_unknown:
        notes.append(f"{len(flows) - skipped_unknown - n} flows met fewer than two multi-way "
                     f"choices (same edge switch or same pod) and are not counted")
    if min(hx, hy) == 0:
        notes.append("every flow took one bucket at a tier: nothing to correlate")
    return PolarisationReport(
        policy=inst.name, granularity=inst.granularity,
        model_only=inst.granularity == "switch",
        first_tier=sorted(tiers[0]), second_tier=sorted(tiers[1]), flows=len(flows),
        flows_evaluated=n, first_buckets=s1, second_buckets=s2, conditional=conditional,
        second_used_per_first=used, second_used_mean=sum(used.values()) / len(used),
        determined=determined, nmi=nmi, cramers_v=cramers_v,
        second_links_total=len(offered), second_links_used=len(taken),
        second_links_unused=[f"{sw}:{p}" for sw, p in sorted(offered - taken)],
        polarised=nmi > POLARISED_NMI, notes=notes)


# -- speed ------------------------------------------------------------------------------------

def throughput(policy: PolicyArg, n: int = 200_000, *, seed: int = 0,
               ports: Sequence[int] = (1, 2)) -> float:
    """Decisions per second of ``policy.choose`` (plus ``placed``, if the policy keeps
    state) on ``n`` synthetic flows between 16 hosts, at one switch with ``ports``.

    This is the evaluator's hot loop, nothing else: the flows are made before the clock
    starts, and the calls are exactly the policy's own, so a faster number can only come
    from a faster policy.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ips = [f"10.0.0.{i}" for i in range(1, 17)]
    flows = synthetic_flows(n, random.Random(seed), ips, ips)
    inst = _fresh(policy, seed)
    decide, placed = _decider(inst), _placer(inst)
    cand = tuple(sorted(ports))
    switch = "leaf1"
    t0 = time.perf_counter()
    if placed is None:
        for flow in flows:
            decide(flow, switch, cand)
    else:
        for flow in flows:
            placed(flow, switch, decide(flow, switch, cand), ELEPHANT_BPS)
    elapsed = time.perf_counter() - t0
    return n / elapsed if elapsed > 0 else float("inf")


