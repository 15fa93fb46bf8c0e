"""TCP's reordering counters, parsed from /proc/net/netstat as a kernel wrote it.

The texts under ``netstat/`` were captured on this lab's kernel (6.18) from two network
namespaces joined by a veth whose sender side ran a token bucket with a 30 kB queue, before
and after 2 s of iperf3 with 4 streams: the queue dropped, so the receiver queued segments
out of order (``TCPOFOQueue``) and the sender recovered by SACK (``TCPSackRecovery``), while
nothing was reordered on the wire (the reordering counters stay 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.measure import reorder

HERE = Path(__file__).parent / "netstat"


def capture(name: str) -> str:
    return (HERE / f"{name}.txt").read_text()


def test_the_parser_pairs_each_name_with_its_value_in_tcpext_only() -> None:
    after = reorder.parse_netstat(capture("receiver-after"))
    assert len(after) == 135
    assert after["TCPOFOQueue"] == 1082
    assert after["TCPRcvCoalesce"] == 1204
    assert all(n in after for n in reorder.COUNTERS)
    # IpExt's octets are a different section: never mixed into TcpExt's names.
    assert "InOctets" not in after
    ip = reorder.parse_netstat(capture("receiver-after"), "IpExt")
    assert ip["InOctets"] == 12269562 and "TCPOFOQueue" not in ip


def test_the_window_delta_is_each_ends_own_view() -> None:
    rx = reorder.delta(reorder.parse_netstat(capture("receiver-before")),
                       reorder.parse_netstat(capture("receiver-after")))
    tx_before = reorder.parse_netstat(capture("sender-before"))
    tx_after = reorder.parse_netstat(capture("sender-after"))
    tx = reorder.delta(tx_before, tx_after)
    assert set(rx) == set(tx) == set(reorder.COUNTERS)
    assert rx["TCPOFOQueue"] == 1082 and sum(rx.values()) == 1082
    assert tx == dict.fromkeys(reorder.COUNTERS, 0)
    # The sender did see the loss: the same delta over other names.
    assert reorder.delta(tx_before, tx_after, ["TCPSackRecovery", "TCPFastRetrans"]) == {
        "TCPSackRecovery": 98, "TCPFastRetrans": 1424}


def test_counters_that_go_down_are_not_one_namespace() -> None:
    with pytest.raises(ValueError, match="TCPOFOQueue"):
        reorder.delta(reorder.parse_netstat(capture("receiver-after")),
                      reorder.parse_netstat(capture("receiver-before")))


def test_a_truncated_read_is_refused() -> None:
    text = capture("receiver-after")
    lines = text.splitlines()
    cut = "\n".join([lines[0], lines[1].rsplit(" ", 1)[0], *lines[2:]])
    with pytest.raises(ValueError, match="135 names but 134 values"):
        reorder.parse_netstat(cut)
    with pytest.raises(ValueError, match="section TcpExt"):
        reorder.parse_netstat("\n".join(lines[2:]))


class Replay:
    """A host whose shell prints the captured files in turn (the counters are the kernel's)."""

    def __init__(self, name: str, files: list[str]) -> None:
        self.name = name
        self.files = files

    def cmd(self, command: str) -> str:
        assert command == "cat /proc/net/netstat"
        return capture(self.files.pop(0))


def test_the_report_sums_over_hosts_and_keeps_each() -> None:
    hosts = {"h1": Replay("h1", ["sender-before", "sender-after"]),
             "h5": Replay("h5", ["receiver-before", "receiver-after"]),
             "h6": Replay("h6", ["receiver-before", "receiver-after"])}
    r = reorder.Reordering(hosts, senders=["h1"], receivers=["h6", "h5", "h5"])
    r.open()
    r.close()
    got = r.report()
    assert got["senders"] == ["h1"] and got["receivers"] == ["h5", "h6"]
    assert got["per_host"]["h5"]["TCPOFOQueue"] == got["per_host"]["h6"]["TCPOFOQueue"] == 1082
    assert got["per_host"]["h1"]["TCPOFOQueue"] == 0
    assert got["sum"]["TCPOFOQueue"] == 2164
    assert got["sum"]["TCPSACKReorder"] == 0
