"""``fabriclab policy-check``: a policy's buckets at one switch and its polarisation on a
k=4 fat-tree, from ``lab.analysis.offline``, as text or JSON.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence

from controllers import policies
from lab.analysis.offline import (
    BucketReport,
    PolarisationReport,
    bucket_eval,
    polarisation_eval,
    synthetic_flows,
)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in rows]


def render(report: BucketReport | PolarisationReport) -> str:
    """A short text table: each measured figure beside what a random hash would give."""
    model = " [model only: the switch hashes by itself]" if report.model_only else ""
    if isinstance(report, BucketReport):
        r = report
        ports = (str(r.ports) if len(r.ports) <= 8
                 else f"[{r.ports[0]}, {r.ports[1]}, ..., {r.ports[-1]}]")
        head = (f"{r.policy} ({r.granularity}){model} at {r.switch}: {r.sets} sets of "
                f"{r.flows_per_set} flows on {len(r.ports)} ports {ports}")
        rows = [["", "measured", "random hash"],
                ["max flows on a port (mean)", f"{r.max_load_mean:.3f}",
                 f"{r.max_load_expected:.3f}"],
                ["max flows on a port (p95)", f"{r.max_load_p95:g}",
                 f"{r.max_load_p95_expected:g}"],
                ["imbalance max/mean (mean)", f"{r.imbalance_mean:.3f}",
                 f"{r.imbalance_expected:.3f}"],
                ["imbalance max/mean (p95)", f"{r.imbalance_p95:.3f}",
                 f"{r.imbalance_p95_expected:.3f}"],
                [f"P(a port > {r.fair_share} flows)", f"{r.collision_prob:.3f}",
                 f"{r.collision_expected:.3f}"]]
        share = (", ".join(f"{p}: {v:.3f}" for p, v in r.share.items()) if len(r.share) <= 8
                 else f"{min(r.share.values()):.4f}..{max(r.share.values()):.4f}")
        tail = [f"share per port {share} (max {r.share_max_dev:.1%} off uniform; "
                f"chi2 {r.chi2:.1f}, {r.chi2_dof} dof, p={r.chi2_p:.3g})",
                "verdict: " + ("WORSE than a random hash" if r.worse_than_random
                               else "no worse than a random hash")]
        return "\n".join([head, *_table(rows), *tail, *r.notes])
    p = report
    head = (f"{p.policy} ({p.granularity}){model}: {p.flows_evaluated} of {p.flows} flows "
            f"choose at {'/'.join(p.first_tier)} then at {'/'.join(p.second_tier)}")
    rows = [["first bucket", *(f"-> {y}" for y in range(p.second_buckets)), "used"]]
    for x, row in p.conditional.items():
        rows.append([str(x), *(f"{row.get(y, 0.0):.3f}" for y in range(p.second_buckets)),
                     f"{p.second_used_per_first[x]:.2f}"])
    tail = [f"NMI {p.nmi:.4f}, Cramer's V {p.cramers_v:.3f}, determined {p.determined:.3f} "
            f"(independent: 0, 0, {1 / max(1, p.second_buckets):.2f})",
            f"second-tier links used {p.second_links_used}/{p.second_links_total}"
            + (f" (idle: {', '.join(p.second_links_unused)})" if p.second_links_unused else ""),
            "verdict: " + ("POLARISED: the first choice decides the second" if p.polarised
                           else "tiers choose independently")]
    return "\n".join([head, *_table(rows), *tail, *p.notes])


# -- the CLI's policy-check -------------------------------------------------------------------

#: Flows routed through the fat-tree for the polarisation part of ``policy-check``: ~4/5 of
#: them cross the core, which puts the NMI's sampling noise near 1e-4.
CHECK_POLARISATION_FLOWS = 8000


def main_check(args: argparse.Namespace) -> int:
    """``fabriclab policy-check``: buckets and collisions at one switch with ``--ports``
    equal-cost ports, ``--sets`` sets of ``--flows`` elephants, then polarisation on a k=4
    fat-tree; text (``render``) or ``--json``. Flows run between the fat-tree's 16 hosts so
    that both parts see the same kind of traffic. Bad arguments are one line naming the
    option, like every other command's.
    """
    from lab.model.checks import check_int
    from lab.model.policies import policy_names
    from lab.net.topologies import FatTree, describe
    flows_per_set = check_int("flows", args.flows, 1, 1024)
    nports = check_int("ports", args.ports, 1, 64)
    sets = check_int("sets", args.sets, 1, max(1, 4_000_000 // flows_per_set))
    seed = check_int("seed", args.seed, 0, 2**32 - 1)
    specs = policy_names(args.policy)
    fat = describe(FatTree(k=4))
    ips = [h["ip"] for h in fat["hosts"]]
    rng = random.Random(seed)
    flows = synthetic_flows(flows_per_set * sets, rng, ips, ips)
    tier_flows = synthetic_flows(CHECK_POLARISATION_FLOWS, rng, ips, ips)
    ports = list(range(1, nports + 1))
    out = []
    for spec in specs:
        cls = policies.resolve(spec)
        buckets = bucket_eval(cls, flows, "leaf1", ports, flows_per_set, seed=seed)
        tiers = polarisation_eval(cls, tier_flows, fat, seed=seed)
        out.append((buckets, tiers))
    if args.json:
        print(json.dumps([{"policy": b.policy, "model_only": b.model_only,
                           "buckets": b.as_dict(), "polarisation": t.as_dict()}
                          for b, t in out], indent=1))
    else:
        print("\n\n".join(f"{render(b)}\n\n{render(t)}" for b, t in out))
    return 0
