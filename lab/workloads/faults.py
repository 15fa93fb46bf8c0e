"""Faults injected while traffic runs: links down, a switch dark, a link flapping, the
controller killed - and what each cost every flow.

A scenario lists them under ``faults`` (times in seconds from the start of traffic)::

    faults:
      - {at: 1.5, link: leaf2-spine1}            # a cable pulled; stays down
      - {at: 3.5, switch: spine2, for: 1.5}      # a spine loses power for 1.5 s
      - {at: 6, link: leaf1-spine3, flap: 3, every: 0.3}   # down/up 3 times, 0.3 s apart
      - {at: 2, controller: kill, for: 2}        # kill -9, started again 2 s later

How each is made, and why that is honest:

- A link goes down the way a cut fibre does: both of its veth ends are set down, so both
  switches lose carrier and report it (OpenFlow port status). Nothing tells the controller
  but the switches.
- A switch goes dark as every one of its links going down at once (the switch process is
  shared by all bridges in the userspace datapath; stopping it would stop every switch).
- The controller is killed with SIGKILL by its PID, then started again on the same port;
  the switches run fail-secure meanwhile, forwarding by what they hold.

What it cost is read from the receivers: every flow's server reports bytes received per
0.1 s, and a flow is *out* in an interval where it received under a tenth of its offered
rate. A flow that receives nothing in the last second of traffic, after every fault has
ended, is black-holed.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.machine import remote
from lab.model.errors import ScenarioError

INTERVAL_S = 0.1            # receivers' reporting interval in a run with faults
OUT_FRACTION = 0.1          # below this share of its offered rate, a flow counts as out
TAIL_S = 1.0                # the last stretch of traffic a recovered flow must use
KINDS = ("link", "switch", "controller")
KEYS = {"at", "for", "flap", "every", *KINDS}


@dataclass(frozen=True)
class Fault:
    """One fault as the scenario states it, checked against the topology."""

    index: int
    kind: str                       # link | switch | controller
    target: str                     # "leaf1-spine1", "spine2", "kill"
    at: float
    down_for: float | None = None   # None: down until the run ends (links, switches)
    flap: int = 0
    every: float = 0.0
    intfs: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        what = {"link": f"link {self.target}", "switch": f"switch {self.target}",
                "controller": "controller"}[self.kind]
        if self.flap:
            return f"{what} flaps {self.flap}x every {self.every:g} s"
        if self.kind == "controller":
            return f"controller killed for {self.down_for:g} s"
        return f"{what} down" + (f" for {self.down_for:g} s" if self.down_for else "")

    def actions(self) -> list[tuple[float, str]]:
        """(time from traffic start, "down" | "up") for links and switches; "kill" |
        "restart" for the controller."""
        if self.kind == "controller":
            assert self.down_for is not None
            return [(self.at, "kill"), (self.at + self.down_for, "restart")]
        if self.flap:
            return [(self.at + i * self.every, "down" if i % 2 == 0 else "up")
                    for i in range(2 * self.flap)]
        acts = [(self.at, "down")]
        if self.down_for:
            acts.append((self.at + self.down_for, "up"))
        return acts


def _number(item: dict[str, Any], key: str, where: str, lo: float, hi: float) -> float:
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not lo <= value <= hi:
        raise ScenarioError(f"{where}.{key}", f"expected a number of seconds in {lo:g}..{hi:g}, "
                            f"got {value!r}")
    return float(value)


def link_intfs(topo_desc: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """{"a-b": interfaces of every switch-to-switch link between a and b}, both spellings."""
    switches = {s["name"] for s in topo_desc["switches"]}
    out: dict[str, tuple[str, ...]] = {}
    for ln in topo_desc["links"]:
        if ln["a"] in switches and ln["b"] in switches:
            ends = (f"{ln['a']}-eth{ln['a_port']}", f"{ln['b']}-eth{ln['b_port']}")
            for name in (f"{ln['a']}-{ln['b']}", f"{ln['b']}-{ln['a']}"):
                out[name] = out.get(name, ()) + ends
    return out


def switch_intfs(topo_desc: dict[str, Any], switch: str) -> tuple[str, ...]:
    """Every switch-side interface of ``switch``'s links: its own ends, and the far end of
    each link to another switch (a host's end lives in the host's namespace)."""
    switches = {s["name"] for s in topo_desc["switches"]}
    out = []
    for ln in topo_desc["links"]:
        if switch in (ln["a"], ln["b"]):
            out += [f"{n}-eth{p}" for n, p in ((ln["a"], ln["a_port"]), (ln["b"], ln["b_port"]))
                    if n in switches]
    return tuple(out)


def parse(raw: Any, topo_desc: dict[str, Any], duration: float) -> list[Fault]:
    """The scenario's ``faults``, every field checked; ScenarioError names the bad one."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ScenarioError("faults", f"expected a list of faults, got {raw!r}")
    links = link_intfs(topo_desc)
    switches = sorted(s["name"] for s in topo_desc["switches"])
    faults = []
    for i, item in enumerate(raw):
        where = f"faults[{i}]"
        if not isinstance(item, dict):
            raise ScenarioError(where, f"expected a mapping like {{at: 2, link: leaf1-spine1}}"
                                f", got {item!r}")
        unknown = sorted(str(k) for k in item if k not in KEYS)
        if unknown:
            raise ScenarioError(f"{where}.{unknown[0]}", f"unknown key (known: "
                                f"{', '.join(sorted(KEYS))})")
        kinds = [k for k in KINDS if k in item]
        if len(kinds) != 1:
            raise ScenarioError(where, "needs exactly one of link, switch, controller")
        kind = kinds[0]
        target = item[kind]
        if "at" not in item:
            raise ScenarioError(f"{where}.at", "missing: seconds from the start of traffic")
        at = _number(item, "at", where, 0, duration)
        down_for = _number(item, "for", where, 0.05, 600) if "for" in item else None
        flap, every = 0, 0.0
        if "flap" in item or "every" in item:
            if kind == "controller":
                raise ScenarioError(f"{where}.flap", "a controller does not flap")
            if down_for is not None:
                raise ScenarioError(f"{where}.for", "a flap has no 'for' (give flap and every)")
            f = item.get("flap")
            if isinstance(f, bool) or not isinstance(f, int) or not 1 <= f <= 100:
                raise ScenarioError(f"{where}.flap", f"expected 1..100 down/up cycles, got {f!r}")
            if "every" not in item:
                raise ScenarioError(f"{where}.every", "missing: seconds between changes")
            flap, every = f, _number(item, "every", where, 0.05, 60)
        if kind == "link":
            if target not in links:
                raise ScenarioError(f"{where}.link", f"no switch link {target!r} (links: "
                                    f"{', '.join(sorted(links)[:12])}...)")
            intfs = links[target]
        elif kind == "switch":
            if target not in switches:
                raise ScenarioError(f"{where}.switch", f"no switch {target!r} (switches: "
                                    f"{', '.join(switches)})")
            intfs = switch_intfs(topo_desc, target)
        else:
            if target != "kill":
                raise ScenarioError(f"{where}.controller", f"the one controller fault is "
                                    f"'kill', got {target!r}")
            if down_for is None:
                raise ScenarioError(f"{where}.for", "missing: the lab starts the controller "
                                    "again after this many seconds (a run must end with one)")
            intfs = ()
        fault = Fault(i, kind, str(target), at, down_for, flap, every, intfs)
        last = fault.actions()[-1][0]
        if last >= duration:
            raise ScenarioError(f"{where}.{'every' if flap else 'for' if down_for else 'at'}",
                                f"the fault's last change is at {last:g} s, not within the "
                                f"{duration:g} s of traffic")
        faults.append(fault)
    return faults


