"""The live view without a fabric: the feed's rates, the page's layout, the server's life.

The browser test on a real run is tests/integration/test_live.py.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

import pytest

from lab.measure import live, telemetry
from lab.model import scenario
from lab.net.topologies import describe, make_topology
from lab.report import live as live_view


def topo(name: str) -> dict:
    return describe(make_topology(scenario.load(name).params["topology"]))


def get(url: str, host: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:     # a hang guard, not a bound
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def test_feed_rates_are_over_the_last_half_second() -> None:
    # The feed's clock is the test's, so ages and rates are exact however slowly this runs.
    clock = [1000.0]
    feed = live.Feed(clock=lambda: clock[0])
    # leaf1:3 idle for 0.75 s, then 1 MB every 0.125 s for 0.5 s: 64 Mbit/s over the last
    # half second (25.6 over all of it, had the older samples been kept).
    for i in range(11):
        feed.publish(998.75 + i * 0.125, {("leaf1", 3): max(0, i - 6) * 1_000_000,
                                          ("leaf1", 4): 5})
    st = feed.state()
    assert st["bps"] == {"leaf1:3": 64_000_000, "leaf1:4": 0}
    feed.set_phase("traffic")
    feed.note("[hash5] 8 flows for 5 s ...\n  fault at 1 s")
    clock[0] = 1000.25
    st = feed.state()
    assert (st["phase"], st["status"]) == ("traffic", "[hash5] 8 flows for 5 s ...")
    assert (st["t"], st["phase_t"]) == (0.25, 0.25) and re.fullmatch(r"\d\d:\d\d:\d\d", st["wall"])
    # A sampler that stopped: its ports have no rate any more, not their last one.
    clock[0] = 1000.0 + live.STALE_S - 0.125
    assert "leaf1:3" in feed.state()["bps"]
    clock[0] = 1000.0 + live.STALE_S + 0.125
    assert feed.state()["bps"] == {}


def test_a_sampler_publishes_only_while_a_feed_is_set() -> None:
    lo = telemetry.Port("lab", 1, "peer", "lo", 1000.0)

    class Recording(live.Feed):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []

        def publish(self, now: float, tx_bytes: Mapping[live.PortKey, int]) -> None:
            self.times.append(now)
            super().publish(now, tx_bytes)
    feed = Recording()
    s = telemetry.Sampler([lo], hz=20)
    with live.publishing(feed):
        assert live.current() is feed
        s.start()
        deadline = time.monotonic() + 60          # a hang guard, not a bound (20 samples/s)
        while len(feed.times) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        s.stop()
    assert live.current() is None
    assert len(feed.times) >= 2
    # Read as of the last sample: however late the test gets here, the samples are fresh.
    feed.clock = lambda: feed.times[-1]
    assert "lab:1" in feed.state()["bps"]
    live.set_phase("nobody listens")          # without a feed: nothing, no error


def test_layout_is_the_weathermap_s() -> None:
    lay = live_view.layout(topo("ecmp-one-pair"))
    arcs = lay["arcs"]
    assert len(arcs) == 24                      # 12 cables, both directions
    sampled = [a for a in arcs if a["id"]]
    assert len(sampled) == 20                   # every switch egress; hosts' own sending not
    ports = {f"{p.node}:{p.port}" for p in telemetry.fabric_ports(topo("ecmp-one-pair"))}
    assert {a["id"] for a in sampled} == ports
    uplinks = sorted(a["name"] for a in arcs if a["uplink"])
    assert uplinks == [f"leaf{i}→spine{j}" for i in (1, 2) for j in (1, 2, 3, 4)]
    assert [t["label"] for t in lay["tiers"]] == ["hosts", "leaves", "spines"]
    assert len(lay["cmap"]) == live_view.CMAP_STOPS and lay["cmap"][0] == "#440154"
    streaming = live_view.layout(topo("streaming-incident"))
    up = {a["name"] for a in streaming["arcs"] if a["uplink"]}
    assert "border1→isp1" in up and "isp1→border1" not in up
    assert not any(a["name"].startswith("isp1→anchor") for a in streaming["arcs"] if a["uplink"])


def test_served_on_loopback_only_and_gone_after(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    with live_view.watching(topo("ecmp-one-pair"), "ecmp-one-pair: hash5", said.append,
                            port=0) as feed:
        url = re.search(r"http://127\.0\.0\.1:\d+/", said[0]).group(0)
        port = int(url.rsplit(":", 1)[1].strip("/"))
        # The feed's clock stops here: however long the requests below take, the samples
        # are not stale when the page asks.
        now = time.monotonic()
        feed.clock = lambda: now
        feed.publish(now - 0.5, {("leaf1", 3): 0})
        feed.publish(now, {("leaf1", 3): 1_000_000})
        status, page = get(url)
        assert status == 200
        text = page.decode()
        # Self-contained: nothing to fetch but /state from where it came.
        assert not re.search(r"<(?:link|img|iframe|object|embed)\b|\bsrc=|\bhref=|url\(|@import",
                             text)
        assert re.findall(r"fetch\(([^,)]*)", text) == ['"/state"']
        assert "ecmp-one-pair: hash5" in text and '"leaf1:3"' in text
        status, body = get(url + "state")
        assert status == 200 and json.loads(body)["bps"]["leaf1:3"] == 16_000_000
        assert get(url + "state", host="rebound.example:80")[0] == 403
        assert get(url + "nothing")[0] == 404
        assert live.current() is feed
        # A fixed port that is taken: another is used.
        with live_view.watching(topo("ecmp-one-pair"), "t", said.append, port=port):
            assert str(port) not in said[-1]
    assert live.current() is None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_stopped_on_an_error_too() -> None:
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt), live_view.watching(
            topo("ecmp-one-pair"), "t", said.append, port=0):
        raise KeyboardInterrupt
    port = int(re.search(r":(\d+)/", said[0]).group(1))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    assert live.current() is None
