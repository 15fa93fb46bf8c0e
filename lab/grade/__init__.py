"""``fabriclab grade``: check a student's answer to a lesson's code exercise on real packets.

The exercise is found by the answer's marker line (``lab.grade.exercise``); its checks are
the exercise module's own (``lab.grade.exercises``), the ones the lessons' tests use. How an
answer runs is the lab's usual process model, each step time-bounded:

- a **policy** is first asked about the run's flows in a child process (a crash, an endless
  loop or an answer that is not a port fails there, in seconds, before any fabric exists),
  then loaded by the controller of a real run, exactly like ``fabriclab run --policy
  file.py``; the run's own timeouts and teardown bound it and clean up after it;
- a **counter analysis** runs in a child process with a time limit, on a reference run of the
  exercise's scenario (made once per exercise in a batch); its whole session is killed after.

Bad input (not an answer, a syntax error, a busy lab) is a ``LabError``: one line, exit 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers import config as controller_config
from controllers import routing
from controllers.policies import is_file_spec, split_file_spec
from lab import run
from lab.grade import exercise, exercises
from lab.grade.exercise import Exercise, NotAnAnswerError, Outcome
from lab.machine import jail, state
from lab.model import junit
from lab.model.errors import BusyError, LabError, ScenarioError
from lab.model.flows import FlowSpec

#: How long an answer's code may take in its child process (start-up included), seconds.
DECIDE_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 10.0

Say = Callable[[str], None]


@dataclass
class Graded:
    """One file's verdict: its checks' outcomes, or why it could not be graded."""

    file: Path
    exercise: str | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.outcomes) and all(
            o.passed for o in self.outcomes)


def sandbox(mode: str, path: Path | str, given: dict[str, Any], timeout: float,
            scratch: Path) -> dict[str, Any]:
    """Run the answer's code through ``lab.machine.jail_runner`` in the jail (``lab.machine.jail``:
    not root, its own file system with only the answer, its input and ``/work``, no
    network), at most ``timeout`` seconds; its session, and so its PID namespace, is killed
    afterwards, so nothing it started survives."""
    work = scratch / f"{mode}-work"
    work.mkdir()
    out_path = work / f"{mode}-out.json"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(exercise.REPO)}
    if os.geteuid() != 0:
        # Not root: the answer runs with this user's own rights, which are not the lab's.
        argv = [sys.executable, "-m", "lab.machine.jail_runner", mode, str(path),
                str(work / f"{mode}-in.json"), str(out_path)]
    else:
        argv, given = _jailed(mode, path, given, timeout, scratch, work)
    (work / f"{mode}-in.json").write_text(json.dumps(given))
    proc = subprocess.Popen(argv, cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        # Wait without reaping (WNOWAIT): while the child is unreaped its id cannot be
        # reused, so killing its process group below reaches only what it started.
        while (done := os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)) \
                is None and time.monotonic() < deadline:
            time.sleep(0.05)
        timed_out = done is None
    finally:
        # The child's whole session by its id (the child leads it): what the answer forked too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    if timed_out:
        return {"ok": False, "error": f"did not finish within {timeout:g} s (an endless "
                                      f"loop?); stopped", "timed_out": True}
    try:
        return json.loads(out_path.read_text())
    except (OSError, ValueError):
        why = err.decode(errors="replace").strip().splitlines()
        return {"ok": False, "error": f"the child process died (exit status "
                                      f"{proc.returncode}) without an answer"
                                      + (f": {why[-1]}" if why else "")}


def _jailed(mode: str, path: Path | str, given: dict[str, Any], timeout: float,
            scratch: Path, work: Path) -> tuple[list[str], dict[str, Any]]:
    """The command that runs the answer in the jail, and what it is given as the jail
    names it (its input under ``jail.INPUT``)."""
    given = dict(given)
    inp = Path(given["argument"]) if "argument" in given else None
    if inp is not None:
        given["argument"] = f"{jail.INPUT}/{inp.name}"
    return jail.command(mode, str(path), work, scratch, timeout, inp), given


def ask_policy(spec: str, flows: list[FlowSpec], probes: list[tuple[str, list[int]]],
               seed: int, scratch: Path) -> dict[str, Any]:
    """The policy file's ``choose()`` asked about ``flows`` at each probe (switch, candidate
    ports) in a sandboxed child, at most ``DECIDE_TIMEOUT_S``: a crash, an endless loop or
    an answer that is not one of the ports comes back as ``{"ok": false, "error": ...}``."""
    given = {"seed": seed, "probes": [[s, list(p)] for s, p in probes],
             "flows": [[f.src_ip, f.dst_ip, 17 if f.proto == "udp" else 6, f.sport, f.dport]
                       for f in flows]}
    return sandbox("policy", spec, given, DECIDE_TIMEOUT_S, scratch)


def choice_points(topo_desc: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """Where the controller will ask a policy: each switch's distinct sets of equal-cost
    ports (``controllers.routing`` on the config the lab writes), those with a choice."""
    routes = routing.ecmp_routes(controller_config.build(topo_desc, "hash5", 1))
    return [(sw, list(ports)) for sw, by_host in sorted(routes.items())
            for ports in sorted({tuple(p) for p in by_host.values() if len(p) > 1})]


def planned_flows(given: run.CheckedInput) -> list[FlowSpec]:
    """The run's planned flows (a stream gives its ``spec()``); where a kind plans none
    ahead (a library picks its own ports), one TCP flow between every pair of hosts."""
    flows = [spec for item in given.flows or []
             if isinstance(spec := item.spec() if hasattr(item, "spec") else item, FlowSpec)]
    if flows:
        return flows
    hosts = given.topo_desc["hosts"]
    return [FlowSpec(f"probe{i}", a["name"], b["name"], a["ip"], b["ip"], "tcp", 40000 + i,
                     5201, 0.0)
            for i, (a, b) in enumerate((a, b) for a in hosts for b in hosts if a is not b)]


def check_policy_files(given: run.CheckedInput, policy: str | None) -> None:
    """Before a run builds anything: a policy file's ``choose()`` must answer the run's own
    flows at every switch where it has a choice, quickly (``ask_policy``), the check
    ``grade`` makes first. Else one ``ScenarioError`` naming the file, instead of a
    controller that hangs until the run's bring-up times out."""
    if policy is None or not is_file_spec(policy):
        return
    path_text, cls = split_file_spec(policy)
    spec = str(Path(path_text).expanduser().resolve()) + (f":{cls}" if cls else "")
    with tempfile.TemporaryDirectory(prefix="fabriclab-policy-") as scratch:
        answer = ask_policy(spec, planned_flows(given), choice_points(given.topo_desc),
                            int(given.params.get("seed") or 1), Path(scratch))
    if not answer["ok"]:
        raise ScenarioError("policy-file", f"{path_text}: choose() {answer['error']}"
                            if answer.get("timed_out") else f"{path_text}: {answer['error']}")


