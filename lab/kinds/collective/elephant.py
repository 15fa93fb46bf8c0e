"""Elephants beside the job: bulk TCP flows between hosts the job does not use, and the ECMP
collision that puts one on a ring hop's uplink.

An elephant is an iperf3 flow (``lab.workloads.traffic``) with its 5-tuple fixed in advance,
so the switches count it like every connection of the job. With ``elephant.collide`` the lab
makes the collision a per-flow hash makes with probability 1/spines certain: it pins the
elephant and the first of the job's ring connections leaving the elephant's leaf onto one
uplink of that leaf (the lowest-numbered spine), so the ring hop gets what the elephant
leaves of it. Which connection met which elephant is in the phase's pins.
"""

from __future__ import annotations

from typing import Any

from lab.kinds.collective.plan import Conn
from lab.model.errors import ScenarioError
from lab.model.flows import FlowSpec

#: The first elephant's iperf3 server port; elephant i listens on ELEPHANT_PORT + i.
ELEPHANT_PORT = 7600


def conns(pp: dict[str, Any], ips: dict[str, str], sports: list[int],
          next_index: int) -> list[Conn]:
    """The phase's elephants, each a connection counted on every switch (rank -1: no rank's)."""
    el = pp["elephant"]
    out = []
    for i, (src, dst) in enumerate(el["pairs"]):
        spec = FlowSpec(id=f"elephant{i}", src=src, dst=dst, src_ip=ips[src], dst_ip=ips[dst],
                        proto="tcp", sport=sports.pop(), dport=ELEPHANT_PORT + i,
                        rate_bps=el["mbps"] * 1e6, kind="elephant", cc=pp["job"]["cc"])
        out.append(Conn(spec, -1, 0, next_index + i))
    return out


def collision_pins(movers: list[Conn], job: list[Conn], leaf_of: dict[str, str],
                   up: dict[tuple[str, str], int], pinned: list[dict[str, Any]],
                   required: bool = True) -> list[dict[str, Any]]:
    """Pins putting each of ``movers`` (elephants, another job's connections) and the first
    ring connection (epoch 0) leaving its leaf on one uplink: the connection's own pin's if
    it has one, else the first spine's. A mover whose leaf no ring hop leaves is an error
    when ``required``, else left to the policy."""
    def pin(leaf: str, port: int, spec: FlowSpec) -> dict[str, Any]:
        return {"switch": leaf, "port": port, "proto": 6, "src": spec.src_ip,
                "dst": spec.dst_ip, "sport": spec.sport, "dport": spec.dport}

    first_spine = min((s for (_, s) in up), key=lambda s: int(s[5:]))
    held = {(p["src"], p["sport"]): p for p in pinned}
    out: list[dict[str, Any]] = []
    for m in movers:
        leaf = leaf_of[m.spec.src]
        if leaf_of[m.spec.dst] == leaf:
            continue                       # stays in its rack: no uplink to meet on
        hop = next((c for c in job if c.epoch == 0 and c.spec.kind == "allreduce"
                    and leaf_of[c.spec.src] == leaf != leaf_of[c.spec.dst]), None)
        if hop is None:
            if required:
                raise ScenarioError("elephant.collide", f"no ring hop leaves {leaf} for "
                                    f"{m.spec.id} to collide with")
            continue
        have = held.get((hop.spec.src_ip, hop.spec.sport))
        port = have["port"] if have else up[(leaf, first_spine)]
        if have is None:
            held[(hop.spec.src_ip, hop.spec.sport)] = pin(leaf, port, hop.spec)
            out.append(held[(hop.spec.src_ip, hop.spec.sport)])
        out.append(pin(leaf, port, m.spec))
    return out
