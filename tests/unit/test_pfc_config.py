"""controllers.pfc's config: the text pfcd reads, the JSON form the lab sends the controller
(every bad field named by its path), the README's headroom table, and the ports a queue's
size cannot make lossless."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from controllers import pfc
from controllers.marking import WIRE_FRAME_BYTES
from controllers.pfc import Feeder, PfcConfig, WatchedPort

README = Path(pfc.__file__).resolve().parent / "pfc" / "README.md"

JSON: dict[str, Any] = {
    "poll_us": 1000, "pause_bps": 2_500_000,
    "ports": [{"ns": "-", "dev": "leaf1-eth3", "xoff_bytes": 20_000, "xon_bytes": 10_000,
               "prio": 3,
               "feeders": [{"ns": "/proc/42/ns/net", "dev": "h1-eth0",
                            "rate_bps": 25_000_000, "ceil_bps": 50_000_000},
                           {"ns": "-", "dev": "spine1-eth1", "rate_bps": 25_000_000,
                            "ceil_bps": 50_000_000, "pause_bps": 1_000_000}]}]}


def test_the_json_form_becomes_pfcds_config_lines() -> None:
    cfg = PfcConfig.from_dict(JSON)
    lines = [ln for ln in cfg.text().splitlines() if not ln.startswith("#")]
    assert lines == [
        "poll_us 1000", "refresh_us 3000", "pause_bps 2500000",
        "port - leaf1-eth3 prio=3 class=1:10 leaf=10: xoff=20000 xon=10000",
        "feeder /proc/42/ns/net h1-eth0 class=1:10 rate=25000000 ceil=50000000",
        "feeder - spine1-eth1 class=1:10 rate=25000000 ceil=50000000 pause=1000000"]
    assert PfcConfig.from_dict(cfg.to_dict()) == cfg


def test_one_class_feeding_two_ports_is_one_feeder() -> None:
    a = Feeder("-", "s1-eth1", 25_000_000, 50_000_000)
    cfg = PfcConfig((WatchedPort("-", "s2-eth1", 20_000, 10_000, (a,)),
                     WatchedPort("-", "s2-eth2", 20_000, 10_000, (a,))), 2_500_000)
    assert list(cfg.feeders()) == [("", "s1-eth1", "1:10")]


def _bad(change: Any) -> dict[str, Any]:
    d = copy.deepcopy(JSON)
    change(d)
    return d


@pytest.mark.parametrize("change, field", [
    (lambda d: d.pop("pause_bps"), "pfc.pause_bps"),
    (lambda d: d.update(pause_bps=True), "pfc.pause_bps"),
    (lambda d: d.update(poll_us=50), "pfc.poll_us"),
    (lambda d: d.update(refresh_us="3000"), "pfc.refresh_us"),
    (lambda d: d.update(verbose=1), "pfc.verbose"),
    (lambda d: d.update(ports=[]), "pfc.ports"),
    (lambda d: d.update(ports={}), "pfc.ports"),
    (lambda d: d["ports"].append(3), "pfc.ports[1]"),
    (lambda d: d["ports"][0].pop("xon_bytes"), "pfc.ports[0].xon_bytes"),
    (lambda d: d["ports"][0].update(ns="a b"), "pfc.ports[0].ns"),
    (lambda d: d["ports"][0].update(dev="x" * 16), "pfc.ports[0].dev"),
    (lambda d: d["ports"][0].update(dev="eth#1"), "pfc.ports[0].dev"),
    (lambda d: d["ports"][0].update(xoff_bytes=0), "pfc.ports[0].xoff_bytes"),
    (lambda d: d["ports"][0].update(xon_bytes=20_000), "pfc.ports[0].xon_bytes"),
    (lambda d: d["ports"][0].update(prio=8), "pfc.ports[0].prio"),
    (lambda d: d["ports"][0].update({"class": "1:10:1"}), "pfc.ports[0].class"),
    (lambda d: d["ports"][0].update(leaf="10:1"), "pfc.ports[0].leaf"),
    (lambda d: d["ports"][0].update(feeders=[]), "pfc.ports[0].feeders"),
    (lambda d: d["ports"][0]["feeders"].append(dict(d["ports"][0]["feeders"][0])),
     "pfc.ports[0].feeders[2]"),
    (lambda d: d["ports"][0]["feeders"][1].update(rate_bps=4), "pfc.ports[0].feeders[1].rate_bps"),
    (lambda d: d["ports"][0]["feeders"][1].update(ceil_bps=1_000_000),
     "pfc.ports[0].feeders[1].ceil_bps"),
    (lambda d: d["ports"][0]["feeders"][1].update(pause_bps=25_000_000),
     "pfc.ports[0].feeders[1].pause_bps"),
    (lambda d: d["ports"][0]["feeders"][0].update(rate_bps=2_000_000, ceil_bps=2_000_000),
     "pfc.ports[0].feeders[0].rate_bps"),              # not above the config's pause rate
    (lambda d: d["ports"][0]["feeders"][0].pop("dev"), "pfc.ports[0].feeders[0].dev"),
    (lambda d: d["ports"].append(copy.deepcopy(d["ports"][0])),
     "pfc.ports[1].class"),                                             # watched twice
    (lambda d: d["ports"].append({**copy.deepcopy(d["ports"][0]), "class": "1:20",
                                  "leaf": "20:"}), "pfc.ports[1].prio"),
    (lambda d: d["ports"].append({**copy.deepcopy(d["ports"][0]), "dev": "leaf1-eth4",
                                  "prio": 4}), "pfc.ports[1].feeders[0].class"),
    (lambda d: d["ports"].append({**copy.deepcopy(d["ports"][0]), "dev": "leaf1-eth4"})
     or d["ports"][1]["feeders"][0].update(ceil_bps=40_000_000),
     "pfc.ports[1].feeders[0].rate_bps"),             # one class, two rates to return to
])
def test_a_bad_field_is_named_by_its_path(change: Any, field: str) -> None:
    with pytest.raises(ValueError) as err:
        PfcConfig.from_dict(_bad(change))
    assert str(err.value).startswith(f"{field}: "), str(err.value)


def test_a_namespace_is_one_namespace_however_written() -> None:
    """"sw1" and "/run/netns/sw1" are the same file to pfcd: one queue, watched twice."""
    d = copy.deepcopy(JSON)
    d["ports"][0]["ns"] = "sw1"
    d["ports"].append({**copy.deepcopy(d["ports"][0]), "ns": "/run/netns/sw1"})
    with pytest.raises(ValueError, match=r"^pfc\.ports\[1\]\.class: .*already watched"):
        PfcConfig.from_dict(d)


def test_the_headroom_table_in_the_readme() -> None:
    """Every cell of the README's table (1 ms reaction, wire bytes) is headroom_bytes."""
    section = README.read_text().split("\n## Headroom", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if re.match(r"\| \d+ Mbit/s \|", ln)]
    assert len(rows) == 3
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        rate = float(cells[0].split()[0]) * 1e6
        got = [pfc.headroom_bytes(rate, delay, 1e-3) for delay in (0, 0.5e-3, 1e-3)]
        assert got == [int(c.replace(",", "").removesuffix(" B")) for c in cells[1:]], row
    assert pfc.headroom_bytes(50e6, 0, 1e-3) == 6250 + 2 * WIRE_FRAME_BYTES


