"""Elephant flows with iperf3: started, stopped and collected by the lab, 5-tuples known.

Each flow has its own one-off iperf3 server port and a fixed client port (``--cport``), so
its data connection's 5-tuple is known before it starts: the controller can install a
per-flow counter for it and the report can say which uplink those packets crossed.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from lab.machine import programs, remote
from lab.machine.programs import ready_timeout_s
from lab.machine.state import RunRecord
from lab.model.errors import MachineError
from lab.model.flows import FlowSpec
from lab.workloads import mptcp


def _iperf_server_cmd(flow: FlowSpec, interval_s: float | None = None) -> list[str]:
    cmd = ["iperf3", "-s", "-1", "-J", "-B", flow.dst_ip, "-p", str(flow.dport)]
    if flow.subflows > 1:
        cmd = [*mptcp.WRAPPER, *cmd]
    return [*cmd, "-i", f"{interval_s:g}"] if interval_s else cmd


def _iperf_client_cmd(flow: FlowSpec, duration_s: float) -> list[str]:
    cmd = ["iperf3", "-c", flow.dst_ip, "-B", flow.src_ip, "-p", str(flow.dport),
           "--cport", str(flow.sport), "-t", f"{duration_s:g}", "-J"]
    rate = str(int(flow.rate_bps))
    if flow.proto == "udp":
        return [*cmd, "-u", "-l", "1400", "-b", rate]
    if flow.subflows > 1:
        # An MPTCP socket refuses SO_MAX_PACING_RATE (its subflows pace themselves): the
        # connection's rate is iperf3's own -b, at the price of its 1 ms timer.
        cmd = [*mptcp.WRAPPER, *cmd, "-b", rate]
        return [*cmd, "-C", flow.cc] if flow.cc else cmd
    # TCP is paced by the kernel (SO_MAX_PACING_RATE), not by iperf3's -b, whose 1 ms
    # timer wakes every client 1000 times a second whatever its rate: 2.7 % of a core per
    # client here, and both vCPUs of a VM without KVM for eight of them. TCP paces on its
    # own without the fq qdisc (Linux >= 4.13); -b 0 lifts iperf3's 1 Mbit/s TCP default.
    cmd += ["-b", "0", "--fq-rate", rate]
    return [*cmd, "-C", flow.cc] if flow.cc else cmd


class FlowRunner:
    """Runs a set of flows on a fabric: servers first, then all clients at once."""

    def __init__(self, fabric: Any, flows: list[FlowSpec], run_dir: Path,
                 record: RunRecord, interval_s: float | None = None) -> None:
        self.fabric = fabric
        #: The receivers' reporting interval (iperf3's default 1 s when None).
        self.interval_s = interval_s
        self.flows = flows
        self.dir = run_dir / "iperf3"
        self.dir.mkdir(parents=True, exist_ok=True)
        # iperf3 keeps its send buffer in a temp file ($TMPDIR/iperf3.XXXXXX, unlinked at
        # once): in the run's own folder, not in the machine's /tmp.
        self.env = dict(os.environ, TMPDIR=str(run_dir))
        self.record = record
        self.servers: list[Any] = []
        self.clients: list[Any] = []

    def start_servers(self, timeout_s: float | None = None) -> None:
        """Every flow's iperf3 server, then until each listens (within ``timeout_s``,
        default the machine's :func:`ready_timeout_s`: a TCG guest's, or a cluster
        worker's over ssh, take longer)."""
        timeout_s = ready_timeout_s() if timeout_s is None else timeout_s
        for flow in self.flows:
            host = self.fabric.host(flow.dst)
            out = open(self.dir / f"{flow.id}.server.json", "wb")  # noqa: SIM115
            proc = host.popen(_iperf_server_cmd(flow, self.interval_s), stdout=out, stderr=out,
                              env=self.env)
            self.record.add_pid(proc.pid, f"iperf3 server {flow.id}")
            programs.classify(self.fabric, flow.dst, proc.pid, "traffic")
            self.servers.append(proc)
        # A server is ready once its port listens in its host's namespace.
        deadline = time.monotonic() + timeout_s
        pending = list(self.flows)
        while pending and time.monotonic() < deadline:
            flow = pending[0]
            listening = self.fabric.host(flow.dst).cmd(
                f"ss -Hltn 'sport = :{flow.dport}'")
            if str(flow.dport) in listening:
                pending.pop(0)
            else:
                time.sleep(0.02)
        if pending:
            raise MachineError("traffic", f"iperf3 servers did not start: "
                               f"{[f.id for f in pending]}")

    def start_clients(self, duration_s: float) -> float:
        """Start every client; returns the monotonic start time."""
        t0 = time.monotonic()
        for flow in self.flows:
            host = self.fabric.host(flow.src)
            out = open(self.dir / f"{flow.id}.client.json", "wb")  # noqa: SIM115
            proc = host.popen(_iperf_client_cmd(flow, duration_s), stdout=out, stderr=out,
                              env=self.env)
            self.record.add_pid(proc.pid, f"iperf3 client {flow.id}")
            programs.classify(self.fabric, flow.src, proc.pid, "traffic")
            self.clients.append(proc)
        return t0

    def wait_connected(self, timeout_s: float = 10.0, poll_s: float = 0.05) -> float | None:
        """The monotonic time by which every client had its data socket (a TCP flow's
        connection established); None if some had not within ``timeout_s``.

        Read from each source host's own ``/proc/<pid>/net/{tcp,udp}``, so nothing is
        spawned: until then the clients are still being started, which is the lab's
        set-up (under TCG, seconds of both vCPUs), not the emulation of their traffic.
        """
        deadline = time.monotonic() + timeout_s
        pending = list(self.flows)
        while pending:
            pending = [f for f in pending if not _has_socket(self.fabric.host(f.src), f)]
            if not pending:
                break
            if time.monotonic() > deadline:
                return None
            time.sleep(poll_s)
        return time.monotonic()

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in self.clients + self.servers:
            left = max(0.1, deadline - time.monotonic())
            try:
                proc.wait(timeout=left)
            except Exception:
                proc.kill()
                proc.wait()

    def collect(self) -> None:
        """Parse each flow's iperf3 JSON into ``flow.result``."""
        for flow in self.flows:
            flow.result = parse_iperf(self.dir / f"{flow.id}.client.json",
                                      self.dir / f"{flow.id}.server.json", flow.proto)

    def stop(self) -> None:
        for proc in self.clients + self.servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


