"""Settings that cannot make the GPUs wait the way they are set to: a warning each, before
anything starts.

A phase slows the storage rack, starves the loader of CPU, binds the ring to the
management NICs or slows one rank to make the GPUs wait for that reason. Some values
cannot: a storage link faster than every batch the GPUs can ask of it, loader workers that
preprocess a batch within a step's compute, a management LAN no slower than the fabric, a
slow rank whose compute is within the diagnosis's spread of the others'. The run still goes
ahead (it shows what those values do), but the user learns before it starts, not from a
diagnosis that names nothing, that the phase tests no cause. The bounds are the model's
upper limits: what is warned about cannot happen; what is not warned about may still not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from controllers.marking import TCP_MSS_BYTES, WIRE_FRAME_BYTES
from lab.analysis import gpuwait
from lab.kinds.collective.plan import phase_params
from lab.model.flowpaths import attachment
from lab.model.scenario import field_namer

if TYPE_CHECKING:
    from lab.kinds.base import Plan

#: What a byte of a batch costs on the wire in full-size TCP frames.
WIRE_PER_PAYLOAD = WIRE_FRAME_BYTES / TCP_MSS_BYTES


def warnings(plan: Plan) -> list[str]:
    """One line per setting that cannot produce the wait it is set for, naming the phase and
    the key as the user wrote it."""
    params, topo_desc = plan.params, plan.topo_desc
    raw = params.get("phases") or {}
    out = []
    for name, pp in phase_params(params).items():
        over = raw.get(name) or {}
        f = field_namer(name, over)
        for key, why in (*_data(pp), *_cpu(pp, over), *_interface(pp, topo_desc),
                         *_placement(pp, over, topo_desc), *_straggler(pp)):
            out.append(f"warning: [{name}] {f(key)}: {why}")
    return out


def storage_demand_mbps(pp: dict[str, Any]) -> dict[str, float]:
    """{storage host: the most the phase's loaders can ask of its link, Mbit/s on the wire}.

    A rank takes one batch a step, and a step is at least its compute and at least a batch's
    preprocessing spread over the loader's workers. Batch i comes from worker i mod N, and
    rank r's worker i reads from storage host (r + i) mod S (``JobSetup.loader_conns``), so
    each host serves its workers' share of every rank's batches. With no compute and no
    preprocessing the demand has no bound (infinite)."""
    ld, hosts = pp["loader"], pp["storage"]["hosts"]
    n = ld["workers"]
    per_step = max(pp["job"]["compute_s"], ld["cpu_ms"] / 1000 / n)
    batches = dict.fromkeys(hosts, 0.0)
    for r in range(pp["job"]["workers"]):
        for i in range(n):
            batches[hosts[(r + i) % len(hosts)]] += 1 / n
    bits = ld["batch_bytes"] * 8 * WIRE_PER_PAYLOAD
    return {h: (b * bits / per_step / 1e6 if per_step > 0 else float("inf"))
            for h, b in batches.items()}


def _data(pp: dict[str, Any]) -> list[tuple[str, str]]:
    rate = pp["storage"]["link_mbps"]
    if not rate:
        return []
    if not pp["loader"]["enabled"]:
        if pp["storage"]["mode"] == "off":
            return [("storage.link_mbps", "nothing reads from the storage hosts in this phase "
                     "(loader.enabled is false, storage.mode off)")]
        return []
    demand = storage_demand_mbps(pp)
    if all(rate >= d for d in demand.values()):
        most = max(demand.values())
        return [("storage.link_mbps", f"{rate:g} Mbit/s is at least the most the loaders can "
                 f"ask of a storage link ({most:.3g} Mbit/s): the GPUs will not wait for data")]
    return []


def _cpu(pp: dict[str, Any], over: dict[str, Any]) -> list[tuple[str, str]]:
    """Only where the phase itself sets the loader's CPU: the scenario's own loader is
    meant to keep up."""
    ld = pp["loader"]
    set_here = [k for k in ("workers", "cpu_ms") if k in (over.get("loader") or {})]
    if not ld["enabled"] or not set_here:
        return []
    every_ms = ld["cpu_ms"] / ld["workers"]
    if every_ms < pp["job"]["compute_s"] * 1000:
        return [(f"loader.{set_here[0]}", f"{ld['workers']} loader worker(s) preprocess a "
                 f"batch every {every_ms:g} ms, within the step's {pp['job']['compute_s'] * 1000:g}"
                 " ms of compute: the GPUs will not wait for the CPU")]
    return []


def _interface(pp: dict[str, Any], topo_desc: dict[str, Any]) -> list[tuple[str, str]]:
    if pp["job"]["interface"] != "mgmt":
        return []
    hosts = [h["name"] for h in topo_desc["hosts"]]
    fabric = min(map(float, gpuwait.host_link_rates(topo_desc, hosts)), default=0.0)
    mgmt = float(topo_desc["mgmt"]["bw_mbps"])
    if mgmt >= fabric:
        return [("job.interface", f"the management NICs ({mgmt:g} Mbit/s, topology.mgmt_bw) "
                 f"are no slower than the hosts' fabric links ({fabric:g} Mbit/s): the wrong "
                 "interface will not slow the all-reduce")]
    return []


def _placement(pp: dict[str, Any], over: dict[str, Any],
               topo_desc: dict[str, Any]) -> list[tuple[str, str]]:
    """Only where the phase itself scatters the ranks: packed, a job that does not fit in a
    rack crosses the racks' uplinks anyway, and uplinks no slower than the hosts' links
    cost a crossing ring nothing."""
    if "hosts" not in (over.get("placement") or {}) or pp["placement"]["hosts"] == "packed":
        return []
    n = pp["job"]["workers"]
    most = gpuwait.most_free_in_a_rack(topo_desc, set(pp["storage"]["hosts"]))
    host_bw = min(map(float, gpuwait.host_link_rates(topo_desc, attachment(topo_desc))),
                  default=0.0)
    uplink_bw = min(map(float, gpuwait.uplink_rates(topo_desc)), default=host_bw)
    if n > most:
        return [("placement.hosts", f"{n} ranks do not fit in one rack (at most {most} hosts "
                 "free of storage): packed, they cross the racks' uplinks too")]
    if uplink_bw >= host_bw:
        return [("placement.hosts", f"the racks' uplinks ({uplink_bw:g} Mbit/s) are no "
                 f"slower than the hosts' links ({host_bw:g} Mbit/s): crossing them costs "
                 "the ring nothing")]
    return []


def _straggler(pp: dict[str, Any]) -> list[tuple[str, str]]:
    """A slow rank the diagnosis cannot tell from the others: its compute within
    ``STRAGGLER_SPREAD`` of theirs."""
    job = pp["job"]
    if job["straggler_rank"] < 0 or not job["straggler_s"]:
        return []
    spread = (job["compute_s"] + job["straggler_s"]) / job["compute_s"] \
        if job["compute_s"] > 0 else float("inf")
    if spread <= gpuwait.STRAGGLER_SPREAD:
        return [("job.straggler_s", f"rank {job['straggler_rank']} computes "
                 f"{spread:.2f}x the others' {job['compute_s'] * 1000:g} ms, within the "
                 f"{gpuwait.STRAGGLER_SPREAD:g}x a straggler is told from them by: the "
                 "diagnosis will not name it")]
    return []
