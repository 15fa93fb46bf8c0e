"""The job on PyTorch's gloo (``job.library: gloo``): its connections, found after
rendezvous, turned into the lab's flows; and what gloo did with them.

The synthetic ring's 5-tuples are the lab's, fixed before anything starts. gloo opens its
own: a full mesh per process group (one context per group, one TCP connection per rank
pair), numbered by the kernel. Each rank reports the sockets its process holds
(``lab.agents.gloorank``); both ends of a connection report it, so it is merged here by its
two endpoints, and oriented along the direction gloo's ring sends data: rank r to rank r-1
(gloo's ``allreduce.cc``: ``sendRank = rank - 1``; the lab's ring sends to r+1, which makes
no difference to the bytes or the paths' sharing). Those are the job's ``allreduce`` flows,
named as the ring's are (``r{r}e{e}``: rank r's outgoing hop in epoch e); the mesh's
other connections (``gloo-mesh``) carry only barrier tokens, and are flows too, so every
byte on a link belongs to some flow.

Pure functions over the ranks' reports and the measured flows: no network here.
"""

from __future__ import annotations

from typing import Any

from lab.kinds.collective.plan import Conn
from lab.model.flows import FlowSpec

#: The rendezvous: rank 0's fabric address, this port (TCPStore).
GLOO_PORT = 7200
#: Flow kind of a gloo connection its ring sends no data on.
MESH_KIND = "gloo-mesh"


def conns_from_reports(reports: list[dict[str, Any]], hosts: list[str],
                       ips: dict[str, str], cc: str, next_index: int) -> list[Conn]:
    """Every gloo connection of every epoch, once, oriented rank r -> r-1 where it is a ring
    hop (the data's direction), from the lower rank otherwise."""
    n = len(hosts)
    rank_of = {ips[h]: r for r, h in enumerate(hosts)}
    seen: set[frozenset[tuple[str, int]]] = set()
    out: list[Conn] = []
    for rep in reports:
        for group in rep.get("groups") or []:
            for c in group.get("connections") or []:
                a_end, b_end = (c["src"], c["sport"]), (c["dst"], c["dport"])
                key = frozenset((a_end, b_end))
                a, b = rank_of.get(a_end[0]), rank_of.get(b_end[0])
                if key in seen or a is None or b is None:
                    continue
                seen.add(key)
                if b != (a - 1) % n and (a == (b - 1) % n or b < a):
                    (a, a_end), (b, b_end) = (b, b_end), (a, a_end)
                ring_hop = b == (a - 1) % n
                e = int(group["epoch"])
                spec = FlowSpec(id=f"r{a}e{e}" if ring_hop else f"m{a}-{b}e{e}",
                                src=hosts[a], dst=hosts[b], src_ip=a_end[0], dst_ip=b_end[0],
                                proto="tcp", sport=a_end[1], dport=b_end[1], rate_bps=0.0,
                                kind="allreduce" if ring_hop else MESH_KIND, cc=cc)
                out.append(Conn(spec, a, e, next_index + len(out)))
    return sorted(out, key=lambda c: (c.epoch, c.spec.kind != "allreduce", c.rank, c.spec.id))


def connections_per_pair(conns: list[Conn], n: int) -> dict[str, Any]:
    """How many connections gloo opened per rank pair (per epoch), and in all."""
    counts: dict[tuple[int, int, int], int] = {}
    rank_of = {}
    for c in conns:
        rank_of[c.spec.src] = c.rank
    for c in conns:
        b = rank_of.get(c.spec.dst)
        if b is None:
            continue
        key = (c.epoch, min(c.rank, b), max(c.rank, b))
        counts[key] = counts.get(key, 0) + 1
    epochs = sorted({e for e, _, _ in counts})
    pairs = n * (n - 1) // 2
    per = [counts.get((e, a, b), 0) for e in epochs for a in range(n) for b in range(a + 1, n)]
    return {"min": min(per, default=0), "max": max(per, default=0), "pairs": pairs,
            "epochs": len(epochs), "total": len(conns)}


def algorithm_seen(flows: list[dict[str, Any]], n: int, size_bytes: int,
                   steps_per_epoch: dict[int, int]) -> dict[str, Any]:
    """What the bytes say gloo ran: a ring sends 2(N-1)/N·S per step on each r -> r-1
    connection and nothing but barrier tokens on the others. A connection on MPTCP is its
    subflows' bytes together."""
    ring = [f for f in flows if f["kind"] == "allreduce"]
    mesh = [f for f in flows if f["kind"] == MESH_KIND]
    per_conn: dict[str, list[float]] = {}
    for f in ring:
        conn = per_conn.setdefault(f.get("subflow_of") or f["id"], [0, f["epoch"]])
        conn[0] += f["bytes"]
    ratios = []
    for sent, epoch in per_conn.values():
        want = 2 * (n - 1) / n * size_bytes * steps_per_epoch.get(int(epoch), 0)
        if want:
            ratios.append(sent / want)
    mesh_bytes = sum(f["bytes"] + sum(f["reverse_hop_bytes"].values()) / max(
        len(f["reverse_hop_bytes"]), 1) for f in mesh)
    ring_bytes = sum(f["bytes"] for f in ring)
    is_ring = bool(ratios) and all(0.9 <= r <= 1.2 for r in ratios) \
        and mesh_bytes < 0.05 * max(ring_bytes, 1)
    return {"algorithm": "ring" if is_ring else "not a ring",
            "ring_bytes_vs_2(n-1)/n*S": [round(min(ratios, default=0), 3),
                                         round(max(ratios, default=0), 3)],
            "mesh_bytes_share": round(mesh_bytes / max(ring_bytes + mesh_bytes, 1), 4)}