#: /proc/net/tcp's state column for an established connection.
TCP_ESTABLISHED = "01"


def _has_socket(host: Any, flow: FlowSpec) -> bool:
    """Whether ``host``'s namespace holds ``flow``'s client socket (bound to its source
    address and port; for TCP, established), from its own ``/proc/net``.
    """
    want = f"{_proc_net_addr(flow.src_ip)}:{flow.sport:04X}"
    try:
        lines = remote.proc_net(host, flow.proto).splitlines()[1:]
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[1] == want and \
                (flow.proto != "tcp" or fields[3] == TCP_ESTABLISHED):
            return True
    return False


def _proc_net_addr(ip: str) -> str:
    """An IPv4 address as /proc/net/{tcp,udp} print it: the 32-bit word in host order."""
    return socket.inet_aton(ip)[::-1].hex().upper() if sys.byteorder == "little" \
        else socket.inet_aton(ip).hex().upper()


def _load_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def parse_iperf(client_path: Path, server_path: Path, proto: str) -> dict[str, Any]:
    """Goodput, bytes, retransmits/loss and errors from iperf3's own JSON."""
    client = _load_json(client_path)
    server = _load_json(server_path)
    end = client.get("end", {})
    out: dict[str, Any] = {"error": client.get("error") or server.get("error"),
                           # the receiving iperf3's own CPU (user + system, % of one core):
                           # what a receiver pays per packet, more when GRO cannot merge
                           "receiver_cpu_pct": float(end.get("cpu_utilization_percent", {})
                                                     .get("remote_total", 0.0))}
    if proto == "tcp":
        sent = end.get("sum_sent", {})
        recv = end.get("sum_received", {})
        out.update(sent_bytes=sent.get("bytes", 0), received_bytes=recv.get("bytes", 0),
                   goodput_bps=recv.get("bits_per_second", 0.0),
                   retransmits=sent.get("retransmits", 0),
                   seconds=recv.get("seconds", 0.0))
    else:
        s = end.get("sum", {})
        srv = server.get("end", {}).get("sum", {})
        lost = srv.get("lost_packets", s.get("lost_packets", 0))
        total = srv.get("packets", s.get("packets", 0))
        out.update(sent_bytes=s.get("bytes", 0), received_bytes=srv.get("bytes", 0),
                   goodput_bps=srv.get("bits_per_second", 0.0), retransmits=0,
                   lost_packets=lost, packets=total,
                   udp_loss=(lost / total) if total else 0.0, seconds=srv.get("seconds", 0.0))
    return out
