"""RoCE queue pairs as traffic: ``roce_bw`` (``lab/agents/roce``, perftest's
``ib_write_bw`` on the lab's RoCEv2 transport) servers and clients in the fabric's hosts,
and what they counted, read back per QP.

Every kind that puts RoCE flows on the fabric starts and reads them here: the roce kind's
flow groups, and the collective kind's incast beside a ring. One flow is one QP, its
5-tuple fixed by the plan (``FlowSpec``: UDP, the planned source port, 4791).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controllers.classes import ROCE_DSCP
from lab import agents
from lab.machine import programs
from lab.model.errors import MachineError
from lab.model.flows import FlowSpec

if TYPE_CHECKING:
    from lab.net.fabric import Fabric

#: Seconds a receiver's server may take to bind UDP 4791.
BIND_TIMEOUT_S = 10.0


def start_servers(fabric: Fabric, binary: Path, rates_mbps: dict[str, float],
                  work: Path, placement: str = "gbn",
                  reorder_pkts: int | None = None) -> list[subprocess.Popen]:
    """One ``roce_bw --server`` per receiver (``rates_mbps``: receiver -> its link's rate,
    which sets its CNP interval; ``placement``: RC's go-back-N receiver or out-of-order
    placement, which NAKs a gap only ``reorder_pkts`` packets past it), each bound to UDP
    4791 before this returns."""
    procs = []
    for rx in sorted(rates_mbps):
        argv = [str(binary), "--server", "--rate-mbps", f"{rates_mbps[rx]:g}",
                "--placement", placement, "--out", str(work / f"server-{rx}.json")]
        if reorder_pkts is not None:
            argv += ["--reorder-pkts", str(reorder_pkts)]
        procs.append(programs.spawn(fabric, rx, argv, work / f"server-{rx}.log",
                                    f"roce_bw server in {rx}", "traffic"))
    deadline = time.monotonic() + BIND_TIMEOUT_S
    for rx, proc in zip(sorted(rates_mbps), procs, strict=True):
        while ":4791 " not in fabric.host(rx).cmd("ss -Hlun"):
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (work / f"server-{rx}.log").read_text(errors="replace")
                raise MachineError("roce_bw", f"{rx}: the server did not bind UDP 4791: "
                                   f"{log.strip()[-300:]}")
            time.sleep(0.05)
    return procs


def warm(fabric: Fabric, flow: FlowSpec, spray: int) -> None:
    """A sprayed QP's 5-tuples through the switches once, before its receiver listens
    (``lab.agents.udpwarm``): a new 5-tuple's trip through Open vSwitch's slow path is the
    emulator's cost, which a sprayer pays hundreds of times in its first millisecond."""
    argv = agents.command("udpwarm", "--src", flow.src_ip, "--dst", flow.dst_ip,
                          "--dport", str(flow.dport), "--sports", f"{flow.sport}:{spray}")
    out = str(fabric.host(flow.src).cmd(shlex.join(argv))).strip()
    if out != str(spray):
        raise MachineError("udpwarm", f"{flow.id}: {out[-300:]}")


def client_argv(binary: Path, flow: FlowSpec, roce: dict[str, Any], duration_s: float,
                out: Path) -> list[str]:
    """One QP from ``flow.src`` to ``flow.dst`` for ``duration_s``: the phase's ``roce.*``
    settings, the planned source port (the first of ``roce.spray`` when sprayed), the
    lossless class's DSCP, at the sender's link rate (``flow.rate_bps``)."""
    return [str(binary), "--client", flow.dst_ip, "--out", str(out),
            "--duration", f"{duration_s:g}", "--rate-mbps", f"{flow.rate_bps / 1e6:g}",
            "--cc", roce["cc"], "--mtu", str(roce["mtu"]), "--size", str(roce["size_bytes"]),
            "--tx-depth", str(roce["tx_depth"]), "--rto-ms", f"{roce['rto_ms']:g}",
            "--src-port", str(flow.sport), "--dscp", str(ROCE_DSCP),
            "--spray", str(roce.get("spray", 1))]


def read_outputs(flows: list[FlowSpec], work: Path) -> dict[str, dict[str, Any]]:
    """Each QP's client JSON with its responder counters from the server's (matched by the
    client's address and QPN), or an error naming what is missing (``missing``: the
    program left no result, a measurement lost rather than what the network did)."""
    servers: dict[str, dict[str, Any]] = {}
    out: dict[str, dict[str, Any]] = {}
    for f in flows:
        if f.dst not in servers:
            path = work / f"server-{f.dst}.json"
            servers[f.dst] = json.loads(path.read_text()) if path.is_file() else {}
        path = work / f"{f.id}.json"
        if not path.is_file():
            log = work / f"{f.id}.log"
            text = log.read_text(errors="replace").strip()[-300:] if log.is_file() else ""
            out[f.id] = {"error": f"roce_bw wrote no result: {text}", "missing": True}
            continue
        client = json.loads(path.read_text())
        qp = (client.get("qps") or [{}])[0]
        resp = [r for r in servers[f.dst].get("qps", [])
                if r.get("client") == f.src_ip and r.get("peer_qpn") == qp.get("qpn")]
        out[f.id] = {**client, "responder": resp[0] if resp else None,
                     "receiver_cpu_pct": server_cpu_pct(servers[f.dst])}
        if not resp and not client.get("error"):
            out[f.id].update(error=f"{f.dst}'s server has no responder for {f.id}",
                             missing=True)
    return out


def server_cpu_pct(server: dict[str, Any]) -> float | None:
    """A receiver's ``roce_bw`` server's own CPU, % of a core over its life in the phase
    (the window and the warm-up around it): what its QPs' packets cost the receiving host,
    the receiver's GRO-less counterpart of a TCP receiver's. None without its JSON."""
    cpu, elapsed = server.get("cpu"), float(server.get("elapsed_s") or 0.0)
    if not cpu or elapsed <= 0:
        return None
    return round((cpu["user_s"] + cpu["sys_s"]) / elapsed * 100, 2)


def flow_result(out: dict[str, Any]) -> dict[str, Any]:
    """A QP's transport numbers in the fields ``lab.measure.result.flow_entries`` reads."""
    t = out.get("totals") or {}
    resp = out.get("responder") or {}
    return {"goodput_bps": float(out.get("goodput_mbps") or 0.0) * 1e6,
            "retransmits": int(t.get("retransmitted_packets", 0)),
            "sent_bytes": int(t.get("payload_bytes_sent", 0)),
            "received_bytes": int(resp.get("payload_bytes_received", 0)),
            "error": out.get("error")}
