"""Priority flow control on the lab's htb ports: pfcd's config, the headroom a lossless
queue needs, and the one place that starts, stops and, after a crash, undoes pfcd.

pfcd (``controllers/pfc/``, C) polls the lossless leaves' backlog and changes the feeding
ports' lossless htb classes to a pause rate at XOFF and back at XON (its README says how
and what it measures). Its config is a line format; here it is dataclasses that check
every field before pfcd sees it (each error names the field, as the controller's other
requests do), and the JSON form the lab sends the controller (``PfcConfig.from_dict``).

Why a ``restore`` here: a pause never expires by itself (an htb class keeps the rate it
was given), and pfcd resumes its classes only in its SIGTERM handler. If it dies without
it (SIGKILL, a crash), whoever started it sets every feeder class back, from the config.

Pure stdlib: imported by the controller (os-ken and Ryu 4.34) and by the lab.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controllers import cbuild
from controllers.classes import LOSSLESS_CLASS, LOSSLESS_LEAF, LOSSLESS_PRIORITY
from controllers.marking import WIRE_FRAME_BYTES, htb_class_args

SOURCE = Path(__file__).resolve().parent / "pfc" / "pfcd.c"
#: The line pfcd prints on stdout once every socket is open and every class and leaf found.
READY = "pfcd: ready"
#: pfcd's fixed limits (pfcd.h): the config is refused here rather than by pfcd.
MAX_NS, MAX_DEVS, MAX_WATCHED, MAX_FEEDERS, MAX_FEEDS_PER, NPRIO = 32, 128, 64, 64, 16, 8
#: A namespace as pfcd takes it: shorter than its path buffer less "/run/netns/".
NS_NAME_MAX = 240
IF_NAMESIZE = 16
#: The highest rate a config may name (1 Tbit/s, as the controller's config allows).
MAX_RATE_BPS = 10**12
_CLASS = re.compile(r"[0-9a-fA-F]{1,4}:[0-9a-fA-F]{1,4}")
_LEAF = re.compile(r"[0-9a-fA-F]{1,4}:")
_TC_TIMEOUT_S = 10


class PfcError(RuntimeError):
    """pfcd would not start or stop, or a class could not be set back: one line, with the
    end of what pfcd wrote on stderr."""


# --- the config ----------------------------------------------------------------------------

def _whole(name: str, value: object, lo: int, hi: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer, not {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name}: {value} is not in {lo}..{hi}{why}")


def _plain(name: str, value: object, longest: int, what: str) -> None:
    """pfcd writes names into its JSON report unescaped and reads its config by words, with
    ``#`` starting a comment: only printable characters without those are names."""
    if not isinstance(value, str) or not 0 < len(value) <= longest or any(
            c <= " " or c > "~" or c in '"\\#' for c in value):
        raise ValueError(f"{name}: not {what}: {value!r}")


def _ns(name: str, value: object) -> None:
    _plain(name, value, NS_NAME_MAX - 1, 'a namespace ("-", a path or a name under '
                                         "/run/netns)")


def ns_path(ns: str) -> str:
    """The namespace's file as pfcd opens it ("" for its own): one namespace has one key."""
    return "" if ns == "-" else ns if ns.startswith("/") else f"/run/netns/{ns}"


def _handle(name: str, value: object, leaf: bool) -> None:
    if not isinstance(value, str) or not (_LEAF if leaf else _CLASS).fullmatch(value):
        what = "qdisc handle like 10:" if leaf else "class like 1:10"
        raise ValueError(f"{name}: not a tc {what}: {value!r}")


@dataclass(frozen=True)
class Feeder:
    """An upstream port's class that a watched queue pauses: set to the pause rate at XOFF,
    back to ``rate_bps``/``ceil_bps`` at XON. ``pause_bps`` None: the config's. A record:
    its fields are checked, with their path, when a ``PfcConfig`` is made of it."""

    ns: str
    dev: str
    rate_bps: int
    ceil_bps: int
    klass: str = LOSSLESS_CLASS
    pause_bps: int | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """One class is one feeder, however its namespace is written."""
        return ns_path(self.ns), self.dev, self.klass.lower()