def set_links(intfs: tuple[str, ...], up: bool) -> None:
    """Both ends of the links, in one ``ip`` call per machine (on one machine the ends
    change within microseconds; a cluster's cut link, within a round trip to the worker)."""
    for mine in remote.by_agent(intfs, remote.node_of).values():
        batch = "".join(f"link set {i} {'up' if up else 'down'}\n" for i in mine)
        out = remote.run_at(remote.node_of(mine[0]), ["ip", "-batch", "-"], input_text=batch)
        if out.returncode != 0:
            raise subprocess.CalledProcessError(out.returncode, out.args, out.stdout,
                                                out.stderr)


def flow_tables(bridges: list[str]) -> dict[str, list[str]]:
    """Every bridge's flow entries as the switch holds them, counters stripped.

    Two dumps compare equal when the switches hold the same entries, whatever happened to
    the controller in between.
    """
    out = {}
    for br in bridges:
        text = remote.run_at(br, ["ovs-ofctl", "-O", "OpenFlow13", "--no-stats",
                                  "dump-flows", br]).stdout
        out[br] = sorted(line.strip() for line in text.splitlines()
                         if line.strip() and "reply" not in line)
    return out


def watch_bytes(bridges: list[str]) -> dict[str, dict[int, int]]:
    from lab.measure import telemetry
    return {br: {c: v[1] for c, v in got.items()}
            for br, got in telemetry.flow_counters(bridges).items()}


