"""Counters inside the routers' namespaces: per interface and per flow, the kernel's own.

A router's links are veth pairs inside Mininet hosts, so their counters are not in the root
namespace's sysfs. Three sources, all cheap and all the kernel's:

* ``/proc/<pid>/net/dev`` of any process in the router's namespace (its Mininet shell):
  bytes and packets per interface, read without a subprocess, so at 10 Hz;
* the root qdiscs' drops and backlog over rtnetlink, through a socket opened inside the
  router's namespace once and kept for the run (``lab.measure.netlink``), read at the
  edges of a phase - the numbers ``tc -s qdisc`` prints, without a process per read;
* nftables sets in the router: one dynamic set per interface and direction whose elements
  are 5-tuples with a counter each. Every flow that leaves through an interface is counted
  there, planned or not, so a stream's path through the routers is read from the routers'
  own counters - the same rule as in the fabric, where OVS counts each watched 5-tuple.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from lab.measure import live
from lab.measure.netlink import close_netlink, qdisc_stats

NFT_TABLE = "fabriclab"
FlowKey = tuple[str, str, str, int, int]     # src, dst, proto, sport, dport


@dataclass(frozen=True)
class RouterPort:
    """One router interface as the sending end of a link."""

    node: str
    port: int
    intf: str
    peer: str
    peer_intf: str
    bw_mbps: float
    role: str          # core | uplink | access

    @property
    def name(self) -> str:
        return f"{self.intf}->{self.peer_intf}"


def router_ports(topo_desc: dict[str, Any]) -> list[RouterPort]:
    """Both directions of every router-to-router link, and routers' access links."""
    routers = {r["name"] for r in topo_desc.get("routers", [])}
    ports = []
    for ln in topo_desc.get("router_links", []):
        for node, port, intf, peer, pintf in (
                (ln["a"], ln["a_port"], ln["a_intf"], ln["b"], ln["b_intf"]),
                (ln["b"], ln["b_port"], ln["b_intf"], ln["a"], ln["a_intf"])):
            if node in routers:
                ports.append(RouterPort(node, port, intf, peer, pintf, ln["bw_mbps"],
                                        ln["role"]))
    return ports


