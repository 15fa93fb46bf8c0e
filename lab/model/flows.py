"""A flow as the lab plans it: endpoints, a 5-tuple fixed before it starts, an offered rate.

The 5-tuple is known before any packet is sent, so the controller can install a per-flow
counter for it and the report can say which links those packets crossed. The port ranges
are the lab's, shared by every program that binds a fixed source port.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

PROTO_NUM = {"tcp": 6, "udp": 17}
#: RoCEv2's UDP destination port (IANA): a flow to it is RDMA, which the lab's traffic
#: classes put in the lossless priority.
ROCE_UDP_PORT = 4791
BASE_DPORT = 5201
COOKIE_BASE = 0xFAB0_0000_0000_0000
#: Source ports the lab fixes (``--cport``, stream and collective ``--sport``) come from below
#: 61000; every lab host's own ephemeral ports are moved above that, so no connection the
#: kernel numbers (iperf3's control connection) can hold a port a flow is about to bind,
#: which would fail that flow with "Address already in use".
FIXED_SPORTS = range(32768, 60999)
HOST_EPHEMERAL_PORTS = (61000, 65535)
EPHEMERAL_SYSCTL = ("net.ipv4.ip_local_port_range="
                    f"'{HOST_EPHEMERAL_PORTS[0]} {HOST_EPHEMERAL_PORTS[1]}'")
#: An MPTCP connection's extra subflows join the receiver at these ports, one each: the
#: receiver announces its own address once per port (ADD_ADDR with a port), so each joined
#: subflow has a destination port of its own and a switch hashing 5-tuples can part them.
#: Below BASE_DPORT, outside the fixed and the ephemeral source ports.
MPTCP_JOIN_PORT = 5101
#: Subflows of one MPTCP connection at most: the in-kernel path manager's limit
#: (``ip mptcp limits``: MPTCP_PM_ADDR_MAX, 8 since Linux 5.7), the first subflow counted.
MPTCP_MAX_SUBFLOWS = 8


@dataclass
class FlowSpec:
    """One iperf3 flow: endpoints, 5-tuple, offered rate."""

    id: str
    src: str
    dst: str
    src_ip: str
    dst_ip: str
    proto: str
    sport: int
    dport: int
    rate_bps: float
    kind: str = "elephant"
    cc: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    #: Subflows an MPTCP connection opens, its first one counted; 1: plain TCP or UDP.
    subflows: int = 1
    #: The flow this 5-tuple is a joined subflow of (found on the wire, not planned).
    subflow_of: str | None = None

    def watch_entries(self, index: int) -> list[dict[str, object]]:
        """Counter entries for the data direction and the reverse (ACK) direction."""
        p = PROTO_NUM[self.proto]
        fwd = {"cookie": COOKIE_BASE + 2 * index, "proto": p, "src": self.src_ip,
               "dst": self.dst_ip, "sport": self.sport, "dport": self.dport}
        rev = {"cookie": COOKIE_BASE + 2 * index + 1, "proto": p, "src": self.dst_ip,
               "dst": self.src_ip, "sport": self.dport, "dport": self.sport}
        if self.proto == "udp" and self.dport == ROCE_UDP_PORT:
            # RoCE answers to UDP 4791 too: the responder's ACKs, NAKs and CNPs leave from
            # the port the data came from (lab/agents/roce's reply_port)
            rev.update(sport=self.sport, dport=ROCE_UDP_PORT)
        return [fwd, rev]


def pick_source_ports(count: int, rng: random.Random) -> list[int]:
    """Distinct ephemeral-range client ports, drawn from the run's seed."""
    return rng.sample(FIXED_SPORTS, count)