@dataclass(eq=False)                  # threads are dict keys inside threading
class Injector(threading.Thread):
    """Carries out the faults' actions at their times from ``t0`` (a monotonic time)."""

    faults: list[Fault]
    controller: Any
    bridges: list[str]
    t0: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    controller_checks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    histories: list[dict[str, Any]] = field(default_factory=list)   # killed controllers'

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, daemon=True, name="fabriclab-faults")
        self._stop_evt = threading.Event()
        self.stopped_unix = float("inf")

    def run(self) -> None:
        timeline = sorted((t, a, f) for f in self.faults for t, a in f.actions())
        for t, action, fault in timeline:
            if self._stop_evt.wait(max(0.0, self.t0 + t - time.monotonic())):
                return
            try:
                self._do(fault, action)
            except Exception as exc:      # a fault that could not be made: said, not hidden
                self.errors.append(f"faults[{fault.index}] {action}: {exc}")

    def _do(self, fault: Fault, action: str) -> None:
        event = {"fault": fault.index, "action": action, "target": fault.target,
                 "t_s": round(time.monotonic() - self.t0, 4), "unix": time.time()}
        if action in ("down", "up"):
            set_links(fault.intfs, up=action == "up")
        elif action == "kill":
            # What this controller saw and did dies with it: keep it for the reactions.
            self.histories.append(self.controller.request({"cmd": "status"}))
            self._before = (flow_tables(self.bridges), watch_bytes(self.bridges))
            event["unix"] = time.time()
            self.controller.kill()
        elif action == "restart":
            self.controller.restart()
            event["ready_s"] = round(self._wait_ready(), 4)
            self.controller_checks.append(self._compare(fault))
        self.events.append(event)

    def _wait_ready(self, timeout_s: float = 20.0) -> float:
        t = time.monotonic()
        self.controller.wait_ready(timeout=timeout_s)
        return time.monotonic() - t

    def _compare(self, fault: Fault) -> dict[str, Any]:
        """The switches' entries before the kill and after the resync, and their counters."""
        before, bytes_before = self._before
        after, bytes_after = flow_tables(self.bridges), watch_bytes(self.bridges)
        lost = sum(len(set(before[b]) - set(after[b])) for b in self.bridges)
        new = sum(len(set(after[b]) - set(before[b])) for b in self.bridges)
        dup = sum(len(after[b]) - len(set(after[b])) for b in self.bridges)
        reset = sum(1 for b in self.bridges for c, v in bytes_before[b].items()
                    if bytes_after[b].get(c, -1) < v)
        return {"fault": fault.index, "entries_before": sum(len(v) for v in before.values()),
                "entries_after": sum(len(v) for v in after.values()), "lost": lost,
                "new": new, "duplicated": dup, "watch_counters": sum(
                    len(v) for v in bytes_before.values()), "counters_reset": reset}

    def stop(self) -> None:
        self.stopped_unix = time.time()
        self._stop_evt.set()
        if self.is_alive():
            self.join(timeout=30)


def restore(faults: list[Fault]) -> None:
    """Every faulted link up again (teardown deletes them anyway; this keeps counters
    readable for the end-of-run snapshot)."""
    intfs = tuple(dict.fromkeys(i for f in faults for i in f.intfs))
    if intfs:
        subprocess.run(["ip", "-batch", "-"], check=False, capture_output=True, text=True,
                       input="".join(f"link set {i} up\n" for i in intfs))


def receiver_intervals(server_json: Path) -> list[tuple[float, float, int]]:
    """(start, end, bytes) per reporting interval of an iperf3 server's JSON."""
    try:
        data = json.loads(server_json.read_text())
    except (OSError, ValueError):
        return []
    out = []
    for iv in data.get("intervals", []):
        s = iv.get("sum", {})
        if "start" in s and "end" in s:
            out.append((float(s["start"]), float(s["end"]), int(s.get("bytes", 0))))
    return out


