"""The ecmp kind on a running fabric: the flows for the scenario's duration, counters
before and after, faults on their schedule."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from lab.analysis import diagnose
from lab.kinds.base import Plan, Progress, bring_up
from lab.kinds.ecmp import metrics
from lab.machine.progress import Ticker
from lab.measure import headroom, queuefeed, reorder, telemetry
from lab.measure.result import flow_entries
from lab.measure.window import Window
from lab.model.flows import FlowSpec
from lab.workloads import faults, mptcp
from lab.workloads.traffic import FlowRunner

if TYPE_CHECKING:
    from lab.net.fabric import Fabric


def on_fabric(plan: Plan, fabric: Fabric, progress: Progress,
              _prepared: Any = None) -> dict[str, Any]:
    """Bring the fabric up, run every flow for the scenario's duration (faults injected on
    their schedule), and return the kind's part of result.json: the links' and flows'
    counters, the metrics and the fidelity."""
    loss = bring_up(plan, fabric, progress)
    result = traffic(plan, fabric, progress)
    result["metrics"]["pingall_loss_pct"] = loss
    if loss > 0:
        result["fidelity"]["valid"] = False
        result["fidelity"]["notes"].append(f"pingall lost {loss:.0f}% before traffic")
    return result


def traffic(plan: Plan, fabric: Fabric, progress: Progress) -> dict[str, Any]:
    """The flows (and faults) inside one measurement window on the running fabric; the
    kind's part of result.json from its counters."""
    assert fabric.controller is not None
    duration = float(plan.params["duration"])
    watch = [e for i, f in enumerate(plan.flows) for e in f.watch_entries(i)]
    fabric.controller.request({"cmd": "watch", "flows": watch})
    planned_faults = faults.parse(plan.params.get("faults"), plan.topo_desc, duration)
    runner = FlowRunner(fabric, plan.flows, fabric.run_dir, fabric.record,
                        interval_s=faults.INTERVAL_S if planned_faults else None)
    ports = telemetry.fabric_ports(plan.topo_desc)
    feed = queuefeed.feed_for(plan.policy, fabric.controller, plan.params, plan.topo_desc)
    sampler = telemetry.Sampler(ports, hz=telemetry.SAMPLE_HZ, controller=fabric.controller,
                                classes=fabric.cpu, on_queues=feed)
    bridges = [s["name"] for s in plan.topo_desc["switches"]]
    window = Window(sampler, ports, bridges)
    senders, receivers = reorder.tcp_ends(plan.flows)
    # TCP's reordering counters over the same window, at both ends of every TCP flow.
    reordering = reorder.Reordering({h: fabric.host(h) for h in senders + receivers},
                                    senders, receivers)
    injector = faults.Injector(planned_faults, fabric.controller, bridges)
    multipath = any(f.subflows > 1 for f in plan.flows)
    subflows: list[FlowSpec] = []
    try:
        if multipath:
            mptcp.configure(fabric, plan.flows)
        runner.start_servers()
        sampler.start()
        if multipath:
            injector.t0, subflows = _start_mptcp(plan, fabric, runner, duration)
        window.open()
        reordering.open()
        if not multipath:
            injector.t0 = runner.start_clients(duration)
        if planned_faults:
            injector.start()
        progress(f"[{plan.policy_label}] {len(plan.flows)} flows for {duration:g} s ..."
                 + "".join(f"\n  fault at {f.at:g} s: {f.label}" for f in planned_faults))
        # CPU idle counts from when the last client was connected: starting them is set-up.
        connected = runner.wait_connected()
        t_fid = window.t_start if connected is None else max(window.t_start,
                                                             connected - sampler.t0)
        with Ticker(duration, f"[{plan.policy_label}] traffic"):
            runner.wait(timeout_s=duration + 15)
        fabric.timings["traffic_s"] = time.monotonic() - sampler.t0 - window.t_start
        injector.stop()
        faults.restore(planned_faults)
        window.close()
        reordering.close()
        status = fabric.controller.request({"cmd": "status"})
    finally:
        if injector.is_alive():
            injector.stop()
        runner.stop()
        sampler.stop()
    runner.collect()
    result: dict[str, Any] = {
        "duration_s": round(window.measured_s, 3),
        "links": window.links(),
        "flows": flow_entries(plan.flows + subflows, window.flow_deltas(), plan.topo_desc),
        "controller": _controller(status, feed, sampler.t0 + window.t_start),
    }
    if planned_faults:
        result["faults"] = faults.report(planned_faults, injector, status, plan.flows,
                                         runner.dir, duration)
        for f in result["flows"]:
            f.update(result["faults"]["per_flow"][f["id"]])
    # The split is judged against the policy's own prediction, which reads the envelope.
    result["metrics"] = metrics.analyse({**plan.envelope(), **result},
                                        {window.name: reordering.report()} if senders else None)
    if planned_faults:
        result["metrics"]["faults"] = result["faults"]["summary"]
    result["fidelity"] = fidelity(plan, result, window.judge(t_fid, window.t_end),
                                  planned_faults)
    return result


