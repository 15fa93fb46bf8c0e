"""Per-flow end-to-end view of a run: which links each flow crossed and where it lost bytes.

"Every link is up" says nothing about a flow. Each switch on a flow's path counted that
flow's bytes, so the bytes one switch counted and the next one did not are the flow's loss
on the link between them. Summed over flows, that points at the congested link; the link's
own queue drop counter confirms it. This is the lesson of the live-streaming incident:
monitor service per flow, not devices.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.analysis import pauses
from lab.model import result as result_file
from lab.model.errors import ScenarioError
from lab.model.flowpaths import adjacency, link_bytes


def load_result(path: str | Path) -> dict[str, Any]:
    """A result.json, given the file or its run directory; a bad one is one error on the
    command's ``result`` argument, naming the file and what is wrong."""
    try:
        return result_file.load_result(path)
    except result_file.ResultError as exc:
        raise ScenarioError("result", str(exc)) from None


def flow_losses(flow: dict[str, Any], adj: dict[str, dict[str, int]]) -> dict[str, int]:
    """{"a->b": bytes this flow lost on that link} along its (data-direction) path."""
    return {f"{a}->{b}": max(0, entered - arrived)
            for (a, b), (entered, arrived) in _flow_links(flow, "", adj).items()}


def _flow_links(flow: dict[str, Any], direction: str,
                adj: dict[str, dict[str, int]]) -> dict[tuple[str, str], tuple[int, int]]:
    """The flow's (entered, arrived) per link in one direction (``""`` or ``"reverse_"``),
    from its counters (``flowpaths.link_bytes``: right for a flow seen on two paths too)."""
    path = flow.get(f"{direction}path", [])
    return link_bytes(flow.get(f"{direction}hop_bytes", {}), path[0], adj) if path else {}