class Grader:
    """Grades files one after another; reference runs are made once per exercise."""

    def __init__(self, out: Path | None, progress: Say) -> None:
        self.keep = out is not None
        self.out = out or Path(tempfile.mkdtemp(prefix="fabriclab-grade-"))
        self.progress = progress
        self.references: dict[str, tuple[Path, dict[str, Any]]] = {}

    def close(self) -> None:
        if not self.keep:
            shutil.rmtree(self.out, ignore_errors=True)

    def grade(self, path: Path, given: str | None = None) -> Graded:
        """Grade one file; bad input raises (the batch turns it into a row)."""
        t0 = time.monotonic()
        path = path.resolve()
        ex, tree = exercises.find(path, given)
        graded = Graded(path, ex.name)
        graded.outcomes.append(exercise.import_check(ex, tree))
        if graded.outcomes[-1].passed:
            with tempfile.TemporaryDirectory(prefix="fabriclab-grade-") as scratch:
                if ex.kind == "policy":
                    graded.outcomes += self._policy(ex, path, Path(scratch))
                else:
                    graded.outcomes += self._analysis(ex, path, Path(scratch))
        graded.seconds = time.monotonic() - t0
        return graded

    def _run(self, ex: Exercise, policy: str, out_dir: Path) -> dict[str, Any]:
        (plan,) = run.make_plans(ex.scenario, policy=policy, duration=ex.duration,
                                 seed=ex.seed, sets=list(ex.sets))
        # No report here (seconds of plotting per file); `fabriclab report DIR` makes it.
        # What a run prints is progress: stdout is the checks' lines and the table.
        with contextlib.redirect_stdout(sys.stderr):
            return run.execute(plan, out_dir, self.progress)

    def _policy(self, ex: Exercise, path: Path, scratch: Path) -> list[Outcome]:
        flows = run.check_input(ex.scenario, policy="hash5", duration=ex.duration,
                                seed=ex.seed).flows
        answer = ask_policy(str(path), flows, [(s, list(p)) for s, p in ex.probes],
                            ex.seed or 1, scratch)
        if not answer["ok"]:
            return [Outcome("decides", False, answer["error"],
                            "choose(flow, switch, ports) must return one of ports, quickly")]
        out = [Outcome("decides", True, f"choose() answered {answer['value']} times in "
                                        f"{answer['seconds']:.2f} s")]
        out_dir = self.out / path.stem
        try:
            result = self._run(ex, str(path), out_dir)
        except BusyError:
            raise
        except (LabError, OSError, TimeoutError) as exc:
            return [*out, Outcome("run", False, f"the run with this policy failed: "
                                  f"{type(exc).__name__}: {exc}".replace("\n", " "),
                                  f"the controller ran it: see {out_dir}/controller.log"
                                  + ("" if self.keep else " (give --out DIR to keep it)"))]
        return [*out, *ex.checks(result)]

    def _analysis(self, ex: Exercise, path: Path, scratch: Path) -> list[Outcome]:
        if ex.name not in self.references:
            out_dir = self.out / f"reference-{ex.name}"
            self.references[ex.name] = (out_dir, self._run(ex, str(ex.policy), out_dir))
        run_dir, result = self.references[ex.name]
        assert ex.given is not None
        arg = ex.given(run_dir, scratch)
        answer = sandbox("analysis", path, {"function": ex.function, "argument": str(arg),
                                            "load_json": arg.suffix == ".json"},
                         ANSWER_TIMEOUT_S, scratch)
        if not answer["ok"]:
            return [Outcome("answers", False, f"{ex.function}(): {answer['error']}",
                            f"{ex.function}() must return within {ANSWER_TIMEOUT_S:g} s")]
        return [Outcome("answers", True, f"{ex.function}() returned in "
                                         f"{answer['seconds']:.2f} s"),
                *ex.checks(answer["value"], result)]


