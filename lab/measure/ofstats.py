"""Every bridge's per-flow counters at once, over each bridge's management socket.

What ``ovs-ofctl dump-flows BR table=0`` prints, for all bridges from this one process: an
OpenFlow 1.3 flow-stats request on every ``<bridge>.mgmt`` socket together, the replies read
as they come. Measured at k=8 (80 bridges, ~720 ports): a process and a new OpenFlow session
per bridge cost ``ovs-vswitchd`` ~69 ms of its main loop each (every wake-up of that loop
polls every port of the userspace datapath), 5.5 CPU-seconds a round of 80, one after the
other for 5.7 s; all at once over the sockets, ~16 ms a round. The messages are built and
parsed by os-ken's OpenFlow library (the controller's runtime), not by hand.
"""

from __future__ import annotations

import selectors
import socket
import time
from pathlib import Path

from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

OVS_RUN_DIR = Path("/var/run/openvswitch")
#: An OpenFlow header's length.
HEADER = 8

FlowCounters = dict[str, dict[int, tuple[int, int]]]


class _Version:
    """What os-ken's message classes need of a datapath to encode and decode: its version's
    constants and parser."""

    ofproto = ofp
    ofproto_parser = parser


def _encoded(msg: parser.MsgBase, xid: int) -> bytes:
    msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)


def table0_counters(bridges: list[str], timeout_s: float = 10.0,
                    run_dir: Path = OVS_RUN_DIR) -> FlowCounters:
    """{bridge: {cookie: (packets, bytes)}} of the entries in table 0 with a cookie (the
    lab's per-flow counter entries), every bridge asked at once.

    Raises ``OSError`` naming the bridge when one refuses, closes or answers with an
    OpenFlow error, and ``TimeoutError`` naming those that did not answer in ``timeout_s``.
    """
    request = _encoded(parser.OFPHello(_Version), 1) + _encoded(
        parser.OFPFlowStatsRequest(_Version, table_id=0), 2)
    out: FlowCounters = {br: {} for br in bridges}
    sel = selectors.DefaultSelector()
    conns: dict[socket.socket, tuple[str, bytearray]] = {}
    try:
        for br in bridges:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conns[s] = (br, bytearray())
            try:
                s.connect(str(run_dir / f"{br}.mgmt"))
                s.sendall(request)
            except OSError as e:
                raise OSError(f"{br}: {e.strerror or e}") from None
            sel.register(s, selectors.EVENT_READ)
        pending = set(bridges)
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                br, buf = conns[s]
                data = s.recv(1 << 16)
                if not data:
                    raise OSError(f"{br}: the switch closed its management connection")
                buf += data
                if _read(br, s, buf, out[br]):
                    sel.unregister(s)
                    pending.discard(br)
        if pending:
            raise TimeoutError(f"no flow statistics in {timeout_s:g} s from "
                               f"{', '.join(sorted(pending))}")
    finally:
        sel.close()
        for s in conns:
            s.close()
    return out


def _read(br: str, s: socket.socket, buf: bytearray,
          into: dict[int, tuple[int, int]]) -> bool:
    """Take every whole message off ``buf``; True once the last flow-stats reply is in."""
    done = False
    while len(buf) >= HEADER:
        version, msg_type, msg_len, xid = ofproto_parser.header(bytes(buf[:HEADER]))
        if len(buf) < msg_len:
            break
        raw = bytes(buf[:msg_len])
        del buf[:msg_len]
        if msg_type == ofp.OFPT_ECHO_REQUEST:
            s.sendall(_encoded(parser.OFPEchoReply(_Version), xid))
            continue
        if msg_type == ofp.OFPT_ERROR:
            err = ofproto_parser.msg(_Version, version, msg_type, msg_len, xid, raw)
            raise OSError(f"{br}: OpenFlow error type {err.type} code {err.code}")
        if msg_type != ofp.OFPT_MULTIPART_REPLY:
            continue                                   # the switch's hello
        reply = ofproto_parser.msg(_Version, version, msg_type, msg_len, xid, raw)
        for st in reply.body:
            if st.cookie:
                into[st.cookie] = (st.packet_count, st.byte_count)
        done = not reply.flags & ofp.OFPMPF_REPLY_MORE
    return done
