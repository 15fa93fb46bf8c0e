"""The sampler's per-tick counter: sysfs files kept open and re-read in place must give
the interface's current count, and an interface that is not there reads as absent."""

from __future__ import annotations

import socket
from pathlib import Path

from lab.measure.telemetry import TxBytes


def test_a_kept_open_counter_follows_the_interface():
    tx = TxBytes(["lo", "fabriclab-none0"])
    try:
        before = tx.read()
        assert "fabriclab-none0" not in before
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(10):
                s.sendto(b"x" * 1000, ("127.0.0.1", 9))
        after = tx.read()
        assert after["lo"] - before["lo"] >= 10 * 1000
        assert after["lo"] <= int(Path("/sys/class/net/lo/statistics/tx_bytes").read_text())
    finally:
        tx.close()