def check_lab_free() -> None:
    """Root, and the lab's lock free now (or within ``$FABRICLAB_LOCK_WAIT``): else one
    line and exit 2 before any file is run."""
    state.require_root()
    lock = state.LabLock()
    lock.acquire(None)
    lock.release()


def batch_files(folder: Path) -> list[Path]:
    """The .py files directly in ``folder``, by name: one submission each."""
    if not folder.is_dir():
        raise ScenarioError("batch", f"{folder}: not a directory")
    files = sorted(p for p in folder.iterdir() if p.suffix == ".py" and p.is_file())
    if not files:
        raise ScenarioError("batch", f"{folder}: no .py files in it")
    return files


# -- output -------------------------------------------------------------------------------

def line(o: Outcome) -> str:
    """One check, one line: verdict, what it checks, the number; on failure, a hint."""
    text = f"  {'PASS' if o.passed else 'FAIL'}  {o.check}: {o.measured}"
    return text + (f"  (hint: {o.hint})" if not o.passed and o.hint else "")


def render(g: Graded) -> str:
    if g.error is not None:
        return f"{g.file.name}: not graded: {g.error}"
    ok = sum(o.passed for o in g.outcomes)
    head = (f"{g.file.name} ({g.exercise}): {ok} of {len(g.outcomes)} checks pass "
            f"({g.seconds:.1f} s)")
    return "\n".join([head, *(line(o) for o in g.outcomes)])


def table(rows: list[Graded]) -> str:
    """The batch's summary: one row per file."""
    head = ("file", "exercise", "checks", "verdict", "time")
    body = [(g.file.name, g.exercise or "-",
             f"{sum(o.passed for o in g.outcomes)}/{len(g.outcomes)}" if g.error is None
             else "-", "pass" if g.passed else "FAIL" if g.error is None else "error",
             f"{g.seconds:.1f} s") for g in rows]
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in (head, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    passed = sum(g.passed for g in rows)
    return "\n".join([*lines, f"{passed} of {len(rows)} files pass"])


def junit_suites(rows: list[Graded]) -> dict[str, list[junit.Case]]:
    """One testsuite per file, one testcase per check (a file not graded: one failed case)."""
    suites = {}
    for g in rows:
        if g.error is not None:
            cases = [junit.Case(g.exercise or "grade", "input", g.error)]
        else:
            cases = [junit.Case(str(g.exercise), o.check, None if o.passed else
                                f"{o.measured}" + (f" (hint: {o.hint})" if o.hint else ""))
                     for o in g.outcomes]
        suites[f"grade.{g.file.name}"] = cases
    return suites


# -- the command ----------------------------------------------------------------------------

def execute(files: list[Path], given: str | None, batch: bool, out: Path | None,
            junit_path: Path | None, say: Say = print, progress: Say = print) -> int:
    """Grade ``files``; 0 if every one passes, 1 otherwise. A single file's bad input
    raises (exit 2); in a batch it is that file's row."""
    if given is not None:
        exercises.get(given)
    if not batch:
        exercises.find(files[0], given)          # bad input before root, lock or runs
    check_lab_free()
    grader = Grader(out, progress)
    rows: list[Graded] = []
    try:
        for path in files:
            try:
                g = grader.grade(path, given)
            except NotAnAnswerError as exc:
                if not batch:
                    raise
                g = Graded(path, error=exc.message)
            rows.append(g)
            say(render(g))
    finally:
        grader.close()
    if batch:
        say("")
        say(table(rows))
    if junit_path is not None:
        junit.write(junit_path, junit_suites(rows))
    return 0 if all(g.passed for g in rows) else 1
