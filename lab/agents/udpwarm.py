"""One empty datagram from each of a sender's source ports: so that an emulated switch has
seen every 5-tuple of a sprayed flow before the measurement starts.

A switch ASIC forwards the first packet of a 5-tuple like any other. Open vSwitch sends it
to its slow path (an upcall) and builds a datapath flow first. A sprayer opens hundreds of
5-tuples in its first millisecond; in the emulation, those upcalls cost a burst of CPU.
That cost belongs to the emulator, not to the network, and sending these datagrams before
the window opens keeps it out of the measurement. They are sent before the receiver
listens, so they reach no program: the receiving host's kernel answers each with an ICMP
port unreachable, rate-limited.

``python -m lab.agents.udpwarm --src IP --dst IP --dport N --sports FIRST:COUNT``
prints the number of datagrams sent.
"""

from __future__ import annotations

import argparse
import socket
import time


def warm(src: str, dst: str, dport: int, sports: range, gap_s: float = 0.0005) -> int:
    """Send one empty datagram from each port of ``sports``; returns how many were sent.
    ``gap_s`` between them spreads the upcalls, as a paced sender would."""
    sent = 0
    for port in sports:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((src, port))
            s.sendto(b"", (dst, dport))
        sent += 1
        time.sleep(gap_s)
    return sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True)
    ap.add_argument("--dst", required=True)
    ap.add_argument("--dport", type=int, required=True)
    ap.add_argument("--sports", required=True, help="FIRST:COUNT")
    a = ap.parse_args()
    first, count = (int(x) for x in a.sports.split(":"))
    print(warm(a.src, a.dst, a.dport, range(first, first + count)))


if __name__ == "__main__":
    main()