def link_balance(result: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per switch-to-switch link: bytes its flows brought to the sending switch, bytes the
    port sent, bytes the receiving switch counted.

    entered - sent is lost at the sending port (its queue: a configured drop); sent -
    arrived never reached the next switch's pipeline although it left on the wire: loss
    inside the emulator's datapath, which the lab must not pass off as network behaviour.
    """
    sent = {(ln["node"], ln["peer"]): ln["tx_bytes"] for ln in result["links"]}
    adj = adjacency(result["topology"])
    out: dict[str, dict[str, int]] = {}
    for f in result["flows"]:
        for direction in ("", "reverse_"):
            for (a, b), (entered, arrived) in _flow_links(f, direction, adj).items():
                e = out.setdefault(f"{a}->{b}", {"entered": 0, "sent": sent.get((a, b), 0),
                                                 "arrived": 0})
                e["entered"] += entered
                e["arrived"] += arrived
    for e in out.values():
        e["lost_at_port"] = max(0, e["entered"] - e["sent"])
        e["lost_in_datapath"] = max(0, e["sent"] - e["arrived"])
    return out


def unexplained_loss(result: dict[str, Any], min_share: float = 0.005,
                     floor_bytes: int = 64_000) -> dict[str, int]:
    """Links where flows lost bytes that no queue drop accounts for.

    Below ``floor_bytes`` it is noise: the iperf3 control connections are not watched, so
    their few kB show up as sent but never counted.

    Such loss is the emulator's, not the network's. On the userspace datapath OVS sends on
    every port through one shared AF_PACKET socket and drops the rest of a batch when one
    send fails (a queue drop, or the shared send buffer full of queued packets), uncounted.
    Measured under congestion with the default send buffer: up to 1-2% of a port's bytes,
    on congested and neighbouring ports alike; set-up's larger buffer
    (``ovs_service.ensure_send_buffer``) removes it, and ``fidelity`` reports any that is
    left.
    """
    drops = _per_link(result, "drops")
    out = {}
    for link, b in link_balance(result).items():
        lost = b["lost_in_datapath"] + (b["lost_at_port"] if drops.get(link, 0) == 0 else 0)
        if lost > max(min_share * b["entered"], floor_bytes):
            out[link] = lost
    return out


def _per_link(result: dict[str, Any], key: str) -> dict[str, Any]:
    """{"a->b": that link entry's ``key``} for every egress port.

    Router ports carry their own ``name`` (``border1-eth2->isp1-eth0``): two routers may
    share several parallel links, so the node pair does not name one."""
    return {ln.get("name", f"{ln['node']}->{ln['peer']}"): ln[key] for ln in result["links"]}


def router_link_balance(result: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per router link: bytes its flows left the sender with, bytes the far router counted.

    Both counts are the routers' own (nftables, before the egress queue and after the
    wire), so their difference is what the link's queue dropped of these flows.
    """
    out: dict[str, dict[str, int]] = {}
    for f in result["flows"]:
        for h in f.get("router_hops", []):
            if h.get("arrived") is None:
                continue
            e = out.setdefault(h["link"], {"entered": 0, "arrived": 0})
            e["entered"] += h["sent"]
            e["arrived"] += h["arrived"]
    for e in out.values():
        e["lost_at_port"] = max(0, e["entered"] - e["arrived"])
        e["lost_in_datapath"] = 0
    return out


def select_phase(result: dict[str, Any], phase: str | None) -> dict[str, Any]:
    """The result as seen in one phase of a phased run (``phase_details``)."""
    if phase is None:
        return result
    details = result.get("phase_details", {})
    if phase not in details:
        raise ScenarioError("--phase", f"{phase!r} is not a phase of this run (phases: "
                            f"{', '.join(details) or 'none'})")
    return {**result, "phase": phase, "links": details[phase]["links"],
            "flows": details[phase]["flows"]}


def _phase_pfc(result: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, list[str]]]:
    """The PFC counters and feeders of the phase a result is seen in (its headline phase,
    or the one ``select_phase`` chose); none for a run without PFC."""
    d = (result.get("phase_details") or {}).get(result.get("phase")) or {}
    return d.get("pfc"), d.get("pfc_feeders") or {}


def diagnose(result: dict[str, Any]) -> dict[str, Any]:
    """Flows with their links and losses, links ranked by the loss flows saw on them."""
    if result.get("schema") != 1:
        raise ScenarioError("result", f"schema {result.get('schema')!r} is not 1")
    drops = _per_link(result, "drops")
    util = _per_link(result, "util_mean")
    adj = adjacency(result["topology"])
    balance = {**link_balance(result), **router_link_balance(result)}
    per_link: dict[str, dict[str, Any]] = {}
    flows = []
    for f in result["flows"]:
        losses = flow_losses(f, adj)
        losses.update({h["link"]: h["lost"] for h in f.get("router_hops", [])})
        for link, lost in losses.items():
            entry = per_link.setdefault(link, {"lost_bytes": 0, "flows": []})
            entry["lost_bytes"] += lost
            entry["flows"].append(f["id"])
        worst = max(losses, key=losses.get, default=None)
        flows.append({"id": f["id"], "src": f["src"], "dst": f["dst"],
                      "path": f.get("full_path", f["path"]),
                      "links": list(losses), "lost_bytes": sum(losses.values()),
                      "loss": f.get("loss", 0.0), "lost_on": worst if worst and
                      losses[worst] > 0 else None,
                      "goodput_bps": f.get("goodput_bps", 0.0),
                      "retransmits": f.get("retransmits", 0),
                      "stalls": f.get("stalls"), "uplinks": f.get("uplinks", [])})
    links = sorted(({"link": name, "lost_bytes": v["lost_bytes"], "flows": v["flows"],
                     "queue_drops": drops.get(name, 0), "util_mean": util.get(name, 0.0),
                     **balance.get(name, {})}
                    for name, v in per_link.items()),
                   key=lambda x: (-x.get("lost_at_port", 0), -x["queue_drops"]))
    congested = links[0]["link"] if links and links[0].get("lost_at_port", 0) > 0 else None
    up = sum(1 for ln in result["links"] if ln.get("up", True))
    pfc, feeds = _phase_pfc(result)
    return {"scenario": result.get("scenario"), "policy": result.get("policy"),
            "phase": result.get("phase"),
            "links": len(result["links"]), "links_up": up, "congested_link": congested,
            "ranked": links, "unexplained": unexplained_loss(result), "flows": flows,
            "pauses": pauses.explain(pfc, feeds, result["flows"], result["topology"])}


def render(report: dict[str, Any]) -> str:
    """The operator's view, as text."""
    phase = f" phase={report['phase']}" if report.get("phase") else ""
    lines = [f"{report['scenario']} policy={report['policy']}{phase}: {report['links_up']} of "
             f"{report['links']} ports up"]
    if report["congested_link"]:
        top = report["ranked"][0]
        lines.append(f"congested link: {top['link']} - its flows lost {top['lost_at_port']} B "
                     f"at the port, whose queue dropped {top['queue_drops']} packets; util "
                     f"{top['util_mean'] * 100:.0f}%, carrying {', '.join(top['flows'])}")
    else:
        lines.append("no flow lost bytes at a port")
    lines += pauses.render(report.get("pauses") or {})
    for link, lost in report["unexplained"].items():
        lines.append(f"unexplained loss: {lost} B of the flows on {link} were lost without a "
                     "queue drop (inside the emulator's datapath, not a configured drop)")
    wid = max([6] + [len(f["id"]) for f in report["flows"]])
    pw = max([28] + [len("-".join(f["path"])) for f in report["flows"]])
    lw = max([16] + [len(f["lost_on"] or "") for f in report["flows"]])
    streams = any(f.get("stalls") is not None for f in report["flows"])
    lines.append(f"{'flow':{wid}s} {'src->dst':14s} {'path':{pw}s} {'lost B':>9s} "
                 f"{'lost on':{lw}s} {'goodput':>10s} {'retx':>6s}"
                 + (" stalls" if streams else ""))
    for f in report["flows"]:
        # A flow no player received (a streaming relay) has no goodput or stalls: "-".
        stalls, goodput = f.get("stalls"), f.get("goodput_bps")
        lines.append(f"{f['id']:{wid}s} {f['src'] + '->' + f['dst']:14s} "
                     f"{'-'.join(f['path']):{pw}s} {f['lost_bytes']:9d} "
                     f"{f['lost_on'] or '-':{lw}s} "
                     + (f"{goodput / 1e6:8.1f} M " if goodput is not None else f"{'-':>10s} ")
                     + f"{f['retransmits']:6d}"
                     + ((f" {stalls:6d}" if stalls is not None else f" {'-':>6s}")
                        if streams else ""))
    return "\n".join(lines)
