"""What runs beside a collective phase's job, checked before anything starts: elephants
(``lab.kinds.collective.elephant``) and another job (``lab.kinds.collective.otherjob``).

``known``: the job's hosts where the placement is known before the run (packed,
interleaved), None where it is drawn when the phase runs (scattered). Each bad value is one
``ScenarioError`` naming the key as the user wrote it (``f``).
"""

from __future__ import annotations

from typing import Any

from controllers import policies
from lab.model.errors import ScenarioError
from lab.model.flowpaths import attachment


def check_elephants(pp: dict[str, Any], topo_desc: dict[str, Any], known: list[str] | None,
                    f: Any) -> None:
    """Every pair is two distinct hosts of the topology that neither store data nor (where
    the placement is known before the run) run a rank; a colliding elephant's leaf has a
    ring hop leaving it to collide with."""
    el = pp["elephant"]
    pairs = el["pairs"]
    if not pairs:
        return
    leaf_of = attachment(topo_desc)
    storage = set(pp["storage"]["hosts"])
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(h, str) for h in pair)):
            raise ScenarioError(f("elephant.pairs"), f"{pair!r}: expected [source, "
                                "destination] host names")
        src, dst = pair
        for h in pair:
            if h not in leaf_of:
                raise ScenarioError(f("elephant.pairs"), f"no host {h!r} in the topology")
            if h in storage:
                raise ScenarioError(f("elephant.pairs"), f"{h} is a storage host")
        if src == dst:
            raise ScenarioError(f("elephant.pairs"), f"{src} -> {dst}: one host")
    if known is None:
        return                              # placed when the phase runs: checked then
    hosts = known
    for src, dst in pairs:
        for h in (src, dst):
            if h in hosts:
                raise ScenarioError(f("elephant.pairs"), f"{h} runs a rank of the job; an "
                                    "elephant shares the fabric, not a GPU's own link")
    if el["collide"]:
        ring = list(zip(hosts, hosts[1:] + hosts[:1], strict=True))
        for src, dst in pairs:
            if leaf_of[src] == leaf_of[dst]:
                raise ScenarioError(f("elephant.pairs"), f"{src} -> {dst} stays in "
                                    f"{leaf_of[src]}: it crosses no uplink to collide on")
            if not any(leaf_of[a] == leaf_of[src] != leaf_of[b] for a, b in ring):
                raise ScenarioError(f("elephant.collide"), f"no ring hop leaves "
                                    f"{leaf_of[src]} ({src}'s leaf) for its elephant to "
                                    "collide with")


def check_other_job(pp: dict[str, Any], topo_desc: dict[str, Any], known: list[str] | None,
                    f: Any) -> None:
    """The other job's ranks: at least two distinct hosts of the topology, none a storage
    host, an elephant's end or (where the placement is known before the run) a host of the
    phase's job: two jobs never share a host."""
    oj = pp["other_job"]
    hosts = oj["hosts"]
    if not hosts:
        if oj["announce"]:
            raise ScenarioError(f("other_job.announce"), "there is no other job "
                                "(other_job.hosts) to tell the controller about")
        return
    names = {h["name"] for h in topo_desc["hosts"]}
    if not all(isinstance(h, str) for h in hosts) or len(hosts) < 2:
        raise ScenarioError(f("other_job.hosts"), "expected at least two host names")
    if len(set(hosts)) != len(hosts):
        raise ScenarioError(f("other_job.hosts"), "a host is named twice: one rank a host")
    busy = {h: "a storage host" for h in pp["storage"]["hosts"]}
    busy.update({h: "an elephant's end" for pair in pp["elephant"]["pairs"] for h in pair})
    busy.update({h: "a host of the phase's job: two jobs on one host" for h in known or []})
    for h in hosts:
        if h not in names:
            raise ScenarioError(f("other_job.hosts"), f"no host {h!r} in the topology")
        if h in busy:
            raise ScenarioError(f("other_job.hosts"), f"{h} is {busy[h]}")
    if pp["job"]["library"] != "synthetic" or pp["job"]["pattern"] != "ring":
        raise ScenarioError(f("other_job.hosts"), "another job runs beside the synthetic "
                            "ring (job.library: synthetic, job.pattern: ring)")


def check_job_aware(policy: str, field: str) -> None:
    """Telling the controller which job a flow is needs a policy that listens
    (``observe_jobs``, e.g. ``job-aware``); ``all`` runs every policy, most do not."""
    try:
        cls = policies.resolve(policy)
    except (policies.UnknownPolicy, ValueError):
        cls = None
    if cls is None or not hasattr(cls, "observe_jobs"):
        raise ScenarioError(field, f"policy {policy!r} is not job-aware; run with "
                            "--policy job-aware (or a policy with observe_jobs)")
