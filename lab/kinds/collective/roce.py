"""The collective kind on a lossless fabric: the ring on the lab's RoCEv2 transport
(``job.transport: roce``, a ``roce_ring`` rank per GPU) and another job's RoCE incast beside
it (``incast``: one ``roce_bw`` QP per sender into one receiver), with the roce kind's
traffic classes, PFC and DCQCN per phase (``lab.model.lossless``).

The keys and their checks are here, before anything starts; the programs are started and
read by ``lab.kinds.collective.rocejob``. What the ring on RoCE cannot do is refused naming
the key: gloo (and DDP over it) speaks TCP only; the RoCE rank has one all-reduce of one
size per step, no data loader, no slow rank, no second NIC.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from controllers import cbuild
from lab.agents import roce as roce_agent
from lab.model import lossless
from lab.model.errors import MachineError, ScenarioError
from lab.model.scenario import Param

#: What carries the ring's chunks: the kernel's TCP, the lab's RoCEv2 transport in the
#: lossless class, or the kernel's MPTCP under gloo (``lab.kinds.collective.mptcpjob``).
TRANSPORTS = ("tcp", "roce", "mptcp")

SCHEMA: dict[str, Param] = {
    **lossless.SCHEMA,
    "job.transport": Param(str, choices=TRANSPORTS),
    # another job's incast on RoCE: one QP from each sender into the receiver, started
    # incast.alone_s before the phase's job and stopped when it ends
    "incast.from": Param(list),
    "incast.to": Param(str),
    "incast.alone_s": Param(float, 0, 60),
}

DEFAULTS: dict[str, dict[str, Any]] = {
    **lossless.DEFAULTS,
    "incast": {"from": [], "to": "", "alone_s": 1.0},
}

#: (key, the value a ring on RoCE needs, what it is): what ``roce_ring`` does not do.
ROCE_RING_NEEDS = (
    ("job.library", "synthetic", "gloo speaks TCP only: its ring cannot run on RoCE"),
    ("job.pattern", "ring", "the RoCE job is the ring; an incast beside it is `incast`"),
    ("job.buckets", 1, "the RoCE rank all-reduces one bucket a step"),
    ("job.sizes", [], "the RoCE rank has one size"),
    ("job.epoch_steps", 0, "the RoCE rank keeps its one QP for the whole job"),
    ("job.interface", "fabric", "the RoCE rank runs on the fabric's NIC"),
    ("job.straggler_rank", -1, "the RoCE rank has no slow-rank option"),
    ("job.jitter_s", 0.0, "the RoCE rank's compute has no jitter"),
    ("loader.enabled", False, "the RoCE rank has no data loader"),
    ("storage.mode", "off", "storage beside a RoCE ring is not built"),
)


def uses_lossless(pp: dict[str, Any]) -> bool:
    """Whether a phase has RoCE traffic: its ring on RoCE, or an incast beside it."""
    return pp["job"]["transport"] == "roce" or bool(pp["incast"]["from"])


def _get(pp: dict[str, Any], key: str) -> Any:
    section, _, name = key.partition(".")
    return pp[section][name]


def check(pp: dict[str, Any], topo_desc: dict[str, Any], known: list[str] | None,
          any_lossless: bool, f: Callable[[str], str]) -> None:
    """A phase's RoCE settings on this topology: the ring's needs, the incast's hosts, the
    classes, PFC and marking (``lab.model.lossless.check``). ``known``: the job's hosts
    where the placement is known before the run; ``any_lossless``: whether the run lays the
    lossless class on the ports (some phase has RoCE traffic)."""
    job = pp["job"]
    if job["transport"] == "roce":
        for key, needed, why in ROCE_RING_NEEDS:
            if _get(pp, key) != needed:
                field = "job.transport" if key == "job.library" else key
                raise ScenarioError(f(field), f"{why} ({key} is {_get(pp, key)!r}; the "
                                    f"ring on RoCE needs {needed!r})")
    check_incast(pp, topo_desc, known, f)
    check_spray(pp, f)
    if not any_lossless:
        return
    if pp["storage"]["mode"] == "classes":
        raise ScenarioError(f("storage.mode"), "the fabric's ports carry the lossless and "
                            "lossy classes in this run; storage classes of a host's own "
                            "would replace them")
    n = job["workers"]
    chunk = -(-job["size_bytes"] // n)
    qp = pp["roce"]["size_bytes"] * pp["roce"]["tx_depth"]
    outstanding = max((chunk, "job.size_bytes / job.workers (a ring chunk)"),
                      (qp if pp["incast"]["from"] else 0,
                       "roce.size_bytes x roce.tx_depth (an incast QP)"))
    lossless.check(topo_desc, pp, f, outstanding, pp["ecn"]["marking"] != "off")


def check_spray(pp: dict[str, Any], f: Callable[[str], str]) -> None:
    """Spraying (``roce.spray`` > 1) takes RoCE QPs, whose per-packet source port is the
    entropy the switches hash; a pinned path is the opposite of it."""
    if pp["roce"]["spray"] <= 1:
        return
    if not uses_lossless(pp):
        raise ScenarioError(f("roce.spray"), "the phase has no RoCE QP to spray "
                            f"(job.transport is {pp['job']['transport']!r}, no incast): TCP "
                            "carries no per-packet entropy the switches could hash")
    if pp["job"]["transport"] == "roce" and pp["placement"]["paths"] == "balanced":
        raise ScenarioError(f("roce.spray"), "placement.paths balanced pins each ring QP's "
                            "5-tuple to a spine; a sprayed QP's packets take every path")


def check_incast(pp: dict[str, Any], topo_desc: dict[str, Any], known: list[str] | None,
                 f: Callable[[str], str]) -> None:
    """The incast's senders and receiver: hosts of the topology, distinct, none a rank of
    the job (where its placement is known), a storage host or the other job's."""
    inc = pp["incast"]
    if not inc["from"]:
        if inc["to"]:
            raise ScenarioError(f("incast.from"), "the incast has a receiver but no sender")
        return
    names = {h["name"] for h in topo_desc["hosts"]}
    senders, rx = inc["from"], inc["to"]
    if not all(isinstance(h, str) for h in senders) or len(set(senders)) != len(senders):
        raise ScenarioError(f("incast.from"), "expected distinct host names")
    if rx not in names:
        raise ScenarioError(f("incast.to"), f"no host {rx!r} in the topology")
    busy = {h: "a storage host" for h in pp["storage"]["hosts"]}
    busy.update({h: "a rank of the other job" for h in pp["other_job"]["hosts"]})
    busy.update({h: "a rank of the phase's job: the incast is another job's"
                 for h in known or []})
    for h in [*senders, rx]:
        field = "incast.to" if h == rx and h not in senders else "incast.from"
        if h not in names:
            raise ScenarioError(f(field), f"no host {h!r} in the topology")
        if h in busy:
            raise ScenarioError(f(field), f"{h} is {busy[h]}")
    if rx in senders:
        raise ScenarioError(f("incast.to"), f"{rx} cannot send to itself")


def build() -> tuple[Path, Path]:
    """``roce_ring`` and ``roce_bw`` built (clang, cached by source digest) before anything
    starts: a compiler's refusal is one line, not a half-started fabric."""
    try:
        return (cbuild.build("roce_ring", roce_agent.ROCE_RING),
                cbuild.build("roce_bw", roce_agent.ROCE_BW))
    except ValueError as exc:
        raise MachineError("job.transport", str(exc)) from None