def ns_run(pid: int, cmd: list[str], stdin: str | None = None,
           check: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` in the network namespace of ``pid``."""
    out = subprocess.run(["nsenter", "-t", str(pid), "-n", *cmd], input=stdin,
                         capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} in netns of {pid}: {out.stderr.strip()}")
    return out


def netdev(pid: int) -> dict[str, tuple[int, int, int]]:
    """{intf: (rx_bytes, tx_bytes, tx_packets)} from /proc/<pid>/net/dev."""
    out = {}
    try:
        with open(f"/proc/{pid}/net/dev") as f:
            lines = f.readlines()[2:]
    except OSError:
        return out
    for line in lines:
        name, _, rest = line.partition(":")
        v = rest.split()
        out[name.strip()] = (int(v[0]), int(v[8]), int(v[9]))
    return out


def qdiscs(pid: int) -> dict[str, tuple[int, int]]:
    """{intf: (drops, backlog bytes)} of each root qdisc in the namespace of ``pid``."""
    return qdisc_stats(pid)


@dataclass
class PortCounters:
    tx_bytes: int
    tx_packets: int
    drops: int
    backlog: int


def snapshot(pids: dict[str, int], ports: list[RouterPort]) -> dict[RouterPort, PortCounters]:
    dev = {node: netdev(pid) for node, pid in pids.items()}
    q = {node: qdiscs(pid) for node, pid in pids.items()}
    snap = {}
    for p in ports:
        _, tx, pk = dev[p.node].get(p.intf, (0, 0, 0))
        drops, backlog = q[p.node].get(p.intf, (0, 0))
        snap[p] = PortCounters(tx, pk, drops, backlog)
    return snap


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    tx_bps: list[float] = field(default_factory=list)


class RouterSampler(threading.Thread):
    """tx rate of every router port at ``hz``, from /proc (no subprocess per sample)."""

    def __init__(self, pids: dict[str, int], ports: list[RouterPort], t0: float,
                 hz: float = 10.0) -> None:
        super().__init__(daemon=True, name="fabriclab-router-sampler")
        self.pids, self.ports, self.t0, self.period = pids, ports, t0, 1.0 / hz
        self.series: dict[RouterPort, Series] = {p: Series() for p in ports}
        self._stop_evt = threading.Event()

    def _read(self) -> dict[RouterPort, int]:
        dev = {node: netdev(pid) for node, pid in self.pids.items()}
        sent = {p: dev[p.node].get(p.intf, (0, 0, 0))[1] for p in self.ports}
        feed = live.current()
        if feed is not None:
            feed.publish(time.monotonic(), {(p.node, p.port): b for p, b in sent.items()})
        return sent

    def run(self) -> None:
        prev, prev_t = self._read(), time.monotonic()
        next_t = prev_t + self.period
        while not self._stop_evt.wait(max(0.0, next_t - time.monotonic())):
            next_t += self.period
            now = time.monotonic()
            cur = self._read()
            dt = max(now - prev_t, 1e-6)
            for p in self.ports:
                s = self.series[p]
                s.t.append(round(now - self.t0, 4))
                s.tx_bps.append((cur[p] - prev[p]) * 8 / dt)
            prev, prev_t = cur, now

    def stop(self) -> None:
        """Stop sampling and close the netlink sockets kept in the routers' namespaces:
        the run is over, and an open socket would keep a namespace alive."""
        self._stop_evt.set()
        self.join(timeout=5)
        close_netlink(self.pids.values())


# -- per-flow counters: nftables -------------------------------------------------------------
def _set_name(direction: str, index: int) -> str:
    return f"{direction}{index}"


def flow_counter_ruleset(intfs: list[str]) -> str:
    """An nft script: per interface, a set of 5-tuples counted on the way out and in.

    (One set per interface: nft 1.0.6 cannot list a set whose key concatenates an
    interface name with addresses - it prints garbage or aborts.)
    """
    key = "ipv4_addr . ipv4_addr . inet_proto . inet_service . inet_service"
    elem = "ip saddr . ip daddr . meta l4proto . th sport . th dport"
    lines = [f"table ip {NFT_TABLE} {{"]
    for i, _ in enumerate(intfs):
        for d in ("out", "in"):
            lines.append(f"  set {_set_name(d, i)} {{ type {key}; flags dynamic; counter; "
                         "size 65535; }")
    for hook, d, match in (("postrouting", "out", "oifname"), ("prerouting", "in", "iifname")):
        lines.append(f"  chain {d} {{ type filter hook {hook} priority 0; policy accept;")
        for i, intf in enumerate(intfs):
            lines.append(f'    {match} "{intf}" meta l4proto {{ tcp, udp }} '
                         f"update @{_set_name(d, i)} {{ {elem} }}")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def install_flow_counters(pid: int, intfs: list[str]) -> None:
    ns_run(pid, ["nft", "-f", "-"], stdin=flow_counter_ruleset(intfs))


def read_flow_counters(pid: int, intfs: list[str]) -> dict[tuple[str, str], dict[FlowKey, int]]:
    """{(intf, "out"|"in"): {5-tuple: bytes}} - IP bytes, as the router's nft counted them."""
    out = ns_run(pid, ["nft", "-j", "list", "table", "ip", NFT_TABLE])
    return parse_flow_counters(json.loads(out.stdout), intfs)


def parse_flow_counters(doc: dict[str, Any],
                        intfs: list[str]) -> dict[tuple[str, str], dict[FlowKey, int]]:
    result: dict[tuple[str, str], dict[FlowKey, int]] = {}
    for item in doc.get("nftables", []):
        s = item.get("set")
        if not s:
            continue
        name = s["name"]
        direction, index = name.rstrip("0123456789"), int(name.lstrip("outin"))
        counts: dict[FlowKey, int] = {}
        for e in s.get("elem", []):
            el = e.get("elem", e)
            src, dst, proto, sport, dport = el["val"]["concat"]
            counts[(src, dst, str(proto), int(sport), int(dport))] = \
                int(el.get("counter", {}).get("bytes", 0))
        result[(intfs[index], direction)] = counts
    return result


def delta(after: dict[tuple[str, str], dict[FlowKey, int]],
          before: dict[tuple[str, str], dict[FlowKey, int]],
          ) -> dict[tuple[str, str], dict[FlowKey, int]]:
    return {k: {f: b - before.get(k, {}).get(f, 0) for f, b in v.items()
                if b - before.get(k, {}).get(f, 0) > 0} for k, v in after.items()}
