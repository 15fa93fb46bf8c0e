"""The lab's RoCEv2 transport against real Soft-RoCE: ``ib_write_bw`` (perftest) over rxe,
and the lab's ``roce_bw``, goodput against loss on the same link.

Needs the cluster lane (``fabriclab vm cluster up --workers 2``; QEMU, root). Why there:
rxe exists only in the guests' Debian kernel (this machine's kernel has no RDMA), and on
6.1 it opens UDP 4791 in the initial network namespace alone, so one endpoint per kernel:
two guests, each in its initial namespace, over the link between them.

Per loss rate, on both guests' ends of that link: htb at a rate with a byte FIFO (a lab
port), random loss (nftables), and a netem delay on the ACKs' way back (``link``: why not
netem for all of it). First every loss rate on
rxe (``rdma link add rxe0 type rxe``; ``ib_write_bw`` RC WRITE, one QP, 64 KiB messages,
16 outstanding, RoCE MTU 1024, perftest's local ACK timeout 14: 67 ms, retry 7, for a
fixed time), then rxe removed (its UDP 4791 socket closed) and the same with ``roce_bw``
(the same message size, depth, MTU, a 67 ms timer, retry 7, no congestion control: rxe
has none), twice: as the lab runs it, and ``--like rxe``, with rxe's two transport rules
besides (128 packets unacknowledged at most; a NAK during a retry ignored until a message
completes). The senders are not paced below the link: the port's htb is the bottleneck for
both. The agreement held is the second's: same rules, same goodput; the first's gap is
what the two rules cost rxe. ``--capture`` times each go-back-N from the sender's wire.
Under TCG the two guests share this machine's two cores: run nothing beside it.

Usage: python bench/rxe_check.py [--loss 0,0.5,1,2] [--rate-mbps 20] [--delay-ms 1]
       [--duration 8] [--queue-bytes 16000] [--capture] [--json bench/out/rxe_check.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab.machine import vmcluster  # noqa: E402

#: What both transports are set to: perftest's names, then roce_bw's.
SIZE, DEPTH, MTU, TIMEOUT_EXP, RETRY = 65536, 16, 1024, 14, 7
#: perftest's local ACK timeout: 4.096 us x 2^exponent.
TIMEOUT_MS = 4.096e-3 * 2 ** TIMEOUT_EXP
#: The guests' NIC on the link between them, found by its address.
NIC = f"$(ip -o -4 addr | awk '/{vmcluster.NET_PREFIX}/ {{print $2}}')"
#: The agreement the lab's transport is held to, per loss rate.
AGREE = 0.25


class Guests:
    """The two guests: w1 sends, w2 receives."""

    def __init__(self, cluster: vmcluster.VmCluster) -> None:
        self.cluster = cluster
        self.ip = [m.address for m in cluster.members]

    def sh(self, worker: int, line: str, timeout_s: float = 120,
           check: bool = True) -> subprocess.CompletedProcess:
        m = self.cluster.members[worker]
        out = subprocess.run(m.ssh(self.cluster.key, self.cluster.known_hosts, line),
                             capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and out.returncode != 0:
            raise SystemExit(f"w{worker + 1}: `{line}` exited {out.returncode}:\n"
                             f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        return out

    def both(self, line: str) -> None:
        for w in (0, 1):
            self.sh(w, line)

    def fetch(self, worker: int, path: str, dest: Path) -> None:
        """A file of the guest's, copied here byte for byte."""
        m = self.cluster.members[worker]
        out = subprocess.run(m.ssh(self.cluster.key, self.cluster.known_hosts, f"cat {path}"),
                             capture_output=True, timeout=120, check=True)
        dest.write_bytes(out.stdout)

    def pair(self, server: str, client: str, timeout_s: float) -> tuple[str, str]:
        """The server started on w2, then the client on w1; both outputs."""
        m = self.cluster.members[1]
        srv = subprocess.Popen(m.ssh(self.cluster.key, self.cluster.known_hosts, server),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(2.0)
        cli = self.sh(0, client, timeout_s=timeout_s, check=False)
        try:
            s_out, _ = srv.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            srv.kill()
            s_out, _ = srv.communicate()
        return cli.stdout + cli.stderr, s_out


def link(g: Guests, loss: float, delay_ms: float, rate_mbps: float,
         queue_bytes: int) -> None:
    """Each guest's end of the link: htb at the rate with a byte FIFO, as a lab port is,
    and ``loss`` % of what it receives from the other dropped at random (nftables' numgen,
    on arrival: a drop on the sender's own output is an error its send call returns, which
    rxe and roce_bw both simply send again, not a loss); on w2 (the ACKs' way back) a netem
    delay besides. Why not netem for the data's rate and
    loss: netem orphans the packets it queues, which takes away the NIC's back-pressure
    that ``roce_bw`` keeps its queue small by (a lab host's port, htb, keeps it), so its
    timer would measure netem's queue; rxe bounds its packets in flight itself."""
    for w in (0, 1):
        peer = g.ip[1 - w]
        delay = (f"tc qdisc add dev {NIC} parent 1:1 handle 2: netem delay {delay_ms}ms "
                 f"limit 100000 && " if w == 1 and delay_ms else
                 f"tc qdisc add dev {NIC} parent 1:1 handle 2: bfifo limit {queue_bytes} && ")
        g.sh(w, f"tc qdisc del dev {NIC} root 2>/dev/null; "
                f"tc qdisc add dev {NIC} root handle 1: htb default 1 && "
                f"tc class add dev {NIC} parent 1: classid 1:1 htb rate {rate_mbps}mbit "
                f"burst 15k && {delay}"
                "nft delete table ip rxecheck 2>/dev/null; "
                "nft add table ip rxecheck && nft add chain ip rxecheck in "
                "'{ type filter hook prerouting priority -300; }' && "
                f"nft add rule ip rxecheck in ip saddr {peer} numgen random mod 100000 "
                f"'<' {round(loss * 1000)} counter drop")


@functools.cache
def gid_index(g: Guests, worker: int) -> int:
    """rxe0's RoCE v2 GID of the guest's IPv4 address (perftest's ``-x``)."""
    line = ("cd /sys/class/infiniband/rxe0/ports/1 && for i in $(ls gids); do "
            "echo $i $(cat gids/$i) $(cat gid_attrs/types/$i 2>/dev/null); done")
    for row in g.sh(worker, line).stdout.splitlines():
        idx, gid, *kind = row.split(maxsplit=2)
        if "v2" in " ".join(kind) and gid.startswith("0000:0000:0000:0000:0000:ffff"):
            return int(idx)
    raise SystemExit(f"w{worker + 1}: no RoCE v2 IPv4 GID on rxe0")


GUEST_PCAP = "/tmp/rxe-check.pcap"


class Capture:
    """tcpdump on the sender's end of the link (w1), RoCE headers only: what left through
    its queue, and the ACKs and NAKs as they arrived (before the loss rule on arrival)."""

    def __init__(self, g: Guests, pcap: Path | None) -> None:
        self.g, self.pcap, self.pid = g, pcap, ""

    def __enter__(self) -> Capture:
        if self.pcap:
            # removed first: tcpdump writes as its own user, and a sticky /tmp refuses
            # root's reopening of another user's file (fs.protected_regular)
            self.pid = self.g.sh(0, f"rm -f {GUEST_PCAP}; tcpdump -i {NIC} -s 80 -w "
                                    f"{GUEST_PCAP} udp port 4791 >/dev/null 2>&1 & echo $!"
                                 ).stdout.strip()
            time.sleep(1.0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pid:
            self.g.sh(0, f"kill -INT {self.pid}; sleep 1", check=False)
            self.g.fetch(0, GUEST_PCAP, self.pcap)

    def recoveries(self) -> dict[str, Any] | None:
        return recoveries(self.pcap, self.g.ip[0]) if self.pcap else None


#: BTH opcodes (RC): RDMA WRITE first, middle, last, only; the acknowledge.
WRITE_OPCODES, ACK_OPCODE = {6, 7, 8, 10}, 17
#: AETH syndrome of a NAK for a PSN sequence error.
NAK_SEQ = 0x60
PSN_MOD = 1 << 24


def psn_after(psn: int, base: int) -> int:
    """How many PSNs ``psn`` is past ``base`` (0 if before it), through the 24-bit wrap."""
    return max(0, (psn - base + PSN_MOD // 2) % PSN_MOD - PSN_MOD // 2)


def recoveries(pcap: Path, sender: str) -> dict[str, Any]:
    """Each go-back-N recovery on the sender's wire, from its NAK: how long from the NAK's
    arrival to the missing packet leaving again, how many packets left in between (the
    queue's content, plus what the sender added after the NAK arrived: its reaction), and
    how far past the missing PSN the sender had gone. Medians over the run's NAKs."""
    out = subprocess.run(["tshark", "-n", "-r", str(pcap), "-T", "fields",
                          "-e", "frame.time_epoch", "-e", "ip.src", "-e",
                          "infiniband.bth.opcode", "-e", "infiniband.bth.psn",
                          "-e", "infiniband.aeth.syndrome"],
                         capture_output=True, text=True, timeout=300, check=True)
    data: list[tuple[float, int]] = []
    naks: list[tuple[float, int, int]] = []          # (time, psn, index into data)
    for row in out.stdout.splitlines():
        t, src, op, psn, syn = (row.split("\t") + [""] * 5)[:5]
        if not op:
            continue
        if src == sender and int(op) in WRITE_OPCODES:
            data.append((float(t), int(psn)))
        elif src != sender and int(op) == ACK_OPCODE and syn and int(syn, 0) & 0xE0 == NAK_SEQ:
            naks.append((float(t), int(psn), len(data)))
    rows = []
    for t_nak, psn, i in naks:
        j = next((k for k in range(i, len(data)) if data[k][1] == psn), None)
        if j is None:
            continue
        ahead = max((psn_after(d[1], psn) for d in data[max(0, i - 500):j]), default=0)
        rows.append(((data[j][0] - t_nak) * 1e3, j - i, ahead))

    def med(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 2) if xs else None

    return {"data_packets": len(data), "naks": len(naks), "recoveries": len(rows),
            "nak_to_resend_ms_p50": med([r[0] for r in rows]),
            "sent_after_nak_p50": med([r[1] for r in rows]),
            "ahead_of_loss_p50": med([r[2] for r in rows]),
            "sent_after_nak_mean": round(sum(r[1] for r in rows) / len(rows), 1)
            if rows else None}


#: rxe's own counters (a NIC's), read on both ends around a run.
RXE_COUNTERS = ("sent_pkts", "rcvd_pkts", "rcvd_seq_err", "out_of_seq_request",
                "duplicate_request", "completer_retry_err", "retry_exceeded_err")


def rxe_counters(g: Guests) -> list[dict[str, int]]:
    line = ("cd /sys/class/infiniband/rxe0/ports/1/hw_counters && for c in "
            + " ".join(RXE_COUNTERS) + "; do echo $c $(cat $c); done")
    return [{k: int(v) for k, v in (r.split() for r in g.sh(w, line).stdout.splitlines())}
            for w in (0, 1)]


def dropped(g: Guests) -> list[int]:
    """Packets each guest's loss rule dropped since ``link`` set it: w1's are ACKs (and
    CNPs), w2's the data."""
    out = []
    for w in (0, 1):
        text = g.sh(w, "nft list table ip rxecheck").stdout
        m = re.search(r"counter packets (\d+)", text)
        out.append(int(m.group(1)) if m else 0)
    return out


def rxe_run(g: Guests, duration: float, pcap: Path | None) -> dict[str, Any]:
    """One ib_write_bw over rxe: its average BW (payload, Gbit/s -> Mbit/s), rxe's counters
    on both ends over the run, and what the loss rules dropped each way."""
    before = rxe_counters(g)
    opts = (f"-d rxe0 -s {SIZE} -t {DEPTH} -m {MTU} -u {TIMEOUT_EXP} -q 1 -D {duration:g} "
            "-F --report_gbits")
    with Capture(g, pcap) as cap:
        cli, srv = g.pair(f"ib_write_bw {opts} -x {gid_index(g, 1)}",
                          f"ib_write_bw {opts} -x {gid_index(g, 0)} {g.ip[1]}",
                          duration + 60)
    row = re.search(rf"^\s*{SIZE}\s+(\d+)\s+([\d.]+)\s+([\d.]+)", cli, re.M)
    if not row:
        return {"error": (cli + srv)[-600:]}
    after = rxe_counters(g)
    return {"goodput_mbps": round(float(row.group(3)) * 1000, 3),
            "iterations": int(row.group(1)), "dropped": dropped(g),
            "recoveries": cap.recoveries(),
            "counters": [{k: a[k] - b[k] for k in RXE_COUNTERS}
                         for a, b in zip(after, before, strict=True)]}


def lab_run(g: Guests, binary: str, duration: float, pcap: Path | None,
            like: str = "") -> dict[str, Any]:
    """One roce_bw: its goodput and a NIC's counters; ``like="rxe"`` with rxe's two
    transport rules (qp.h) besides its settings."""
    common = "--rate-mbps 1000 --out /tmp/rxe-check-{}.json"
    # the server stops by itself, after the client's time, its drain and the start-up
    with Capture(g, pcap) as cap:
        cli, _ = g.pair(f"{binary} --server --duration {duration + 12:g} "
                        + common.format("server"),
                        f"{binary} --client {g.ip[1]} --duration {duration:g} --size {SIZE} "
                        f"--tx-depth {DEPTH} --mtu {MTU} --rto-ms {TIMEOUT_MS:.3f} "
                        f"--retry-cnt {RETRY} --cc none {like and '--like ' + like} "
                        + common.format("client"),
                        duration + 120)
    got = g.sh(0, "cat /tmp/rxe-check-client.json", check=False).stdout
    try:
        out = json.loads(got)
    except ValueError:
        return {"error": cli[-600:]}
    t = out.get("totals") or {}
    return {"goodput_mbps": out.get("goodput_mbps"), "error": out.get("error"),
            "dropped": dropped(g), "recoveries": cap.recoveries(),
            "retransmitted_packets": t.get("retransmitted_packets"),
            "rto_events": t.get("rto_events"), "naks_received": t.get("naks_received"),
            "naks_ignored": t.get("naks_ignored"), "tx_refused": out.get("tx_refused")}


def pcap(a: argparse.Namespace, who: str, loss: float) -> Path | None:
    """Where a run's capture goes, beside the JSON, if asked for."""
    return Path(a.json).with_name(f"rxe_check-{who}-{loss:g}.pcap") if a.capture else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loss", default="0,0.5,1,2")
    ap.add_argument("--rate-mbps", type=float, default=20.0)
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=8.0)
    # the sender's own queue: a NIC's is a few packets (a full one refuses the send, which
    # both transports take as "send again"); a deeper one lets rxe queue, and resend, more
    ap.add_argument("--queue-bytes", type=int, default=16_000)
    ap.add_argument("--capture", action="store_true",
                    help="tcpdump the sender's end per run and time each recovery")
    ap.add_argument("--json", default=str(REPO / "bench" / "out" / "rxe_check.json"))
    a = ap.parse_args()
    losses = [float(x) for x in a.loss.split(",")]
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    g = Guests(vmcluster.VmCluster.load())
    kernel = g.sh(0, "uname -r").stdout.strip()
    rows: dict[float, dict[str, Any]] = {x: {"loss_pct": x} for x in losses}
    g.both(f"modprobe rdma_rxe && (test -e /sys/class/infiniband/rxe0 || "
           f"rdma link add rxe0 type rxe netdev {NIC})")
    for x in losses:
        link(g, x, a.delay_ms, a.rate_mbps, a.queue_bytes)
        rows[x]["rxe"] = rxe_run(g, a.duration, pcap(a, "rxe", x))
        print(f"rxe   loss {x:g}%: {rows[x]['rxe']}", flush=True)
    # rxe's UDP 4791 socket lives as long as its module: both gone before roce_bw binds it
    g.both("rdma link delete rxe0; modprobe -r rdma_rxe; ! ss -Hlun | grep -q ':4791 '")
    py = ("$(dirname $(readlink -f $(command -v fabriclab)))/python -c \"from controllers "
          "import cbuild; from lab.agents import roce; print(cbuild.build('roce_bw', "
          "roce.ROCE_BW))\"")
    binary = g.sh(0, f"cd /fabriclab 2>/dev/null; {py}").stdout.strip().splitlines()[-1]
    g.sh(1, f"cd /fabriclab 2>/dev/null; {py}")
    for x in losses:
        link(g, x, a.delay_ms, a.rate_mbps, a.queue_bytes)
        rows[x]["lab"] = lab_run(g, binary, a.duration, pcap(a, "lab", x))
        print(f"lab   loss {x:g}%: {rows[x]['lab']}", flush=True)
        link(g, x, a.delay_ms, a.rate_mbps, a.queue_bytes)
        rows[x]["lab_like_rxe"] = lab_run(g, binary, a.duration, pcap(a, "lab-like-rxe", x),
                                          like="rxe")
        print(f"lab like rxe, loss {x:g}%: {rows[x]['lab_like_rxe']}", flush=True)
    g.both(f"tc qdisc del dev {NIC} root 2>/dev/null; nft delete table ip rxecheck; true")
    for r in rows.values():
        rx = r["rxe"].get("goodput_mbps")
        for who in ("lab", "lab_like_rxe"):
            lb = r[who].get("goodput_mbps")
            r[f"{who}_vs_rxe"] = round(lb / rx, 3) if rx and lb is not None else None
        r["agree"] = (r["lab_like_rxe_vs_rxe"] is not None
                      and abs(r["lab_like_rxe_vs_rxe"] - 1) <= AGREE)
    out = {"kernel": kernel, "rate_mbps": a.rate_mbps, "delay_ms": a.delay_ms,
           "queue_bytes": a.queue_bytes,
           "duration_s": a.duration, "size": SIZE, "tx_depth": DEPTH, "mtu": MTU,
           "timeout_ms": round(TIMEOUT_MS, 3), "retry": RETRY, "rows": list(rows.values())}
    Path(a.json).write_text(json.dumps(out, indent=1))
    print("loss %   ib_write_bw (rxe)   roce_bw   lab/rxe   roce_bw --like rxe   /rxe")
    for r in rows.values():
        print(f"{r['loss_pct']:6g}   {r['rxe'].get('goodput_mbps')!s:>17}   "
              f"{r['lab'].get('goodput_mbps')!s:>7}   {r['lab_vs_rxe']!s:>7}   "
              f"{r['lab_like_rxe'].get('goodput_mbps')!s:>18}   {r['lab_like_rxe_vs_rxe']}")
    return 0 if all(r["agree"] for r in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
