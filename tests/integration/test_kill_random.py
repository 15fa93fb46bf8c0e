"""kill -9 of `fabriclab run` at random points; `fabriclab clean` removes everything it left.

SIGTERM and Ctrl-C tear down through the lab's own path (test_cleanup.py); only ``kill -9``
leaves work for ``fabriclab clean``, and what it leaves depends on where the run was: a
half-built Mininet and a starting controller during bring-up, iperf3 and the sampler during
traffic, a half-applied record during teardown. Fixed kill points test a few instants;
random ones over many trials find the gaps between them. The draw is seeded, so a failing
trial reproduces. Finally a run after all the kills must give what a clean run gives: the
same flows on the same paths, the same flows per uplink.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from lab.machine import state
from tests.integration.support import (
    LabTurnWaiter,
    RunWatcher,
    fabriclab,
    lab_leftovers,
    record_of,
    run_scenario,
)

# Other people's runs share this machine: wait for a turn instead of failing (inherited by
# every `fabriclab` this module starts).
os.environ.setdefault(state.LOCK_WAIT_ENV, "1800")

SEED = 20261202
DURATION = 2.0
TRIALS = 8
PHASES = ("bring-up", "traffic", "teardown")
#: Seconds after each phase's start mark to kill at, drawn uniformly. Bring-up (controller,
#: Mininet build, switches programmed, pingall) takes well over 1 s; traffic lasts DURATION
#: from "flows for"; teardown starts when the controller is stopped and takes >= 0.3 s
#: (bridges are deleted at ~70 ms each), so every draw lands inside its phase.
DELAY_S = {"bring-up": (0.0, 1.0), "traffic": (0.1, DURATION - 0.2), "teardown": (0.0, 0.15)}


@dataclass
class Trial:
    phase: str
    delay_s: float
    landed: str
    before: dict[str, int]
    after: dict[str, list]


def plan_trials(rng: random.Random) -> list[tuple[str, float]]:
    """Every phase twice, the rest drawn; shuffled; a delay drawn for each."""
    phases = [p for p in PHASES for _ in range(2)]
    phases += [rng.choice(PHASES) for _ in range(TRIALS - len(phases))]
    rng.shuffle(phases)
    return [(p, round(rng.uniform(*DELAY_S[p]), 3)) for p in phases]


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


def controller_alive(run: RunWatcher) -> bool | None:
    """Whether the run's controller still runs; None once the run's record is gone."""
    rec = record_of(run.proc.pid)
    if rec is None:
        return None
    ctrl = [p for p in rec.pids if p.get("what") == "controller"]
    return any(state.pid_alive(int(p["pid"]), p.get("start")) for p in ctrl)  # type: ignore[arg-type]


def wait_teardown_started(run: RunWatcher, timeout: float = 60.0) -> None:
    """Teardown's first step stops the controller: wait until it has gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if controller_alive(run) is not True or run.proc.poll() is not None:
            return
        time.sleep(0.01)
    raise AssertionError(f"teardown did not start in {timeout:g} s:\n{run.output()}")


def where_is(run: RunWatcher) -> str:
    """Which phase the run is in right now, from its output and its controller."""
    if run.proc.poll() is not None:
        return "finished"
    if not run.saw("flows for"):
        return "bring-up"
    alive = controller_alive(run)
    if alive:
        return "traffic"
    return "teardown" if alive is False else "after teardown"


def kill_at(phase: str, delay_s: float, out: Path) -> Trial:
    """Start a run, kill -9 it ``delay_s`` into ``phase``, clean; what was left, before/after."""
    run = RunWatcher("ecmp-basic", "--policy", "hash5", "--duration", f"{DURATION:g}",
                     "--out", str(out))
    t0 = run.wait_for("bringing up")
    if phase == "bring-up":
        sleep_until(t0 + delay_s)
    elif phase == "traffic":
        sleep_until(run.wait_for("flows for") + delay_s)
    else:
        sleep_until(run.wait_for("flows for") + DURATION)
        wait_teardown_started(run)
        time.sleep(delay_s)
    # The run holds the lab lock: queue for it now, so that we (not another waiting run)
    # get it when the kill releases it, and clean before anyone builds on our leftovers.
    with LabTurnWaiter() as turn:
        landed = where_is(run)
        os.kill(run.proc.pid, signal.SIGKILL)
        run.finish()
        turn.wait(timeout=1800)
        before = lab_leftovers()
        fabriclab("clean")
        after = lab_leftovers()
    return Trial(phase, delay_s, landed, {k: len(v) for k, v in before.items()}, after)


def fingerprint(result: dict) -> dict:
    """What a seed and a policy decide: each flow's path and the flows per uplink."""
    return {"paths": {f["id"]: f["path"] for f in result["flows"]},
            "flows_per_uplink": result["metrics"]["flows_per_uplink"]}


def seed3_run(tmp_path: Path, name: str) -> dict:
    return run_scenario(tmp_path / name, "ecmp-basic", "--policy", "hash5", "--seed", "3",
                        "--duration", f"{DURATION:g}")


def report(trials: list[Trial]) -> None:
    for i, t in enumerate(trials, 1):
        print(f"trial {i}: {t.phase:8s} +{t.delay_s:.3f} s -> killed in {t.landed}; left "
              f"before clean {t.before}; after clean "
              f"{ {k: len(v) for k, v in t.after.items()} }")
    planned = collections.Counter(t.phase for t in trials)
    landed = collections.Counter(t.landed for t in trials)
    left = collections.Counter()
    for t in trials:
        left.update(t.before)
    print(f"tally: trials per phase {dict(planned)}, landed {dict(landed)}; leftovers found "
          f"before clean (summed) {dict(left)}; after clean "
          f"{sum(len(v) for t in trials for v in t.after.values())}")


def test_kill9_at_random_points_then_clean(tmp_path):
    reference = seed3_run(tmp_path, "reference")
    trials = [kill_at(phase, delay, tmp_path / f"killed{i}")
              for i, (phase, delay) in enumerate(plan_trials(random.Random(SEED)))]
    report(trials)
    for t in trials:
        assert not any(t.after.values()), f"left after `fabriclab clean`: {t}"
        assert t.landed == t.phase, f"kill meant for {t.phase} landed in {t.landed}: {t}"
        # kill -9 always leaves the run's record at least: clean had something to do.
        assert t.before["records"] >= 1, t
    assert all(sum(t.phase == p for t in trials) >= 2 for p in PHASES)
    again = seed3_run(tmp_path, "after-kills")
    assert fingerprint(again) == fingerprint(reference), json.dumps(
        {"reference": fingerprint(reference), "after kills": fingerprint(again)}, indent=1)
