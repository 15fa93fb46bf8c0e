"""The collective kind's RoCE programs: the ring's ranks on the lab's RoCEv2 transport
(``roce_ring``) and another job's incast beside it (``roce_bw`` QPs), planned, started and
read; the lossless class's PFC around them (``lab.net.lossless``).

A part of ``JobRun`` (``lab.kinds.collective.run``), as ``JobPrograms`` is: it uses the
run's hosts, addresses, source ports and spawn. The keys and checks are
``lab.kinds.collective.roce``'s.
"""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controllers.classes import ROCE_DSCP
from lab.kinds.collective import roce
from lab.kinds.collective.plan import Conn
from lab.machine import programs
from lab.measure import classes as class_counts
from lab.model import lossless
from lab.model.flows import ROCE_UDP_PORT, FlowSpec
from lab.net.lossless import LosslessClass
from lab.workloads import rocebw

if TYPE_CHECKING:
    from lab.net.fabric import Fabric

#: Seconds the incast's clients are asked to run beyond the job's estimate: they are
#: stopped when the job ends, so they never end first.
INCAST_SPARE_S = 30.0


class RoceJob:
    """The RoCE side of a collective phase (mixed into ``JobRun``)."""

    fabric: Fabric
    ips: dict[str, str]
    sports: list[int]
    next_index: int
    rng: random.Random
    bw: dict[tuple[str, str], float]
    leaf_of: dict[str, str]
    #: The fabric's lossless class, when some phase of the run has RoCE traffic.
    lossless: LosslessClass | None = None

    def host_rate_mbps(self, host: str) -> float:
        """A host's link rate: its QPs' line rate."""
        return self.bw[(host, self.leaf_of[host])] / 1e6

    # -- planning ------------------------------------------------------------------------
    def roce_ring_conns(self, pp: dict[str, Any], hosts: list[str]) -> list[Conn]:
        """Rank r's QP to rank r+1: UDP from a source port drawn for the run to 4791."""
        n = len(hosts)
        out = []
        for r in range(n):
            src, dst = hosts[r], hosts[(r + 1) % n]
            spec = FlowSpec(id=f"r{r}e0", src=src, dst=dst, src_ip=self.ips[src],
                            dst_ip=self.ips[dst], proto="udp", sport=self.sports.pop(),
                            dport=ROCE_UDP_PORT, rate_bps=self.host_rate_mbps(src) * 1e6,
                            kind="allreduce", cc=pp["roce"]["cc"])
            out.append(Conn(spec, r, 0, self.next_index + r))
        self.next_index += n
        return out

    def incast_conns(self, pp: dict[str, Any]) -> list[Conn]:
        """The other job's incast: one QP from each sender into the receiver."""
        inc = pp["incast"]
        out = []
        for i, src in enumerate(inc["from"]):
            spec = FlowSpec(id=f"incast-{src}", src=src, dst=inc["to"], src_ip=self.ips[src],
                            dst_ip=self.ips[inc["to"]], proto="udp", sport=self.sports.pop(),
                            dport=ROCE_UDP_PORT, rate_bps=self.host_rate_mbps(src) * 1e6,
                            kind="roce-incast", cc=pp["roce"]["cc"])
            out.append(Conn(spec, i, 0, self.next_index + i))
        self.next_index += len(out)
        return out

    def spray_conns(self, pp: dict[str, Any], conns: list[Conn]) -> list[Conn]:
        """With ``roce.spray`` N > 1, each QP of ``conns`` a block of source ports of its own
        (drawn from the seed; its first port its own 5-tuple's) and the subflows its other
        N - 1 ports make: returned, to be watched on the switches like connections, so each
        one's path and bytes are what its packets did."""
        n = pp["roce"]["spray"]
        if n <= 1 or not conns:
            return []
        subs = []
        bases = lossless.spray_blocks(len(conns), set(), self.rng)
        for c, base in zip(conns, bases, strict=True):
            c.spec.sport = base
            for s in lossless.spray_subflows(c.spec, n):
                subs.append(Conn(s, c.rank, c.epoch, self.next_index))
                self.next_index += 1
        return subs

    def warm_sprayed(self, pp: dict[str, Any], conns: list[Conn]) -> None:
        """Each sprayed QP's 5-tuples through the switches once, before its receiver listens
        and before the phase's window opens (``lab.workloads.rocebw.warm``)."""
        if pp["roce"]["spray"] > 1:
            for c in conns:
                rocebw.warm(self.fabric, c.spec, pp["roce"]["spray"])

    # -- programs ------------------------------------------------------------------------
    def start_roce_ring(self, pp: dict[str, Any], hosts: list[str], conns: list[Conn],
                        work: Path) -> list[subprocess.Popen]:
        """One ``roce_ring`` rank per host, its QP to the next rank on its planned port."""
        ring_bin, _ = roce.build()
        job, r_ = pp["job"], pp["roce"]
        n = len(hosts)
        procs = []
        for c in sorted(conns, key=lambda c: c.rank):
            r, h = c.rank, hosts[c.rank]
            argv = [str(ring_bin), "--rank", str(r), "--world", str(n),
                    "--next", self.ips[hosts[(r + 1) % n]],
                    "--prev", self.ips[hosts[(r - 1) % n]], "--bind", self.ips[h],
                    "--src-port", str(c.spec.sport), "--size", str(job["size_bytes"]),
                    "--steps", str(job["steps"]), "--warmup", str(job["warmup"]),
                    "--compute-s", str(job["compute_s"]),
                    "--rate-mbps", f"{self.host_rate_mbps(h):g}", "--cc", r_["cc"],
                    "--mtu", str(r_["mtu"]), "--rto-ms", f"{r_['rto_ms']:g}",
                    "--tx-depth", str(r_["tx_depth"]), "--dscp", str(ROCE_DSCP),
                    "--spray", str(r_["spray"]), "--placement", r_["placement"],
                    "--reorder-pkts", str(r_["reorder_pkts"]),
                    "--connect-timeout-s", "20", "--out", str(work / f"rank{r}.json")]
            procs.append(programs.spawn(self.fabric, h, argv, work / f"rank{r}.log",
                                        f"roce_ring rank {r}", "ranks"))
        return procs

    def start_roce_incast(self, pp: dict[str, Any], iconns: list[Conn], work: Path,
                          duration_s: float) -> list[subprocess.Popen]:
        """The incast's server and its QPs, running ``incast.alone_s`` before this returns
        (the pauses it causes are under way when the job starts); every program returned,
        to be stopped with the job."""
        if not iconns:
            return []
        _, bw_bin = roce.build()
        out = work / "incast"
        out.mkdir(exist_ok=True)
        rx = iconns[0].spec.dst
        procs = rocebw.start_servers(self.fabric, bw_bin, {rx: self.host_rate_mbps(rx)}, out,
                                     pp["roce"]["placement"], pp["roce"]["reorder_pkts"])
        for c in iconns:
            argv = rocebw.client_argv(bw_bin, c.spec, pp["roce"],
                                      duration_s + INCAST_SPARE_S, out / f"{c.spec.id}.json")
            procs.append(programs.spawn(self.fabric, c.spec.src, argv,
                                        out / f"{c.spec.id}.log",
                                        f"roce_bw client {c.spec.id}", "traffic"))
        time.sleep(pp["incast"]["alone_s"])
        return procs

    # -- counters ------------------------------------------------------------------------
    def lossless_start(self, pp: dict[str, Any]) -> dict[str, Any]:
        """PFC on where the phase asks; the classes' counters before the phase."""
        if self.lossless is None or not roce.uses_lossless(pp):
            return {}
        if pp["pfc"]["enabled"]:
            self.lossless.pfc_on(pp)
        return class_counts.leaf_counters(self.lossless.devices())

    def lossless_end(self, pp: dict[str, Any], leaves0: dict[str, Any]) -> dict[str, Any]:
        """PFC off (once the window has closed: the queues drained), with its counters and
        every class's bytes and drops over the phase; nothing for a phase without RoCE."""
        if self.lossless is None or not roce.uses_lossless(pp):
            return {}
        counters = self.lossless.pfc_off()
        return {"pfc": counters, "pfc_feeders": self.lossless.feeders(pp),
                "classes": class_counts.delta(leaves0, class_counts.leaf_counters(
                    self.lossless.devices()))}

    @staticmethod
    def attach_roce_results(conns: list[Conn], outputs: list[dict[str, Any]]) -> None:
        """Each ring QP's counters as its requester saw them (``roce_ring``'s ``qp``), in
        the fields ``lab.measure.result.flow_entries`` reads, on its flow."""
        for c in conns:
            o = outputs[c.rank] if c.rank < len(outputs) else {}
            req = (o.get("qp") or {}).get("requester") or {}
            conn = (o.get("connections") or [{}])[0]
            span = (conn.get("t_close") or 0) - (conn.get("t_open") or 0)
            sent = int(req.get("payload_bytes_sent", 0))
            c.spec.result = {"retransmits": int(req.get("retransmitted_packets", 0)),
                             "sent_bytes": sent,
                             "goodput_bps": sent * 8 / span if span > 0 else 0.0,
                             "error": o.get("error")}

    @staticmethod
    def ring_reordering(outputs: list[dict[str, Any]]) -> dict[str, int]:
        """What the ring's receivers saw out of order, summed over the ranks' responders:
        packets past a gap that go-back-N dropped and NAKed (``out_of_sequence``), and those
        an ooo receiver placed (``placed_out_of_order``)."""
        out = {"out_of_sequence": 0, "placed_out_of_order": 0}
        for o in outputs:
            resp = (o.get("qp") or {}).get("responder") or {}
            for k in out:
                out[k] += int(resp.get(k, 0))
        return out

    @staticmethod
    def incast_results(iconns: list[Conn], work: Path) -> dict[str, Any]:
        """The incast's QPs' results on their flows, and its summary: goodput in all and
        per QP, the QPs whose retries ran out."""
        outputs = rocebw.read_outputs([c.spec for c in iconns], work / "incast")
        for c in iconns:
            c.spec.result = rocebw.flow_result(outputs[c.spec.id])
        return {"goodput_mbps": round(sum(float(o.get("goodput_mbps") or 0.0)
                                          for o in outputs.values()), 3),
                "qps": {i: {"goodput_mbps": o.get("goodput_mbps"),
                            "retransmitted_packets": (o.get("totals") or {}).get(
                                "retransmitted_packets"),
                            "error": o.get("error")} for i, o in outputs.items()},
                "lost": sorted(i for i, o in outputs.items() if o.get("missing"))}