@dataclass(frozen=True)
class WatchedPort:
    """A switch port's lossless queue (``klass``'s leaf ``leaf``) and the feeders it pauses
    at ``xoff_bytes`` of backlog and resumes at ``xon_bytes``; ``prio`` is the 802.1p
    priority its counters are kept under. A record, as ``Feeder``: ``check_port`` weighs
    it against its queue, ``PfcConfig`` checks every field."""

    ns: str
    dev: str
    xoff_bytes: int
    xon_bytes: int
    feeders: tuple[Feeder, ...]
    prio: int = LOSSLESS_PRIORITY
    klass: str = LOSSLESS_CLASS
    leaf: str = LOSSLESS_LEAF

    def __post_init__(self) -> None:
        object.__setattr__(self, "feeders", tuple(self.feeders))

    @property
    def key(self) -> tuple[str, str, str]:
        return ns_path(self.ns), self.dev, self.klass.lower()


def _thresholds(xoff: object, xon: object) -> None:
    _whole("xoff_bytes", xoff, 1, 2**32 - 1)
    _whole("xon_bytes", xon, 0, xoff - 1, " (below xoff_bytes)")  # type: ignore[operator]


def _under(where: str, check: Any, *args: Any) -> None:
    """``check(*args)``, its error's field put under ``where``."""
    try:
        check(*args)
    except ValueError as exc:
        raise ValueError(f"{where}.{exc}") from None


def _check_feeder_fields(f: Any) -> None:
    if not isinstance(f, Feeder):
        raise ValueError(f"not a Feeder: {f!r}")
    _ns("ns", f.ns)
    _plain("dev", f.dev, IF_NAMESIZE - 1, "an interface name")
    # htb refuses a rate of 0 bytes/s, so 8 bit/s is the least it takes
    _whole("rate_bps", f.rate_bps, 8, MAX_RATE_BPS)
    _whole("ceil_bps", f.ceil_bps, f.rate_bps, MAX_RATE_BPS, " (at least rate_bps)")
    _handle("class", f.klass, leaf=False)
    if f.pause_bps is not None:
        _whole("pause_bps", f.pause_bps, 8, f.rate_bps - 1, " (below rate_bps)")


def _check_port_fields(p: WatchedPort) -> None:
    _ns("ns", p.ns)
    _plain("dev", p.dev, IF_NAMESIZE - 1, "an interface name")
    _thresholds(p.xoff_bytes, p.xon_bytes)
    _whole("prio", p.prio, 0, NPRIO - 1)
    _handle("class", p.klass, leaf=False)
    _handle("leaf", p.leaf, leaf=True)
    if not p.feeders:
        raise ValueError("feeders: a watched port pauses at least one feeder")
    if len(p.feeders) > MAX_FEEDS_PER:
        raise ValueError(f"feeders: more than {MAX_FEEDS_PER}")
    seen: dict[tuple[str, str, str], int] = {}
    for j, f in enumerate(p.feeders):
        _under(f"feeders[{j}]", _check_feeder_fields, f)
        if f.key in seen:
            raise ValueError(f"feeders[{j}]: {f.dev} {f.klass} is listed twice "
                             f"(feeders[{seen[f.key]}])")
        seen[f.key] = j