def _controller(status: dict[str, Any], feed: queuefeed.QueueFeed | None,
                t_window: float) -> dict[str, Any]:
    """What the controller did: per-flow decisions taken, port-load samples fed to a
    load-aware policy (0 for the others), and the flows a queue-reading policy moved: when
    (seconds into the window), where, which."""
    out = {k: status.get(k) for k in ("decisions", "port_samples")}
    if feed is not None:
        out["adaptive"] = feed.report(status.get("moves", []), t_window)
    return out


def _start_mptcp(plan: Plan, fabric: Fabric, runner: FlowRunner,
                 duration: float) -> tuple[float, list[FlowSpec]]:
    """Start the MPTCP clients and watch their joined subflows; (start time, subflows).

    A joined subflow's source port is the kernel's: it is found once up and watched before
    the window opens, so that links and flows count the same packets.
    """
    assert fabric.controller is not None
    t0 = runner.start_clients(duration)
    subflows = mptcp.wait_subflows(fabric, plan.flows)
    fabric.controller.request({"cmd": "watch", "flows": [
        e for i, s in enumerate(subflows, len(plan.flows)) for e in s.watch_entries(i)]})
    return t0, subflows


def fidelity(plan: Plan, result: dict[str, Any], judged: dict[str, Any],
              planned_faults: list[Any]) -> dict[str, Any]:
    """Whether the run's numbers describe the network: the CPU had time to spare, every
    flow ran, and each flow's counters form one path; notes say why not."""
    notes: list[str] = []
    if planned_faults:
        notes.append("faults injected (a flow's counters may show two paths, and bytes sent "
                     "into a dead link are lost in the datapath): "
                     + "; ".join(f.label for f in planned_faults))
        notes += result["faults"]["errors"]
    idle_min = judged["cpu_idle_min_pct"]
    bound = headroom.cpu_verdict(judged)
    valid = bound is None
    if bound is not None:
        notes.append(f"{bound}; numbers describe the emulator")
    notes += headroom.starved_notes(judged)
    if planned_faults and result["faults"]["errors"]:
        valid = False
    errors = [f"{f['id']}: {f['error']}" for f in result["flows"] if f.get("error")]
    if errors:
        valid = False
        notes += errors
    unclean = [f["id"] for f in result["flows"] if not f["path_clean"]]
    if unclean:
        notes.append(f"flows whose counters do not form one path: {', '.join(unclean)}")
    # On OVS's kernel datapath a select group hashes the skb's hash: a flow's packet the
    # kernel sends without its socket's hash (captured: the RST answering a segment after
    # the receiver closed, 54 B) can take the other spine. Recorded; links split by counts.
    split_acks = [f["id"] for f in result["flows"] if not f.get("reverse_path_clean", True)]
    if split_acks:
        notes.append(f"flows whose reverse (ACK) counters show two paths: "
                     f"{', '.join(split_acks)}")
    # With links failing, bytes sent into a dead link are lost by design and a flow's
    # counters can show two paths, as a moved flow's do: the path-based loss check has
    # nothing sound to say then.
    moved = result["controller"].get("adaptive", {}).get("moves")
    if moved:
        notes.append(f"{len(moved)} flow moves by the policy (a moved flow's counters show "
                     "two paths)")
    unexplained = {} if planned_faults or moved else diagnose.unexplained_loss(
        {"topology": plan.topo_desc, **result})
    if unexplained:
        notes.append("bytes lost inside the switches' datapath, not in a configured queue: "
                     + ", ".join(f"{k} {v} B" for k, v in unexplained.items()))
    return {"cpu_idle_min_pct": idle_min, "cpu_idle_pct": judged["cpu_idle_pct"],
            "valid": valid, "lab_cpu_pct": judged["lab_cpu_pct"],
            "window_s": judged["window_s"], "notes": notes, "datapath_loss_bytes": unexplained,
            **headroom.cpu_fields(judged)}
