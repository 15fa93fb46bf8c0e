"""ECN marking on the switches' egress ports: the mechanism the controller programs.

A port's queue is the lab's htb class ``1:1`` with a bfifo leaf ``10:`` (lab/net/links.py). Two
ways to make it mark, picked by the lab from what the kernel has (``Environment.ecn``):

``red``
    The kernel has RED: the leaf ``10:`` becomes ``red ... ecn``, and goes back to
    ``bfifo`` when marking is turned off. RED decides on an *averaged* queue (EWMA); we
    pick the smallest ``burst`` tc accepts, which makes the average follow the queue as
    closely as RED can (weight 1/2). With ``ecn`` RED still *drops* not-ECT packets where
    it would have marked them.
``tc-bpf``
    No RED (the CI kernel): a tc clsact egress BPF program (bpf/ecn_marker.c) runs before
    the qdisc, so it models the queue instead: a fluid queue draining at the htb rate,
    minus the htb burst (which htb sends ahead of the rate), capped by the bfifo limit.
    It sets CE on ECT packets by the modelled queue a packet finds on arrival, counts as
    the qdisc does (GSO super-packets with their segments' headers), and never drops: the
    bfifo still tail-drops. One program instance per port, loaded by ``tc`` without
    pinning anything, programmed with ``bpftool`` by map id.

Pure stdlib: imported by the controller (os-ken and Ryu 4.34) and by the lab.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import struct
import subprocess
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controllers import cbuild
from controllers.marking import (
    QUEUE_HANDLE,
    WIRE_OVERHEAD_BYTES,
    Marking,
    PortQueue,
)

MECHANISMS = ("red", "tc-bpf")

#: The counters every mechanism reports (RED: the ones it has).
COUNTERS = ("packets", "ect", "ce_marked", "ce_bytes", "not_ect_over_k", "max_vq_bytes")

SOURCE = Path(__file__).resolve().parent / "bpf" / "ecn_marker.c"
PROG_SECTION = "tc"
CONFIG_MAP = "ecn_config"
STATE_MAP = "ecn_state"
#: Our filter's place on the egress hook: fixed, so close() deletes exactly it.
FILTER_PREF = 0xEC0
FILTER_HANDLE = "0xec"

_CMD_TIMEOUT_S = 30


class MarkerError(ValueError):
    """tc or bpftool refused: the message names the interface and what the tool said."""


# --- running tc and bpftool ----------------------------------------------------------------

class _Runner:
    """Runs tools in the ports' network namespace: the lab's (None) or a test's (a PID)."""

    def __init__(self, netns_pid: int | None) -> None:
        self.prefix = ["nsenter", "-t", str(netns_pid), "-n"] if netns_pid else []

    def run(self, intf: str, argv: list[str], stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            r = subprocess.run(self.prefix + argv, input=stdin, capture_output=True,
                               text=True, timeout=_CMD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MarkerError(f"{intf}: `{' '.join(argv)}` failed: {e}") from e
        if check and r.returncode != 0:
            raise MarkerError(f"{intf}: `{' '.join(argv)}` failed: "
                              f"{(r.stderr or r.stdout).strip()}")
        return r

    def json(self, intf: str, argv: list[str]) -> Any:
        out = self.run(intf, argv).stdout
        try:
            return json.loads(out) if out.strip() else []
        except json.JSONDecodeError as e:
            raise MarkerError(f"{intf}: `{' '.join(argv)}` printed no JSON: {e}") from e

    def exists(self, intf: str) -> bool:
        return self.run(intf, ["ip", "link", "show", "dev", intf], check=False).returncode == 0

    def require(self, intf: str) -> None:
        if not self.exists(intf):
            raise MarkerError(f"{intf}: no such interface")


# --- the markers ---------------------------------------------------------------------------

class Marker:
    """Turns marking on, off or to new thresholds on ports; reads its counters.

    Safe to call from several threads (the controller's REST handlers and its stats
    poller): one call at a time per marker.
    """

    mechanism = ""

    def __init__(self, netns_pid: int | None = None) -> None:
        self._run = _Runner(netns_pid)
        self._lock = threading.RLock()
        #: The ports this marker manages, by interface, with what it keeps for each.
        self._ports: dict[str, Any] = {}

    def set(self, port: PortQueue, marking: Marking | None) -> None:
        """Mark on ``port`` per ``marking``; None turns marking off (pure tail-drop).
        Idempotent; changing thresholds keeps the port's counters."""
        with self._lock:
            self._set(port, marking)

    def counters(self) -> dict[str, dict[str, int]]:
        """Interface -> counters (see COUNTERS) for every port this marker manages."""
        with self._lock:
            return self._counters()

    def close(self) -> None:
        """Remove every filter and qdisc this marker added (never the htb)."""
        with self._lock:
            self._close()

    def __enter__(self) -> Marker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _set(self, port: PortQueue, marking: Marking | None) -> None:
        raise NotImplementedError

    def _counters(self) -> dict[str, dict[str, int]]:
        raise NotImplementedError

    def _close(self) -> None:
        """Release every port, each tried even when another fails; then one error naming
        every port that could not be released (the marker forgets them all either way)."""
        errors = []
        for intf, entry in list(self._ports.items()):
            try:
                self._release(intf, entry)
            except MarkerError as e:
                errors.append(str(e))
        self._ports.clear()
        if errors:
            raise MarkerError("; ".join(errors))

    def _release(self, intf: str, entry: Any) -> None:
        """Undo on ``intf`` what this marker added there (``entry``: what it keeps for it)."""
        raise NotImplementedError


# tc-bpf ------------------------------------------------------------------------------------

#: struct ecn_config and struct ecn_state in bpf/ecn_marker.c (little-endian, no padding).
_CONFIG = struct.Struct("<7Q")
_STATE = struct.Struct("<II8Q")
_STATE_FIELDS = ("lock", "pad", "last_ns", "work_units", "packets", "ect", "ce_marked",
                 "ce_bytes", "not_ect_over_k", "max_vq_bytes")
_KEY0 = ["key", "hex", "00", "00", "00", "00"]


def compile_flags() -> list[str]:
    """clang flags for the BPF object. ``-target bpf`` does not search the multiarch
    include dir, where Debian keeps <asm/types.h> (included by <linux/bpf.h>)."""
    flags = ["-O2", "-g", "-target", "bpf", f"-DWIRE_OVERHEAD_BYTES={WIRE_OVERHEAD_BYTES}"]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch and Path(f"/usr/include/{multiarch}").is_dir():
        flags.append(f"-I/usr/include/{multiarch}")
    return flags


def build_object(build_dir: Path) -> Path:
    """The compiled marker, built once per source (``controllers.cbuild``: its name holds
    the sha256 of the source and flags, so an edited source recompiles and an unchanged one
    is reused)."""
    return cbuild.compile_object("ecn_marker", SOURCE, flags=compile_flags(),
                                 build_dir=build_dir)


def config_value(port: PortQueue, marking: Marking | None) -> bytes:
    """The ecn_config map value. Marking off keeps the queue model running (counters,
    max_vq_bytes) but marks nothing."""
    shaping = (port.rate_bps, port.htb_burst, port.limit_bytes)
    if marking is None:
        return _CONFIG.pack(*shaping, 0, 0, 0, 0)
    pmax_x32 = min(2**32, max(1, round(marking.pmax * 2**32)))
    return _CONFIG.pack(*shaping, marking.kmin_bytes, marking.kmax_bytes, pmax_x32, 1)


def parse_state(value: list[str]) -> dict[str, int]:
    """Counters from an ecn_state value as bpftool -j prints it (a list of "0x.." bytes)."""
    raw = bytes(int(b, 16) for b in value)
    if len(raw) != _STATE.size:
        raise ValueError(f"ecn_state value has {len(raw)} bytes, expected {_STATE.size}")
    fields = dict(zip(_STATE_FIELDS, _STATE.unpack(raw), strict=True))
    return {name: fields[name] for name in COUNTERS}


@dataclass
class _Loaded:
    """One port's program instance and what we added to load it."""

    port: PortQueue
    marking: Marking | None
    prog_id: int
    config_map: int
    state_map: int
    added_clsact: bool


class TcBpfMarker(Marker):
    """A virtual-queue marker per port, as a tc clsact egress program.

    ``tc filter add ... bpf da obj`` loads one instance of the program (with its own maps)
    per port. iproute2 mounts a bpffs at /sys/fs/bpf when it loads an object, even when
    nothing is pinned; we run it in a private mount namespace (``unshare -m``) so that
    mount dies with tc. Nothing is pinned: the filter holds the program, the program its
    maps, and we find them by id from the filter.
    """

    mechanism = "tc-bpf"

    def __init__(self, build_dir: Path, netns_pid: int | None = None) -> None:
        super().__init__(netns_pid)
        self.obj = build_object(build_dir)
        self._ports: dict[str, _Loaded] = {}

    def _set(self, port: PortQueue, marking: Marking | None) -> None:
        loaded = self._ports.get(port.intf)
        if loaded is None:
            if marking is None:
                return  # nothing loaded, so nothing marks already
            loaded = self._load(port)
        elif loaded.port == port and loaded.marking == marking:
            return
        self._run.run(port.intf, ["bpftool", "map", "update", "id", str(loaded.config_map),
                                  *_KEY0, "value", "hex",
                                  *config_value(port, marking).hex(" ").split()])
        loaded.port, loaded.marking = port, marking

    def _load(self, port: PortQueue) -> _Loaded:
        intf = port.intf
        self._run.require(intf)
        if self._our_filter(intf):
            raise MarkerError(f"{intf}: a filter already sits at egress pref {FILTER_PREF} "
                              "(another marker's?)")
        qdiscs = self._run.json(intf, ["tc", "-j", "qdisc", "show", "dev", intf])
        loaded = _Loaded(port, None, 0, 0, 0,
                         added_clsact=not any(q.get("kind") == "clsact" for q in qdiscs))
        try:
            if loaded.added_clsact:
                self._run.run(intf, ["tc", "qdisc", "add", "dev", intf, "clsact"])
            self._run.run(intf, ["unshare", "--mount", "--propagation", "private",
                                 "tc", "filter", "add", "dev", intf, "egress",
                                 "pref", str(FILTER_PREF), "handle", FILTER_HANDLE, "bpf",
                                 "da", "obj", str(self.obj), "sec", PROG_SECTION])
            flt = self._our_filter(intf)
            prog = (flt or {}).get("options", {}).get("prog", {}).get("id")
            if not prog:
                raise MarkerError(f"{intf}: loaded the marker but tc shows no program id: "
                                  f"{flt}")
            loaded.prog_id = int(prog)
            maps = self._maps_of(intf, loaded.prog_id)
        except MarkerError:
            with contextlib.suppress(MarkerError):  # the first error is the one to report
                self._release(intf, loaded)
            raise
        loaded.config_map, loaded.state_map = maps[CONFIG_MAP], maps[STATE_MAP]
        self._ports[intf] = loaded
        return loaded

    def _our_filter(self, intf: str) -> dict[str, Any] | None:
        """Our filter on the port's egress hook, as ``tc -j filter show`` prints it."""
        out = self._run.json(intf, ["tc", "-j", "filter", "show", "dev", intf, "egress",
                                    "pref", str(FILTER_PREF)])
        return next((f for f in out if "options" in f), None)

    def _maps_of(self, intf: str, prog_id: int) -> dict[str, int]:
        """Map name -> id for the maps of this program instance."""
        prog = self._run.json(intf, ["bpftool", "-j", "prog", "show", "id", str(prog_id)])
        names: dict[str, int] = {}
        for map_id in prog.get("map_ids", []):
            info = self._run.json(intf, ["bpftool", "-j", "map", "show", "id", str(map_id)])
            names[info.get("name", "")] = int(map_id)
        missing = {CONFIG_MAP, STATE_MAP} - names.keys()
        if missing:
            raise MarkerError(f"{intf}: program {prog_id} has no map {sorted(missing)} "
                              f"(has {sorted(names)})")
        return names

    def _counters(self) -> dict[str, dict[str, int]]:
        if not self._ports:
            return {}
        intfs = list(self._ports)
        # One bpftool for all ports: the controller polls this on every port.
        batch = "".join(f"map lookup id {self._ports[i].state_map} {' '.join(_KEY0)}\n"
                        for i in intfs)
        r = self._run.run(intfs[0], ["bpftool", "-j", "batch", "file", "-"], stdin=batch,
                          check=False)
        try:
            outputs = json.loads(r.stdout)
        except json.JSONDecodeError as e:
            raise MarkerError(f"{','.join(intfs)}: `bpftool batch` failed: "
                              f"{r.stderr.strip() or e}") from e
        result: dict[str, dict[str, int]] = {}
        for intf, entry in zip(intfs, outputs, strict=False):
            out = entry.get("output", {})
            if "error" in out or "value" not in out:
                raise MarkerError(f"{intf}: `bpftool map lookup id "
                                  f"{self._ports[intf].state_map}` failed: "
                                  f"{out.get('error', out)}")
            result[intf] = parse_state(out["value"])
        if len(result) != len(intfs):
            raise MarkerError(f"{','.join(intfs)}: bpftool batch stopped early: "
                              f"{r.stderr.strip()}")
        return result

    def _release(self, intf: str, loaded: _Loaded) -> None:
        if not self._run.exists(intf):
            return  # the port is gone, and with it the filter, program and maps
        if self._our_filter(intf):
            self._run.run(intf, ["tc", "filter", "del", "dev", intf, "egress",
                                 "pref", str(FILTER_PREF)])
        if loaded.added_clsact:
            # Someone may have put their own filters on the clsact since: keep it for them.
            others = [f for hook in ("ingress", "egress") for f in self._run.json(
                intf, ["tc", "-j", "filter", "show", "dev", intf, hook])]
            if not others:
                self._run.run(intf, ["tc", "qdisc", "del", "dev", intf, "clsact"])


# red ---------------------------------------------------------------------------------------

RED_AVPKT = 1500


def _rate_arg(rate_bps: int) -> str:
    """A tc rate: in Mbit/s as the lab writes them ("50mbit") when that is exact."""
    return f"{rate_bps // 10**6}mbit" if rate_bps % 10**6 == 0 else f"{rate_bps}bit"


def red_burst(kmin_bytes: int) -> int:
    """The smallest RED ``burst`` (packets) tc accepts for this Kmin: ceil(Kmin/avpkt).

    tc derives the EWMA weight from burst; the smallest burst gives the largest weight
    (1/2 once Kmin is a few packets), so RED's average follows the real queue about as
    closely as the instantaneous queue DCTCP and the tc-bpf marker use.
    """
    return max(1, math.ceil(kmin_bytes / RED_AVPKT))


def red_args(port: PortQueue, marking: Marking) -> list[str]:
    """``red ...`` for the leaf qdisc. Kmax is at least Kmin + 1: a step is ``min K max
    K+1 probability 1`` (RED marks everything whose average is at or above max)."""
    if marking.kmin_bytes < RED_AVPKT:
        # tc finds no EWMA weight for min < avpkt ("failed to calculate EWMA constant").
        raise MarkerError(f"{port.intf}: RED needs kmin_bytes >= {RED_AVPKT} (one avpkt), "
                          f"not {marking.kmin_bytes}")
    kmax = max(marking.kmax_bytes, marking.kmin_bytes + 1)
    return ["red", "limit", str(port.limit_bytes), "min", str(marking.kmin_bytes),
            "max", str(kmax), "avpkt", str(RED_AVPKT), "burst", str(red_burst(
                marking.kmin_bytes)), "probability", f"{marking.pmax:g}",
            "bandwidth", _rate_arg(port.rate_bps), "ecn"]


#: The class a lab port's queue hangs from in its single-FIFO layout (lab/net/links.py).
LEAF_PARENT = "1:1"


def _leaf(intf: str, parent: str) -> list[str]:
    return ["dev", intf, "parent", parent, "handle", QUEUE_HANDLE]


def leaf_of(qdiscs: list[dict[str, Any]], intf: str) -> tuple[str, int | None]:
    """Where the port's queue ``10:`` hangs and its byte limit (None: not a bfifo), from
    ``tc -j qdisc show dev X``. A port with traffic classes (controllers/classes.py) has it
    under its lossless class, with that class's limit, not under ``1:1``: RED takes the
    leaf's place, and the bfifo comes back, where and as it was."""
    for q in qdiscs:
        if q.get("handle") == QUEUE_HANDLE and q.get("parent"):
            limit = (q.get("options") or {}).get("limit") if q.get("kind") == "bfifo" else None
            return str(q["parent"]), int(limit) if isinstance(limit, int) else None
    raise MarkerError(f"{intf}: no queue {QUEUE_HANDLE} (not a lab port?)")


def red_commands(port: PortQueue, marking: Marking | None, current: Marking | None,
                 parent: str = LEAF_PARENT) -> list[list[str]]:
    """tc commands taking the leaf under ``parent`` from ``current`` (None: bfifo) to
    ``marking``.

    The kernel refuses to replace a qdisc by one of another kind under the same handle,
    so bfifo <-> red is delete + add; red -> red is ``change``, which keeps RED's counters.
    """
    leaf = _leaf(port.intf, parent)
    if marking is None:
        if current is None:
            return []
        return [["tc", "qdisc", "del", *leaf],
                ["tc", "qdisc", "add", *leaf, "bfifo", "limit", str(port.limit_bytes)]]
    if current is None:
        return [["tc", "qdisc", "del", *leaf],
                ["tc", "qdisc", "add", *leaf, *red_args(port, marking)]]
    return [["tc", "qdisc", "change", *leaf, *red_args(port, marking)]]


def parse_red_counters(qdiscs: list[dict[str, Any]], intf: str) -> dict[str, int]:
    """Counters of the red leaf from ``tc -s -j qdisc show dev X``. RED knows no ECT
    count or queue maximum; ``early_drops`` are not-ECT packets it dropped early (where
    the tc-bpf marker would have let them into the bfifo)."""
    for q in qdiscs:
        if q.get("kind") == "red" and q.get("handle") == QUEUE_HANDLE:
            xstats = q.get("xstats", q)  # iproute2 prints them inline; accept a sub-object
            return {"packets": int(q.get("packets", 0)),
                    "ce_marked": int(xstats.get("marked", 0)),
                    "early_drops": int(xstats.get("early", 0))}
    raise MarkerError(f"{intf}: no red qdisc 10: (marking was changed behind our back?)")


class RedMarker(Marker):
    """Marking by the kernel's RED qdisc as the port's leaf queue (see the module doc).
    Turning marking off and on again starts RED's counters from zero."""

    mechanism = "red"

    def __init__(self, netns_pid: int | None = None) -> None:
        super().__init__(netns_pid)
        self._ports: dict[str, tuple[PortQueue, Marking]] = {}
        #: Where each port's queue hangs, read when the marker first takes the port.
        self._parents: dict[str, str] = {}

    def _set(self, port: PortQueue, marking: Marking | None) -> None:
        current = self._ports.get(port.intf)
        if current is None and marking is not None:
            # The leaf as the port has it: its parent, and its own limit for RED and for
            # the bfifo put back (a lossless class's queue is not the port's size).
            self._run.require(port.intf)
            parent, limit = leaf_of(self._run.json(
                port.intf, ["tc", "-j", "qdisc", "show", "dev", port.intf]), port.intf)
            self._parents[port.intf] = parent
            if limit is not None:
                port = dataclasses.replace(port, limit_bytes=limit)
        elif current is not None:
            port = dataclasses.replace(port, limit_bytes=current[0].limit_bytes)
        if current == (port, marking) or (current is None and marking is None):
            return
        parent = self._parents.get(port.intf, LEAF_PARENT)
        cmds = red_commands(port, marking, current[1] if current else None, parent)
        self._run.require(port.intf)
        try:
            for cmd in cmds:
                self._run.run(port.intf, cmd)
        except MarkerError:
            self._recover(port, parent)
            raise
        if marking is None:
            del self._ports[port.intf]
        else:
            self._ports[port.intf] = (port, marking)

    def _recover(self, port: PortQueue, parent: str) -> None:
        """After a failed delete + add: never leave the port without its bfifo leaf."""
        qdiscs = self._run.json(port.intf, ["tc", "-j", "qdisc", "show", "dev", port.intf])
        kind = next((q.get("kind") for q in qdiscs if q.get("handle") == QUEUE_HANDLE), None)
        if kind is None:
            self._run.run(port.intf, ["tc", "qdisc", "add", *_leaf(port.intf, parent),
                                      "bfifo", "limit", str(port.limit_bytes)], check=False)
        if kind != "red":
            self._ports.pop(port.intf, None)

    def _counters(self) -> dict[str, dict[str, int]]:
        return {intf: parse_red_counters(
                    self._run.json(intf, ["tc", "-s", "-j", "qdisc", "show", "dev", intf]),
                    intf)
                for intf in self._ports}

    def _release(self, intf: str, entry: tuple[PortQueue, Marking]) -> None:
        if self._run.exists(intf):
            self._set(entry[0], None)


def make_marker(mechanism: str, build_dir: Path, netns_pid: int | None = None) -> Marker:
    """The marker for ``mechanism`` (one of MECHANISMS). ``netns_pid``: run every tc and
    bpftool command in that process's network namespace (tests); None: the lab's."""
    if mechanism == "tc-bpf":
        return TcBpfMarker(build_dir, netns_pid)
    if mechanism == "red":
        return RedMarker(netns_pid)
    raise ValueError(f"mechanism: unknown ECN mechanism {mechanism!r} "
                     f"(known: {', '.join(MECHANISMS)})")