@dataclass(frozen=True)
class PfcConfig:
    """What pfcd watches and pauses; ``pause_bps`` is every feeder's pause rate unless the
    feeder names its own. ``poll_us``: how often the leaves are read; ``refresh_us``: how
    often a switch would re-send PAUSE (only counted)."""

    ports: tuple[WatchedPort, ...]
    pause_bps: int
    poll_us: int = 1000
    refresh_us: int = 3000

    def __post_init__(self) -> None:
        object.__setattr__(self, "ports", tuple(self.ports))
        _whole("pause_bps", self.pause_bps, 8, MAX_RATE_BPS)
        _whole("poll_us", self.poll_us, 100, 1_000_000)
        _whole("refresh_us", self.refresh_us, 100, 10_000_000)
        if not self.ports:
            raise ValueError("ports: the config watches no port")
        if len(self.ports) > MAX_WATCHED:
            raise ValueError(f"ports: more than {MAX_WATCHED} watched ports")
        for i, p in enumerate(self.ports):
            if not isinstance(p, WatchedPort):
                raise ValueError(f"ports[{i}]: not a WatchedPort: {p!r}")
            _under(f"ports[{i}]", _check_port_fields, p)
        self._check_across_ports()

    def _check_across_ports(self) -> None:
        """What pfcd refuses between lines: a queue watched twice, two queues of a port at
        one priority, a class restored to two rates or paused for two priorities, a pause
        rate not below a feeder's rate, and its table sizes."""
        queues: dict[tuple[str, str, str], int] = {}
        prios: dict[tuple[str, str, int], int] = {}
        classes: dict[tuple[str, str, str], tuple[str, Feeder, int]] = {}
        devs = set()
        for i, p in enumerate(self.ports):
            if p.key in queues:
                raise ValueError(f"ports[{i}].class: {p.dev} {p.klass} is already watched "
                                 f"(ports[{queues[p.key]}])")
            queues[p.key] = i
            if prios.setdefault((p.key[0], p.dev, p.prio), i) != i:
                raise ValueError(f"ports[{i}].prio: another queue of {p.dev} is watched at "
                                 f"priority {p.prio}")
            devs.add(p.key[:2])
            for j, f in enumerate(p.feeders):
                where = f"ports[{i}].feeders[{j}]"
                pause = self.pause_bps if f.pause_bps is None else f.pause_bps
                if pause >= f.rate_bps:
                    raise ValueError(f"{where}.rate_bps: {f.rate_bps} is not above the pause "
                                     f"rate {pause} (a pause must slow the class)")
                first = classes.setdefault(f.key, (where, f, p.prio))
                if first[2] != p.prio:
                    raise ValueError(f"{where}.class: already paused for priority {first[2]} "
                                     f"({first[0]})")
                if (first[1].rate_bps, first[1].ceil_bps, first[1].pause_bps) != \
                        (f.rate_bps, f.ceil_bps, f.pause_bps):
                    raise ValueError(f"{where}.rate_bps: differs from {first[0]} (one class "
                                     "has one rate to pause from and return to)")
                devs.add(f.key[:2])
        if len(classes) > MAX_FEEDERS:
            raise ValueError(f"ports: more than {MAX_FEEDERS} feeder classes")
        if len(devs) > MAX_DEVS:
            raise ValueError(f"ports: more than {MAX_DEVS} devices")
        if len({ns for ns, _ in devs}) > MAX_NS:
            raise ValueError(f"ports: more than {MAX_NS} namespaces")

    def feeders(self) -> dict[tuple[str, str, str], Feeder]:
        """Every feeder class once (a class may feed several watched ports)."""
        out: dict[tuple[str, str, str], Feeder] = {}
        for p in self.ports:
            for f in p.feeders:
                out.setdefault(f.key, f)
        return out

    def text(self) -> str:
        """pfcd's config file (controllers/pfc/README.md, "Config")."""
        lines = ["# pfcd config, written by controllers.pfc", f"poll_us {self.poll_us}",
                 f"refresh_us {self.refresh_us}", f"pause_bps {self.pause_bps}"]
        for p in self.ports:
            lines.append(f"port {p.ns} {p.dev} prio={p.prio} class={p.klass} leaf={p.leaf} "
                         f"xoff={p.xoff_bytes} xon={p.xon_bytes}")
            for f in p.feeders:
                pause = "" if f.pause_bps is None else f" pause={f.pause_bps}"
                lines.append(f"feeder {f.ns} {f.dev} class={f.klass} rate={f.rate_bps} "
                             f"ceil={f.ceil_bps}{pause}")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (what the lab sends the controller); ``from_dict`` reads it back."""
        def feeder(f: Feeder) -> dict[str, Any]:
            d = {"ns": f.ns, "dev": f.dev, "rate_bps": f.rate_bps, "ceil_bps": f.ceil_bps,
                 "class": f.klass}
            return d if f.pause_bps is None else {**d, "pause_bps": f.pause_bps}
        return {"poll_us": self.poll_us, "refresh_us": self.refresh_us,
                "pause_bps": self.pause_bps,
                "ports": [{"ns": p.ns, "dev": p.dev, "xoff_bytes": p.xoff_bytes,
                           "xon_bytes": p.xon_bytes, "prio": p.prio, "class": p.klass,
                           "leaf": p.leaf, "feeders": [feeder(f) for f in p.feeders]}
                          for p in self.ports]}

    @classmethod
    def from_dict(cls, d: Any, where: str = "pfc") -> PfcConfig:
        """The config from its JSON form; a ValueError names the bad field's path
        (``pfc.ports[2].xoff_bytes: ...``)."""
        raw = _fields(d, where, ("pause_bps", "ports"), ("poll_us", "refresh_us"))
        ports = _list(raw["ports"], f"{where}.ports")
        made = tuple(_port(p, f"{where}.ports[{i}]") for i, p in enumerate(ports))
        try:
            return cls(ports=made, pause_bps=raw["pause_bps"],
                       **{k: raw[k] for k in ("poll_us", "refresh_us") if k in raw})
        except ValueError as exc:
            raise ValueError(f"{where}.{exc}") from None


def _fields(d: Any, where: str, required: tuple[str, ...],
            optional: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected an object, not {d!r}")
    for key in d:
        if key not in required + optional:
            raise ValueError(f"{where}.{key}: unknown field (known: "
                             f"{', '.join(required + optional)})")
    for key in required:
        if key not in d:
            raise ValueError(f"{where}.{key}: missing")
    return {("klass" if k == "class" else k): v for k, v in d.items()}


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: expected a non-empty list")
    return value


def _port(d: Any, where: str) -> WatchedPort:
    """A port record from JSON: its keys checked here, its values by ``PfcConfig``."""
    raw = _fields(d, where, ("ns", "dev", "xoff_bytes", "xon_bytes", "feeders"),
                  ("prio", "class", "leaf"))
    feeders = _list(raw.pop("feeders"), f"{where}.feeders")
    return WatchedPort(feeders=tuple(
        Feeder(**_fields(f, f"{where}.feeders[{j}]", ("ns", "dev", "rate_bps", "ceil_bps"),
                         ("class", "pause_bps")))
        for j, f in enumerate(feeders)), **raw)


# --- headroom ------------------------------------------------------------------------------

def headroom_bytes(rate_bps: float, delay_s: float, reaction_s: float,
                   frame_bytes: int = WIRE_FRAME_BYTES) -> int:
    """The buffer a lossless queue needs above XOFF for one feeder (README, "Headroom"):
    ``rate x (2 x delay + reaction) / 8 + 2 frames``: what is on the cable both ways, what
    the sender emits until it has reacted, a frame being sent when PAUSE arrives and one
    when it is generated. Wire bytes, rounded up."""
    for name, value in (("rate_bps", rate_bps), ("delay_s", delay_s),
                        ("reaction_s", reaction_s), ("frame_bytes", frame_bytes)):
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not 0 <= value < math.inf:
            raise ValueError(f"{name}: must be a number >= 0, not {value!r}")
    # rounded first so that float noise (6250.000000000001) does not add a byte
    return math.ceil(round(rate_bps * (2 * delay_s + reaction_s) / 8, 6)) + 2 * frame_bytes


def needed_headroom_bytes(port: WatchedPort, reaction_s: float, delay_s: float = 0) -> int:
    """A watched queue's headroom: pfcd triggers on the egress queue and pauses all its
    feeders at once, so it is the sum over its feeders at their ceil rates, and a frame
    each for the leak (the frame a class still sends when the pause lands)."""
    return sum(headroom_bytes(f.ceil_bps, delay_s, reaction_s) + WIRE_FRAME_BYTES
               for f in port.feeders)


def check_port(port: WatchedPort, leaf_limit_bytes: int, reaction_s: float,
               delay_s: float = 0, where: str = "port") -> None:
    """Refuse a watched port its queue cannot make lossless: XON not below XOFF, XOFF at
    or above the leaf's byte limit (the queue drops before it pauses), or less room between
    them than the headroom its feeders need at their ceil rates (``needed_headroom_bytes``).
    A ValueError names the field (under ``where``) and says the numbers."""
    _under(where, _thresholds, port.xoff_bytes, port.xon_bytes)
    _whole(f"{where}.leaf_limit_bytes", leaf_limit_bytes, 1, 2**32 - 1)
    if port.xoff_bytes >= leaf_limit_bytes:
        raise ValueError(f"{where}.xoff_bytes: {port.xoff_bytes} is at or above the queue's "
                         f"size ({leaf_limit_bytes} B): it would drop before it pauses")
    room = leaf_limit_bytes - port.xoff_bytes
    need = needed_headroom_bytes(port, reaction_s, delay_s)
    if room < need:
        ceil = sum(f.ceil_bps for f in port.feeders)
        raise ValueError(
            f"{where}.xoff_bytes: headroom {room} B (queue size {leaf_limit_bytes} - XOFF "
            f"{port.xoff_bytes}) is below the {need} B that {len(port.feeders)} feeder(s) at "
            f"{ceil / 1e6:g} Mbit/s in all need with {delay_s * 1e3:g} ms link delay and "
            f"{reaction_s * 1e3:g} ms reaction (rate x (2 x delay + reaction) / 8 + 2 frames "
            "each, and a frame each for the leak)")


# --- running pfcd --------------------------------------------------------------------------

def _in_ns(ns: str) -> list[str]:
    path = ns_path(ns)
    return ["nsenter", f"--net={path}"] if path else []


class Pfcd:
    """One pfcd process on one config: started (``start`` returns once pfcd is ready),
    stopped by SIGTERM, by PID (``stop`` returns its counters), undone if it died without
    its handler (``restore``). Its config is written next to ``out_path``; its stderr goes
    to ``log_path``. Not thread-safe: its owner calls it one call at a time."""

    def __init__(self, config: PfcConfig, binary: Path, out_path: Path,
                 log_path: Path) -> None:
        self.config = config
        self.binary = Path(binary)
        self.out_path = Path(out_path)
        self.log_path = Path(log_path)
        self.config_path = self.out_path.with_name(self.out_path.stem + ".conf")
        self.proc: subprocess.Popen[str] | None = None

    @staticmethod
    def build(build_dir: Path | None = None) -> Path:
        """pfcd, built once per source digest (``controllers.cbuild``)."""
        return cbuild.build("pfcd", [SOURCE], build_dir=build_dir)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 10) -> None:
        """Write the config, spawn ``binary CONFIG OUT`` and wait for its ready line: the
        load may start after this returns. A pfcd that refuses its config or setup, or is
        not ready in time, is one PfcError line with what it said."""
        if self.proc is not None:
            raise PfcError(f"pfcd: already started (pid {self.proc.pid})")
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config.text())
        self.out_path.unlink(missing_ok=True)
        self.log_path.write_text("")
        with open(self.log_path, "a") as log:      # appends: the ready line joins it below
            self.proc = subprocess.Popen(
                [str(self.binary), str(self.config_path), str(self.out_path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True)
        line, why = self._ready_line(timeout_s)
        if not line.startswith(READY):
            self._kill()
            self._close_stdout()
            raise PfcError(f"pfcd did not start: {why}: {self.stderr_tail() or 'no stderr'}")
        with open(self.log_path, "a") as log:
            log.write(line)

    def _ready_line(self, timeout_s: float) -> tuple[str, str]:
        """pfcd's first stdout line, or "" and why there is none."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "", f"no ready line within {timeout_s:g} s"
            readable, _, _ = select.select([self.proc.stdout], [], [], left)
            if readable:
                line = self.proc.stdout.readline()
                if line:
                    return line, f"it printed {line.strip()!r}"
                self.proc.wait(timeout=_TC_TIMEOUT_S)
                return "", _status(self.proc.returncode)

    def stop(self, timeout_s: float = 10) -> dict[str, Any]:
        """SIGTERM, by PID; pfcd resumes every paused class and writes its counters, which
        this returns. A pfcd that exits otherwise (or had died) has its classes restored
        here, and is a PfcError with its stderr."""
        if self.proc is None:
            raise PfcError("pfcd: not started")
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._kill()
                self._close_stdout()
                self.restore()
                raise PfcError(f"pfcd did not stop within {timeout_s:g} s of SIGTERM: "
                               "killed, and every feeder class set back to its rate") from None
        self._close_stdout()
        if self.proc.returncode != 0:
            why = _status(self.proc.returncode)
            try:
                self.restore()
                why += "; every feeder class set back to its rate"
            except PfcError as exc:
                why += f"; {exc}"
            raise PfcError(f"{why}: {self.stderr_tail() or 'no stderr'}")
        try:
            return json.loads(self.out_path.read_text())
        except (OSError, ValueError) as exc:
            raise PfcError(f"pfcd: no counters in {self.out_path}: {exc}") from None

    def restore(self) -> None:
        """Set every feeder class back to its configured rate and ceil (``tc class change``
        in its namespace), with the burst and quantum the lab gives every htb class
        (``htb_class_args``) and the class's own prio, which a pause leaves as it was:
        what pfcd's own resume does. Every feeder is tried; then one PfcError naming each
        that failed."""
        errors = []
        for f in self.config.feeders().values():
            try:
                self._restore_one(f)
            except PfcError as exc:
                errors.append(str(exc))
        if errors:
            raise PfcError("could not set back: " + "; ".join(errors))

    def _restore_one(self, f: Feeder) -> None:
        show = _tc(f, ["class", "show", "dev", f.dev, "classid", f.klass])
        prio = re.search(r"\bprio (\d+)", show)
        if prio is None:
            raise PfcError(f"{f.ns} {f.dev}: no htb class {f.klass}")
        _tc(f, ["class", "change", "dev", f.dev, "classid", f.klass,
                *htb_class_args(f.rate_bps / 1e6, f.ceil_bps / 1e6).split(),
                "prio", prio.group(1)])

    def stderr_tail(self, lines: int = 5) -> str:
        """The end of what pfcd said on stderr, on one line."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        said = [ln.strip() for ln in text.splitlines()
                if ln.strip() and not ln.startswith(READY)]
        return " | ".join(said[-lines:])

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=_TC_TIMEOUT_S)

    def _close_stdout(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


def _status(returncode: int) -> str:
    if returncode < 0:
        return f"pfcd was killed by {signal.Signals(-returncode).name}"
    return f"pfcd exited with status {returncode}"


def _tc(f: Feeder, argv: list[str]) -> str:
    """``tc`` in a feeder's namespace; its stdout, or a PfcError naming the feeder."""
    cmd = [*_in_ns(f.ns), "tc", *argv]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=_TC_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PfcError(f"{f.ns} {f.dev}: `{' '.join(cmd)}` failed: {exc}") from None
    if r.returncode != 0:
        raise PfcError(f"{f.ns} {f.dev}: `{' '.join(cmd)}` failed: "
                       f"{(r.stderr or r.stdout).strip()}")
    return r.stdout
