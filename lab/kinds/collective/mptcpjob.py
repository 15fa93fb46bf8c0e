"""The gloo job on MPTCP (``job.transport: mptcp``, ``job.subflows``): PyTorch's gloo run
unmodified under ``mptcpize``, so each of its TCP connections becomes an MPTCP connection
whose subflows the switches hash apart, as ``traffic.proto: mptcp`` does for iperf3
(:mod:`lab.workloads.mptcp`).

Why gloo only: gloo opens every epoch's connections at rendezvous, before the go, so their
subflows are up, found and watched before the window opens, and the switches count them
from their first byte. The synthetic ring opens an epoch's connections when the epoch
starts, inside the window: subflows joining then would carry bytes before they were found.

Who connects to whom is gloo's choice at rendezvous, so every rank's host announces join
ports and accepts the others' (:func:`lab.workloads.mptcp.mesh_announce`). Each connection
is then oriented as gloo's are (:mod:`lab.kinds.collective.gloo`), and its joined subflows
are flows of their own, ``subflow_of`` the connection: per-connection numbers (the ring's
bytes per hop, the epochs' collisions) add a connection's subflows up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lab.model.errors import ScenarioError
from lab.model.flows import MPTCP_MAX_SUBFLOWS
from lab.model.scenario import Param
from lab.workloads import mptcp

SCHEMA: dict[str, Param] = {
    # subflows of each of the job's connections on MPTCP, its first one counted
    "job.subflows": Param(int, 3, 64),
}
#: Subflows of a connection: its first and two joins from each end
#: (:func:`lab.workloads.mptcp.mesh_announce`), more than a 4-spine fabric's paths.
DEFAULT_SUBFLOWS = 5
#: How long the connections' subflows must stay as they are to count as all there is:
#: three times the announcements' resend time (``net.mptcp.add_addr_timeout``, 1 s here).
SETTLE_S = 3.0
#: How a phase's ``errors`` name a job the host kernel's MPTCP stalled (:func:`stalls`).
STALL = "MPTCP receive stall"


def uses(pp: dict[str, Any]) -> bool:
    """Whether a phase's job runs on MPTCP."""
    return pp["job"]["transport"] == "mptcp"


def check(pp: dict[str, Any], f: Callable[[str], str]) -> None:
    """What the job on MPTCP needs: gloo's ranks, paths left to the hash, subflows within
    the path manager's limit, and a machine that has MPTCP."""
    if not uses(pp):
        return
    job = pp["job"]
    if job["library"] != "gloo":
        raise ScenarioError(f("job.transport"), "MPTCP runs under gloo (job.library: gloo): "
                            "the synthetic ring opens an epoch's connections inside the "
                            "measurement window, before their subflows could be watched")
    if pp["placement"]["paths"] == "balanced":
        raise ScenarioError(f("job.transport"), "placement.paths balanced pins a "
                            "connection's first subflow; its joined subflows are the "
                            "kernel's, found after rendezvous and left to the hash")
    if job["subflows"] % 2 == 0:
        raise ScenarioError(f("job.subflows"), f"{job['subflows']}: gloo's connections take "
                            "joins from both ends, as many from each, so a connection has "
                            "an odd number of subflows (3, 5 or 7)")
    if job["subflows"] > MPTCP_MAX_SUBFLOWS:
        raise ScenarioError(f("job.subflows"), f"{job['subflows']} is more than the kernel "
                            f"path manager's limit of {MPTCP_MAX_SUBFLOWS} per connection "
                            "(ip mptcp limits)")
    why = mptcp.unavailable()
    if why:
        raise ScenarioError(f("job.transport"), f"mptcp: {why}")


def wrap(pp: dict[str, Any], argv: list[str]) -> list[str]:
    """A rank's command, made MPTCP when the phase's job is."""
    return [*mptcp.WRAPPER, *argv] if uses(pp) else argv


def configure(fabric: Any, pp: dict[str, Any], ips: dict[str, str]) -> None:
    """The path manager's limits in the job's hosts' namespaces ({host: address}), before
    the ranks start (the ports are announced once gloo's connections are up)."""
    if uses(pp):
        mptcp.apply(fabric, mptcp.mesh_limits(ips))


def subflow_conns(fabric: Any, pp: dict[str, Any], ips: dict[str, str], conns: list[Any],
                  next_index: int) -> list[Any]:
    """The job's hosts ({host: address}) announce their join ports to the connections
    gloo opened; every connection's joined subflows, once they have settled, as the job's
    connections to watch (each a copy of the ``plan.Conn`` it joins, which imports this
    module for its keys, with the subflow's 5-tuple); none unless on MPTCP."""
    if not uses(pp):
        return []
    mptcp.apply(fabric, mptcp.mesh_announce(ips, pp["job"]["subflows"]))
    parent = {c.spec.id: c for c in conns}
    for c in conns:
        c.spec.subflows = pp["job"]["subflows"]
    subs = mptcp.wait_subflows(fabric, [c.spec for c in conns], settle_s=SETTLE_S)
    for c in conns:     # each connection's flow says how many subflows it has
        c.spec.subflows = 1 + sum(s.subflow_of == c.spec.id for s in subs)
    return [replace(parent[s.subflow_of], index=next_index + i,
                    spec=replace(s, kind=parent[s.subflow_of].spec.kind))
            for i, s in enumerate(subs) if s.subflow_of in parent]


def stalls(fabric: Any, pp: dict[str, Any], hosts: list[str]) -> list[str]:
    """Why a job on MPTCP may have hung, read while it still hangs: each subflow holding
    bytes its connection did not take in.

    Seen on this machine's kernel (6.18) in 4 of 25 runs of gloo on MPTCP:
    a rank waited for bytes while its connection had 95 KB ready and one subflow 3.5 MB
    more, and nothing moved for 30 s. The lab names it; it does not work around it.
    """
    if not uses(pp):
        return []
    return [f"{STALL} in {h}: subflow {pip}:{pport} -> {ip}:{port} holds {n} bytes its "
            "connection did not take in (the host kernel's receive path, or a rank that "
            "stopped reading)"
            for h in hosts
            for ip, port, pip, pport, n in mptcp.held_by_subflows(mptcp.host_sockets(fabric, h))]