def flow_outage(intervals: list[tuple[float, float, int]], offered_bps: float,
                t_from: float, t_end: float) -> dict[str, float | bool]:
    """Time a flow was out (under a tenth of its rate) from ``t_from`` on, its longest
    outage, and whether it received anything in the last ``TAIL_S`` of traffic."""
    out_s = longest = run = 0.0
    tail_bytes = 0
    for start, end, nbytes in intervals:
        dt = end - start
        if start >= t_end - TAIL_S - 1e-6:
            tail_bytes += nbytes
        if end <= t_from or dt <= 0 or end > t_end + INTERVAL_S:
            continue
        if nbytes * 8 / dt < OUT_FRACTION * offered_bps:
            out_s += dt
            run += dt
            longest = max(longest, run)
        else:
            run = 0.0
    return {"out_s": round(out_s, 3), "longest_out_s": round(longest, 3),
            "black_holed": tail_bytes == 0}


def reactions(events: list[dict[str, Any]], status: dict[str, Any],
              until: float = float("inf")) -> list[dict[str, Any]]:
    """For each link change the lab made, when the controller saw it and when every switch
    had confirmed the reroute (seconds after the change). ``until`` (unix time) is when
    the faults stopped: the links the lab restores after that are not reactions."""
    out = []
    reroutes = [r for r in status.get("reroutes", []) if r["t_event"] < until]
    seen = [e for e in status.get("link_events", []) if e["t"] < until]
    for ev in events:
        if ev["action"] not in ("down", "up"):
            continue
        t = ev["unix"]
        saw = [e["t"] for e in seen if e["t"] >= t - 0.001]
        done = [r["t_done"] for r in reroutes if r["t_event"] >= t - 0.001 and r.get("t_done")]
        out.append({"fault": ev["fault"], "action": ev["action"], "t_s": ev["t_s"],
                    "controller_saw_s": round(min(saw) - t, 4) if saw else None,
                    "rerouted_s": round(min(done) - t, 4) if done else None})
    return out


def report(faults: list[Fault], injector: Injector, status: dict[str, Any],
           flows: list[Any], iperf_dir: Path, duration: float) -> dict[str, Any]:
    """The run's ``faults`` section: what was done, when the controller reacted, what each
    flow lost, and the controller's resync after a kill."""
    t_from = min(f.at for f in faults)
    received = {f.id: receiver_intervals(iperf_dir / f"{f.id}.server.json") for f in flows}
    per_flow = {f.id: flow_outage(received[f.id], f.rate_bps, t_from, duration)
                for f in flows}
    for check in injector.controller_checks:
        f = faults[check["fault"]]               # parse numbers faults by list position
        assert f.down_for is not None
        check.update(_goodput_around(list(received.values()), f.at, f.at + f.down_for))
    seen = {k: [x for st in [*injector.histories, status] for x in st.get(k, [])]
            for k in ("reroutes", "link_events")}
    react = reactions(injector.events, seen, injector.stopped_unix)
    rerouted = [r["rerouted_s"] for r in react if r["rerouted_s"] is not None]
    outs = [p["out_s"] for p in per_flow.values()]
    return {
        "injected": [{"index": f.index, "what": f.label, "at_s": f.at} for f in faults],
        "events": injector.events,
        "reactions": react,
        "controller_restarts": injector.controller_checks,
        "errors": injector.errors,
        "per_flow": per_flow,
        "summary": {
            "faults": len(faults),
            "link_changes": sum(1 for e in injector.events if e["action"] in ("down", "up")),
            "reroute_max_s": max(rerouted, default=None),
            "unanswered_link_changes": sum(1 for r in react if r["rerouted_s"] is None),
            "outage_max_s": max(outs, default=0.0),
            "outage_mean_s": round(sum(outs) / len(outs), 3) if outs else 0.0,
            "flows_black_holed": sorted(k for k, v in per_flow.items() if v["black_holed"]),
        },
    }


def _goodput_around(received: list[list[tuple[float, float, int]]], t_down: float,
                    t_up: float) -> dict[str, float]:
    """All flows' received rate while the controller was away, and as long before it:
    fail-secure switches should keep the first close to the second."""
    span = t_up - t_down
    before = during = 0
    for intervals in received:
        for start, end, nbytes in intervals:
            mid = (start + end) / 2
            if t_down - span <= mid < t_down:
                before += nbytes
            elif t_down <= mid < t_up:
                during += nbytes
    return {"goodput_before_bps": round(before * 8 / span), "goodput_while_down_bps":
            round(during * 8 / span)}
