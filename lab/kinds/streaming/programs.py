"""The streams' programs on the running edge: a phase's players (one per viewer host) and
senders started together on the lab's go, what each reported read back, and the probes
that trace each origin stream's uplink with its own 5-tuple.

``EdgePrograms`` is the part of ``lab.kinds.streaming.run.EdgeRun`` that does this.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab import agents
from lab.kinds.streaming.plan import Stream
from lab.machine import programs
from lab.measure.routerstats import RouterPort
from lab.model.errors import MachineError

if TYPE_CHECKING:
    from lab.net.fabric import Fabric


class EdgePrograms:
    """Starting the streams' programs and reading what they said (a part of ``EdgeRun``)."""

    fabric: Fabric
    params: dict[str, Any]
    desc: dict[str, Any]
    rports: list[RouterPort]

    def host(self, name: str) -> Any:
        return self.fabric.host(name)

    def probe(self, phase: str, flows: list[dict[str, Any]]) -> None:
        """TTL-limited probes with each origin stream's 5-tuple: which uplink does it hash to?

        The ISP answers from the address of the interface the probe arrived on
        (``icmp_errors_use_inbound_ifaddr``), which names the uplink; max TTL 3 (dccore,
        border, ISP) so no probe reaches the CDN node.
        """
        mine = [f for f in flows if f["role"] != "ingest"]
        if not mine:
            return
        by_addr = {a.split("/")[0]: (r["name"], intf) for r in self.desc["routers"]
                   for intf, addrs in r["interfaces"].items() for a in addrs}
        arg = json.dumps([[f["proto"], f["src_ip"], f["dst_ip"], f["sport"], f["dport"]]
                          for f in mine])
        origin = self.host(mine[0]["src"])
        out = origin.cmd(f"{shlex.join(agents.command('probe'))} --max-ttl 3 --timeout 2 "
                         f"--flows '{arg}'")
        start = out.find('{"flows"')
        traces = json.loads(out[start:])["flows"] if start >= 0 else [[] for _ in mine]
        for f, hops in zip(mine, traces, strict=True):
            uplink = None
            for hop in hops:
                _, intf = by_addr.get(hop["from"], (None, None))
                port = next((p for p in self.rports if p.peer_intf == intf
                             and p.role == "uplink" and p.node.startswith("border")), None)
                if port is not None:
                    uplink = port.name
            f["probe"] = {"hops": [{**h, "node": by_addr.get(h["from"], ("?", ""))[0],
                                    "intf": by_addr.get(h["from"], ("", "?"))[1]}
                                   for h in hops],
                          "uplink": uplink,
                          "agrees": uplink is not None and f["uplinks"] == [uplink]}

    def start_players(self, streams: list[Stream], work: Path, duration: float) -> list[Any]:
        procs = []
        by_dst: dict[str, list[Stream]] = {}
        for s in streams:
            by_dst.setdefault(s.dst, []).append(s)
        ready = []
        for dst, group in by_dst.items():
            rf = work / f"{dst}.ready"
            cmd = [*agents.command("streamer"), "play", "--proto", group[0].proto,
                   "--bind", group[0].dst_ip, "--port", str(group[0].dport),
                   "--streams", str(len(group)),
                   # A guard against senders that never come, not a schedule: the senders
                   # start after every player is ready, which may take programs.ready_timeout_s().
                   "--timeout", f"{duration + programs.ready_timeout_s() + 25:g}",
                   "--ready-file", str(rf), "--out", str(work / f"{dst}.play.json")]
            procs.append(programs.spawn(self.fabric, dst, cmd, work / f"{dst}.play.log",
                                        f"player {dst}"))
            ready.append(rf)
        # A player says it is ready by its file; one that died is reported at once.
        dead, waiting = programs.wait_ready(ready, procs, stop_at_death=True)
        if dead or waiting:
            raise MachineError("streams", f"players not ready "
                               f"({'exited' if dead else 'timed out'}): {dead or waiting}")
        return procs

    def start_senders(self, streams: list[Stream], work: Path, duration: float) -> list[Any]:
        procs = []
        sp = self.params["streams"]
        for s in streams:
            cmd = [*agents.command("streamer"), "send", "--stream-id",
                   str(s.stream_id), "--proto", s.proto, "--bind", s.src_ip, "--sport",
                   str(s.sport), "--dst", s.dst_ip, "--dport", str(s.dport), "--rate-mbps",
                   f"{s.rate_mbps:g}", "--fps", f"{sp['fps']:g}", "--duration", f"{duration:g}",
                   "--linger", "10", "--out", str(work / f"{s.stream_id}.send.json"),
                   "--ready-file", str(work / f"{s.stream_id}.send.ready")]
            if s.proto == "tcp":
                cmd += ["--cc", sp["cc"]]
            procs.append(programs.spawn(self.fabric, s.src, cmd,
                                        work / f"{s.stream_id}.send.log", f"sender {s.id}"))
        # Every stream of the phase starts at once, when all are connected.
        programs.go([work / f"{s.stream_id}.send.ready" for s in streams], procs)
        return procs

    def read_stream(self, s: Stream, work: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            play = json.loads((work / f"{s.dst}.play.json").read_text())
            out["player"] = next((x for x in play["streams"] if x["stream_id"] == s.stream_id),
                                 None)
        except (OSError, ValueError, KeyError):
            out["player"] = None
        try:
            out["sender"] = json.loads((work / f"{s.stream_id}.send.json").read_text())
        except (OSError, ValueError):
            out["sender"] = None
        return out
