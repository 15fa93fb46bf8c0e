"""ECN marking config, RED command generation and counter parsing (no root, no network)."""

from __future__ import annotations

import math
import re
import shutil
import struct

import pytest

from controllers import ecn
from controllers.marking import (
    AHEAD_BYTES,
    Marking,
    PortQueue,
    htb_class_args,
    parse_marking,
    tcp_wire_ceiling_bps,
)

PORT = PortQueue("leaf1-eth5", 50_000_000, 150_000)


# --- parse_marking --------------------------------------------------------------------------

def test_step_from_k_bytes() -> None:
    m = parse_marking({"k_bytes": 30_000}, "ports[2]")
    assert m == Marking(30_000, 30_000, 1.0) == Marking.step(30_000)
    assert m.is_step


def test_red_style_thresholds() -> None:
    m = parse_marking({"kmin_bytes": 20_000, "kmax_bytes": 60_000, "pmax": 0.1}, "ports[0]")
    assert (m.kmin_bytes, m.kmax_bytes, m.pmax) == (20_000, 60_000, 0.1)
    assert not m.is_step
    assert parse_marking({"kmin_bytes": 5, "kmax_bytes": 5, "pmax": 1}, "x").pmax == 1.0


@pytest.mark.parametrize(("obj", "field"), [
    ({"k_bytes": 0}, "k_bytes"),
    ({"k_bytes": -1}, "k_bytes"),
    ({"k_bytes": True}, "k_bytes"),           # bool is not an int
    ({"k_bytes": 3e4}, "k_bytes"),
    ({"k_bytes": "30000"}, "k_bytes"),
    ({"k_bytes": 2**31}, "k_bytes"),          # beyond what the BPF arithmetic allows
    ({"kmin_bytes": 60_000, "kmax_bytes": 20_000, "pmax": 0.1}, "kmin_bytes"),
    ({"kmin_bytes": 0, "kmax_bytes": 20_000, "pmax": 0.1}, "kmin_bytes"),
    ({"kmin_bytes": 1, "kmax_bytes": False, "pmax": 0.1}, "kmax_bytes"),
    ({"kmin_bytes": 1, "kmax_bytes": 2, "pmax": 0}, "pmax"),
    ({"kmin_bytes": 1, "kmax_bytes": 2, "pmax": 1.5}, "pmax"),
    ({"kmin_bytes": 1, "kmax_bytes": 2, "pmax": -0.1}, "pmax"),
    ({"kmin_bytes": 1, "kmax_bytes": 2, "pmax": math.nan}, "pmax"),
    ({"kmin_bytes": 1, "kmax_bytes": 2, "pmax": True}, "pmax"),
    ({"kmin_bytes": 1, "kmax_bytes": 2, "pmax": "0.1"}, "pmax"),
    ({"kmin_bytes": 1, "kmax_bytes": 2}, "pmax"),                 # missing
    ({"k": 30_000}, "k"),                                         # unknown
    ({"k_bytes": 30_000, "pmax": 0.5}, "pmax"),                   # both forms
])
def test_errors_name_the_field(obj: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^ports\[2\]\.{re.escape(field)}: "):
        parse_marking(obj, "ports[2]")


def test_error_for_a_non_object_names_where() -> None:
    with pytest.raises(ValueError, match=r"^ports\[2\]: "):
        parse_marking(30_000, "ports[2]")


def test_without_where_the_message_starts_with_the_key() -> None:
    with pytest.raises(ValueError, match=r"^k_bytes: "):
        parse_marking({"k_bytes": 0}, "")


def test_marking_and_port_validate_themselves() -> None:
    with pytest.raises(ValueError, match=r"^kmin_bytes: "):
        Marking(10, 5)
    with pytest.raises(ValueError, match=r"^pmax: "):
        Marking(10, 20, 0.0)
    with pytest.raises(ValueError, match=r"^p0\.rate_bps: "):
        PortQueue("p0", 0, 1000)
    with pytest.raises(ValueError, match=r"^p0\.limit_bytes: "):
        PortQueue("p0", 10**6, True)
    with pytest.raises(ValueError, match=r"^p0\.burst_bytes: "):
        PortQueue("p0", 10**6, 1000, -1)
    with pytest.raises(ValueError, match=r"^intf: "):
        PortQueue("a-name-longer-than-15", 10**6, 1000)


@pytest.mark.parametrize("mbit", [1, 10, 50, 100, 200, 1000, 10_000])
def test_default_burst_is_the_labs(mbit: int) -> None:
    assert PortQueue("p0", mbit * 10**6, 1000).htb_burst == AHEAD_BYTES
    assert PortQueue("p0", mbit * 10**6, 1000, 5000).htb_burst == 5000


def test_unknown_mechanism(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"^mechanism: "):
        ecn.make_marker("wred", tmp_path)
    assert ecn.make_marker("red", tmp_path).mechanism == "red"


# --- red --------------------------------------------------------------------------------------

LEAF = ["dev", "leaf1-eth5", "parent", "1:1", "handle", "10:"]


def test_red_step_replaces_the_bfifo() -> None:
    assert ecn.red_commands(PORT, Marking.step(30_000), None) == [
        ["tc", "qdisc", "del", *LEAF],
        ["tc", "qdisc", "add", *LEAF, "red", "limit", "150000", "min", "30000",
         "max", "30001", "avpkt", "1500", "burst", "20", "probability", "1",
         "bandwidth", "50mbit", "ecn"],
    ]


def test_red_new_thresholds_change_in_place() -> None:
    """``change`` keeps RED's counters; only a kind change needs delete + add."""
    cmds = ecn.red_commands(PORT, Marking(20_000, 60_000, 0.1), Marking.step(30_000))
    assert cmds == [["tc", "qdisc", "change", *LEAF, "red", "limit", "150000",
                     "min", "20000", "max", "60000", "avpkt", "1500", "burst", "14",
                     "probability", "0.1", "bandwidth", "50mbit", "ecn"]]


def test_red_off_restores_the_bfifo() -> None:
    assert ecn.red_commands(PORT, None, Marking.step(30_000)) == [
        ["tc", "qdisc", "del", *LEAF],
        ["tc", "qdisc", "add", *LEAF, "bfifo", "limit", "150000"],
    ]
    assert ecn.red_commands(PORT, None, None) == []


#: ``tc -j qdisc show`` of a port with traffic classes (controllers/classes.py), as
#: iproute2 6.1 prints it: the queue 10: hangs under the lossless class 1:10.
CLASSES_PORT = [{"kind": "htb", "handle": "1:", "root": True, "options": {"default": "0x20"}},
                {"kind": "bfifo", "handle": "10:", "parent": "1:10",
                 "options": {"limit": 75000}},
                {"kind": "bfifo", "handle": "20:", "parent": "1:20",
                 "options": {"limit": 150000}}]


def test_red_takes_the_leaf_where_it_hangs_with_its_own_limit() -> None:
    """On a port with classes RED replaces the lossless class's queue (under 1:10, its
    75 kB), and marking off puts that bfifo back there; the kernel refuses a qdisc under
    the inner class 1:1 ("Invalid argument")."""
    parent, limit = ecn.leaf_of(CLASSES_PORT, "leaf1-eth1")
    assert (parent, limit) == ("1:10", 75000)
    port = PortQueue("leaf1-eth1", 25_000_000, limit)
    leaf = ["dev", "leaf1-eth1", "parent", "1:10", "handle", "10:"]
    on = ecn.red_commands(port, Marking(2500, 10_000, 0.2), None, parent)
    assert on[0] == ["tc", "qdisc", "del", *leaf]
    assert on[1][:len(leaf) + 6] == ["tc", "qdisc", "add", *leaf, "red", "limit", "75000"]
    assert ecn.red_commands(port, None, Marking(2500, 10_000, 0.2), parent)[1] == [
        "tc", "qdisc", "add", *leaf, "bfifo", "limit", "75000"]
    single = [{"kind": "bfifo", "handle": "10:", "parent": "1:1", "options": {"limit": 150000}}]
    assert ecn.leaf_of(single, "p0") == ("1:1", 150000)
    with pytest.raises(ecn.MarkerError, match="no queue 10:"):
        ecn.leaf_of(CLASSES_PORT[:1], "p0")


def test_red_rate_that_is_not_whole_mbit() -> None:
    args = ecn.red_args(PortQueue("p0", 2_500_000, 60_000), Marking.step(3000))
    assert args[args.index("bandwidth") + 1] == "2500000bit"


def test_red_refuses_kmin_below_one_packet() -> None:
    with pytest.raises(ecn.MarkerError, match=r"^p0: RED needs kmin_bytes"):
        ecn.red_args(PortQueue("p0", 10**7, 60_000), Marking.step(1000))


def _tc_red_eval_ewma(qmin: int, burst: int, avpkt: int) -> int:
    """iproute2's tc_red_eval_ewma (tc/tc_red.c): Wlog, or -1 when tc refuses."""
    w, a = 0.5, burst + 1 - qmin / avpkt
    if a < 1.0:
        return -1
    for wlog in range(1, 32):
        if a <= (1 - (1 - w) ** burst) / w:
            return wlog
        w /= 2
    return -1


@pytest.mark.parametrize("kmin", [1500, 2000, 3000, 7500, 20_000, 30_000, 30_001, 200_000])
def test_red_burst_is_the_smallest_tc_accepts(kmin: int) -> None:
    burst = ecn.red_burst(kmin)
    wlog = _tc_red_eval_ewma(kmin, burst, ecn.RED_AVPKT)
    assert wlog >= 1
    assert kmin < 15_000 or wlog == 1  # weight 1/2 once K is a few packets
    assert _tc_red_eval_ewma(kmin, burst - 1, ecn.RED_AVPKT) == -1


def test_red_counters_from_tc_json() -> None:
    # `tc -s -j qdisc show dev X` (iproute2 6.1): RED's xstats sit in the qdisc's object.
    qdiscs = [
        {"kind": "htb", "handle": "1:", "root": True, "options": {"r2q": 10},
         "bytes": 9_000_000, "packets": 7000, "drops": 3, "backlog": 0, "qlen": 0},
        {"kind": "red", "handle": "10:", "parent": "1:1",
         "options": {"limit": 150000, "min": 30000, "max": 30001, "ecn": True},
         "bytes": 8_999_000, "packets": 6990, "drops": 3, "overlimits": 400,
         "requeues": 0, "backlog": 0, "qlen": 0,
         "marked": 321, "early": 2, "pdrop": 1, "other": 0},
        {"kind": "clsact", "handle": "ffff:", "parent": "ffff:fff1"},
    ]
    assert ecn.parse_red_counters(qdiscs, "leaf1-eth5") == {
        "packets": 6990, "ce_marked": 321, "early_drops": 2}


def test_red_counters_without_red_name_the_port() -> None:
    with pytest.raises(ecn.MarkerError, match=r"^leaf1-eth5: no red qdisc"):
        ecn.parse_red_counters([{"kind": "bfifo", "handle": "10:"}], "leaf1-eth5")


# --- tc-bpf: the maps' layout -------------------------------------------------------------

def _c_struct(name: str) -> list[tuple[str, str]]:
    """(type, field) of a struct in ecn_marker.c, in order."""
    body = re.search(rf"struct {name} \{{(.*?)\n\}};", ecn.SOURCE.read_text(), re.S)
    assert body, name
    return re.findall(r"^\s*(struct bpf_spin_lock|__u\d+)\s+(\w+);", body.group(1), re.M)


def test_config_layout_matches_the_c_struct() -> None:
    fields = _c_struct("ecn_config")
    assert {t for t, _ in fields} == {"__u64"}
    assert len(fields) * 8 == ecn._CONFIG.size


def test_state_layout_matches_the_c_struct() -> None:
    fields = _c_struct("ecn_state")
    assert tuple(f for _, f in fields) == ecn._STATE_FIELDS
    assert set(ecn.COUNTERS) <= set(ecn._STATE_FIELDS)
    sizes = {"struct bpf_spin_lock": 4, "__u32": 4, "__u64": 8}
    assert sum(sizes[t] for t, _ in fields) == ecn._STATE.size


def test_config_values() -> None:
    rate, burst, limit, kmin, kmax, pmax, on = struct.unpack(
        "<7Q", ecn.config_value(PORT, Marking.step(30_000)))
    assert (rate, burst, limit, kmin, kmax, pmax, on) == (
        50_000_000, AHEAD_BYTES, 150_000, 30_000, 30_000, 2**32, 1)
    *_, pmax, on = struct.unpack("<7Q", ecn.config_value(PORT, Marking(1, 2, 0.25)))
    assert (pmax, on) == (2**30, 1)
    *_, on = struct.unpack("<7Q", ecn.config_value(PORT, None))
    assert on == 0


def test_state_from_bpftool_json() -> None:
    raw = struct.pack("<II8Q", 0, 0, 123, 456, 10, 9, 4, 6000, 1, 70_000)
    state = ecn.parse_state([f"0x{b:02x}" for b in raw])
    assert state == {"packets": 10, "ect": 9, "ce_marked": 4, "ce_bytes": 6000,
                     "not_ect_over_k": 1, "max_vq_bytes": 70_000}


@pytest.mark.skipif(not shutil.which("clang"), reason="needs clang (run: make setup)")
def test_object_is_built_once_per_source(tmp_path) -> None:
    obj = ecn.build_object(tmp_path)
    assert obj.is_file() and obj.parent == tmp_path
    assert re.fullmatch(r"ecn_marker-[0-9a-f]{16}\.o", obj.name)
    mtime = obj.stat().st_mtime_ns
    assert ecn.build_object(tmp_path) == obj and obj.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [obj.name]  # no temp file left


def test_a_lab_port_is_a_wire() -> None:
    """Every htb class bursts one wire frame at most (its qdisc counts wire bytes:
    lab/net/wire.py): TCP's ceiling is its payload share of full frames on the wire."""
    args = htb_class_args(50.0).split()
    assert "overhead" not in args and "mpu" not in args       # the size table counts them
    assert args[args.index("burst") + 1] == "1538" == args[args.index("cburst") + 1]
    assert htb_class_args(47.5, 50.0).split()[1:5] == ["rate", "47.5mbit", "ceil", "50.0mbit"]
    assert tcp_wire_ceiling_bps(50e6) == pytest.approx(47.074e6, rel=1e-4)