def test_the_headroom_of_a_queue_is_its_feeders_and_their_leak() -> None:
    """The prototype test's rule: two 50 Mbit/s feeders at a 1.5 ms reaction, plus the
    frame each leaks when its pause lands."""
    port = PfcConfig.from_dict(JSON).ports[0]
    assert pfc.needed_headroom_bytes(port, 1.5e-3) == 2 * (9375 + 3 * WIRE_FRAME_BYTES)


@pytest.mark.parametrize("limit, xoff, match", [
    (100_000, 0, r"xoff_bytes: 0 is not in 1\.\.4294967295"),
    (20_000, 20_000, r"xoff_bytes: 20000 is at or above the queue's size \(20000 B\)"),
    (15_000, 20_000, r"xoff_bytes: 20000 is at or above the queue's size \(15000 B\)"),
    (40_000, 20_000, r"xoff_bytes: headroom 20000 B \(queue size 40000 - XOFF 20000\) is "
                     r"below the 27978 B that 2 feeder\(s\) at 100 Mbit/s in all need with "
                     r"0 ms link delay and 1.5 ms reaction"),
])
def test_a_queue_that_cannot_be_lossless_is_refused(limit: int, xoff: int, match: str) -> None:
    port = WatchedPort("-", "leaf1-eth3", xoff, 10_000,
                       PfcConfig.from_dict(JSON).ports[0].feeders)
    with pytest.raises(ValueError, match=rf"^pfc\.ports\[0\]\.{match}"):
        pfc.check_port(port, limit, 1.5e-3, where="pfc.ports[0]")


def test_the_prototype_tests_queue_is_lossless_and_link_delay_counts() -> None:
    port = PfcConfig.from_dict(JSON).ports[0]
    limit = 20_000 + 24_902 + 15_000          # the prototype test's lossless leaf
    pfc.check_port(port, limit, 1.5e-3)
    with pytest.raises(ValueError, match=r"^port\.xoff_bytes: headroom 39902 B .* with 2 ms"):
        pfc.check_port(port, limit, 1.5e-3, delay_s=2e-3)


def test_xon_not_below_xoff_is_refused_by_the_check_and_by_the_config() -> None:
    feeders = PfcConfig.from_dict(JSON).ports[0].feeders
    port = WatchedPort("-", "leaf1-eth3", 20_000, 20_000, feeders)
    with pytest.raises(ValueError, match=r"^pfc\.ports\[0\]\.xon_bytes: 20000 is not in "
                                         r"0\.\.19999 \(below xoff_bytes\)"):
        pfc.check_port(port, 100_000, 1.5e-3, where="pfc.ports[0]")
    with pytest.raises(ValueError, match=r"^ports\[0\]\.xon_bytes: "):
        PfcConfig((port,), 2_500_000)
