"""Emulated links: a veth pair whose ends are shaped by htb with a byte-limited FIFO.

Mininet's ``TCLink`` silently drops ``delay``/``loss``/``max_queue_size`` when the kernel has no
netem. Here every requested property is either applied or refused: the rate and queue come
from htb + bfifo (present in every kernel the lab supports), delay/loss only from netem.
"""

from __future__ import annotations

from mininet.link import Intf, Link, TCIntf

from lab.errors import TopologyError

#: DRR quantum of the single htb class: explicit, or tc warns that rate/r2q is too big.
_QUANTUM_BYTES = 100_000
#: Largest htb burst we need: one GSO/TSO super-packet (64 KiB) plus headers.
_MIN_BURST_BYTES = 70_000


def htb_burst_bytes(bw_mbps: float) -> int:
    """Burst of 2 ms at the link rate, but never below one TSO super-packet.

    With userspace TSO the datapath hands 64 KiB segments to the veth; a smaller burst makes
    htb under-run the configured rate.
    """
    return max(_MIN_BURST_BYTES, int(bw_mbps * 1e6 / 8 * 0.002))


class ShapedIntf(TCIntf):
    """An interface shaped to ``bw`` Mbit/s with a ``queue_bytes`` tail-drop queue.

    Subclasses ``TCIntf`` so that Mininet re-applies this config after OVS adds the port.
    Qdisc layout (handles are fixed so telemetry and later ECN code can find them):
    ``1:`` htb root, class ``1:1`` at the link rate, leaf ``10:`` bfifo (or netem).
    """

    netem_available = False  # set by the lab from environment detection

    def config(self, bw: float | None = None, queue_bytes: int | None = None,
               delay: str | None = None, loss: float | None = None,
               **params: object) -> dict:
        # No IPv6 on emulated links: router solicitations and MLD reports would otherwise
        # show up in the per-link byte counters that the report checks against the flows.
        self.cmd(f"echo 1 > /proc/sys/net/ipv6/conf/{self.name}/disable_ipv6")
        result = Intf.config(self, **params)
        if (delay or loss) and not self.netem_available:
            raise TopologyError("link.delay", "this kernel has no netem; delay and loss "
                                "cannot be emulated here (see `fabriclab doctor`)")
        if bw is None:
            return result
        dev = self.name
        self.cmd(f"tc qdisc del dev {dev} root 2>/dev/null")
        burst = htb_burst_bytes(bw)
        cmds = [
            f"tc qdisc add dev {dev} root handle 1: htb default 1",
            f"tc class add dev {dev} parent 1: classid 1:1 htb rate {bw}mbit ceil {bw}mbit "
            f"burst {burst} cburst {burst} quantum {_QUANTUM_BYTES}",
        ]
        if delay or loss:
            netem = "netem" + (f" delay {delay}" if delay else "") + (
                f" loss {loss}%" if loss else "")
            limit_pkts = max(1, (queue_bytes or 150_000) // 1500)
            cmds.append(f"tc qdisc add dev {dev} parent 1:1 handle 10: {netem} "
                        f"limit {limit_pkts}")
        else:
            cmds.append(f"tc qdisc add dev {dev} parent 1:1 handle 10: bfifo "
                        f"limit {queue_bytes or 150_000}")
        for cmd in cmds:
            out = self.cmd(f"{cmd} 2>&1; echo __rc=$?").strip()
            text, _, rc = out.rpartition("__rc=")
            if rc.strip() != "0":
                raise TopologyError("link", f"{dev}: `{cmd}` failed: {text.strip()}")
        result["bw"] = bw
        return result



class ShapedLink(Link):
    """A Mininet link whose two ends are ``ShapedIntf`` with the same parameters."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("cls1", ShapedIntf)
        kwargs.setdefault("cls2", ShapedIntf)
        super().__init__(*args, **kwargs)
