"""The lessons' code exercises, graded as a class would: one `fabriclab grade --batch` over
every shipped skeleton and solution, a file that crashes, one that loops and one that
imports the lab's own answer. The checks are
the exercises' own (lab/grade/exercises), the ones a student's `fabriclab grade` runs; this
module asserts what they say, on real packets, and what the kept runs show besides.

One batch of 21 files, shared by every test here: eleven runs (two per policy exercise, one
reference run per counter analysis, the streaming one on real media, gpu-wait's eleven
phases about 110 s, roce-allreduce's three about 30 s, multipath's three about 40 s). 15
files and eight runs took 199 s on this 2-core machine (2026-12-06), 17 and nine 225 s
(docs/testing.md); the batch of 21 has not been timed yet.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lab import grade
from lab.grade import exercises
from lab.grade.exercises import who_waited
from lab.machine import state
from tests.integration.support import CLI, REPO, check_links_agree_with_flows, fabriclab

#: Reads the flows an operator does not have: fails with a KeyError on its own line.
CRASH = '''EXERCISE = "congested-uplink"


def congested_uplink(result):
    return result["flows"][0]["path"]
'''

#: Asks the lab for the answer: refused before anything runs.
CHEAT = '''from lab.analysis import diagnose

EXERCISE = "congested-uplink"


def congested_uplink(result):
    return diagnose.diagnose(result)["congested_link"]
'''

#: Starts a child, then never answers: the child must die with it.
LOOP = '''import subprocess

from controllers.policies import HashPolicy

EXERCISE = "end-the-incident"


class Forever(HashPolicy):
    name = "forever"
    granularity = "flow"

    def choose(self, flow, switch, ports):
        subprocess.Popen(["sleep", "{marker}"])
        while True:
            pass
'''
SLEEP_MARKER = "424242"


def sleepers() -> list[int]:
    """Our loop's `sleep` children still alive (by their unusual argument)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == \
                    f"sleep\0{SLEEP_MARKER}\0".encode():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("grade")
    folder = tmp / "submissions"
    folder.mkdir()
    for ex in exercises.registry().values():
        shutil.copy(ex.skeleton, folder / f"skeleton_{ex.file}")
        shutil.copy(ex.solution, folder / f"solution_{ex.file}")
    (folder / "crash.py").write_text(CRASH)
    (folder / "cheat.py").write_text(CHEAT)
    (folder / "loop.py").write_text(LOOP.format(marker=SLEEP_MARKER))
    t0 = time.monotonic()
    r = fabriclab("grade", "--batch", str(folder), "--junit", str(tmp / "grade.xml"),
                  "--out", str(tmp / "runs"), check=False, timeout=900)
    print(f"batch of {len(list(folder.iterdir()))} files: {time.monotonic() - t0:.0f} s")
    blocks = {}                                    # file name -> its lines, before the table
    for chunk in re.split(r"\n(?=\S)", r.stdout.split("\n\n")[0]):
        head = chunk.split(" ", 1)[0].rstrip(":")
        blocks[head] = chunk
    return {"r": r, "blocks": blocks, "runs": tmp / "runs",
            "junit": ET.parse(tmp / "grade.xml").getroot()}


def test_every_solution_passes_and_every_skeleton_fails_with_a_hint(batch: dict) -> None:
    assert batch["r"].returncode == 1           # the skeletons fail
    suites = {s.get("name"): s for s in batch["junit"].findall("testsuite")}
    for ex in exercises.registry().values():
        solved = batch["blocks"][f"solution_{ex.file}"]
        assert "FAIL" not in solved and suites[f"grade.solution_{ex.file}"].get(
            "failures") == "0", solved
        skeleton = batch["blocks"][f"skeleton_{ex.file}"]
        failed = [ln for ln in skeleton.splitlines() if ln.startswith("  FAIL")]
        # It fails on what it measured, not on running: the imports, the decision or the
        # answer itself pass.
        assert failed and all("(hint: " in ln for ln in failed), skeleton
        assert re.search(r"PASS  (decides|answers):", skeleton), skeleton


def test_the_numbers_are_the_incidents(batch: dict) -> None:
    b = batch["blocks"]
    assert "flows per uplink 8/0/0/0" in b["skeleton_end_the_incident.py"]
    assert "flows per uplink 2/2/2/2" in b["solution_end_the_incident.py"]
    assert "agg->core links used 2 of 4" in b["skeleton_anti_polarisation.py"]
    assert "agg->core links used 4 of 4" in b["solution_anti_polarisation.py"]
    assert "yours None" in b["skeleton_congested_uplink.py"]
    assert "0 of 8 flows" in b["skeleton_outage.py"]
    assert "yours []" in b["skeleton_hot_streams.py"]
    assert "incident/big" in b["solution_hot_streams.py"]
    # The incast's port started the pauses and no QP of the ring leaves through it, yet
    # PFC held the ring: head-of-line blocking.
    assert "root of the pauses: yours None, the lab's 'leaf1-eth4'" in b["skeleton_held_ring.py"]
    assert "the ring crosses the root: yours False, the lab's False" in \
        b["solution_held_ring.py"]
    # The skeleton names nothing: right for a healthy phase, wrong, with the lab's evidence
    # for the cause as the hint, for every phase that injects one.
    for name, causes in who_waited.INJECTED.items():
        line = re.escape(f"yours [], injected {causes} (it was phase {name!r})")
        verdict = (rf"PASS  phase p\d+: {line}$" if not causes else
                   rf"FAIL  phase p\d+: {line}  \(hint: {re.escape(sorted(causes)[0])}: ")
        assert re.search(verdict, b["skeleton_who_waited.py"], re.M), (name, verdict)
    # The kept runs say more than the checks: the skeleton's uplink dropped, and the
    # solution's links carried exactly its flows' bytes.
    skel = json.loads((batch["runs"] / "skeleton_end_the_incident" / "result.json").read_text())
    assert skel["metrics"]["flows_per_uplink"]["leaf1->spine1"] == 8
    assert sum(skel["metrics"]["uplink_drops"].values()) > 0
    sol = json.loads((batch["runs"] / "solution_end_the_incident" / "result.json").read_text())
    assert check_links_agree_with_flows(sol) == []


def test_a_crash_a_loop_and_a_forbidden_import_fail_cleanly(batch: dict) -> None:
    crash = batch["blocks"]["crash.py"]
    assert re.search(r"FAIL  answers: congested_uplink\(\): KeyError: 'flows' "
                     r"\(crash.py line 5\)", crash), crash
    loop = batch["blocks"]["loop.py"]
    assert f"FAIL  decides: did not finish within {grade.DECIDE_TIMEOUT_S:g} s" in loop, loop
    took = float(re.search(r"\((\d+\.\d) s\)", loop.splitlines()[0]).group(1))
    assert grade.DECIDE_TIMEOUT_S <= took < grade.DECIDE_TIMEOUT_S + 5
    assert sleepers() == []                   # the loop's child died with its session
    assert not (batch["runs"] / "loop").exists()        # no fabric was built for it
    cheat = batch["blocks"]["cheat.py"].splitlines()
    assert cheat[1].startswith("  FAIL  imports: imports lab.analysis (line 1)") and \
        len(cheat) == 2, cheat                # refused: nothing of it ran
    # nothing else of the lab is left: the autouse fixture checks after every test


def test_batch_prints_the_table(batch: dict) -> None:
    table = batch["r"].stdout.rsplit("\n\n", 1)[-1].splitlines()
    assert table[0].split() == ["file", "exercise", "checks", "verdict", "time"]
    rows = {ln.split()[0]: ln.split() for ln in table[2:-1]}
    assert len(rows) == 2 * len(exercises.registry()) + 3
    assert all(rows[f"solution_{ex.file}"][3] == "pass" for ex in exercises.registry().values())
    assert rows["crash.py"][3] == rows["loop.py"][3] == rows["cheat.py"][3] == "FAIL"
    assert table[-1] == f"{len(exercises.registry())} of {len(rows)} files pass"


@pytest.mark.parametrize(("args", "field"), [
    (["scenarios/ecmp-basic/README.md"], "file"),
    (["tests/integration/support.py"], "file"),         # Python, but no exercise's answer
    (["--batch", "scenarios/ecmp-basic/scenario.yaml"], "batch"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], field: str) -> None:
    r = fabriclab("grade", *args, check=False)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"fabriclab: error: {field}: ")
    assert len(r.stderr.strip().splitlines()) == 1


def test_syntax_error_and_busy_lab_are_one_line_and_exit_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text('EXERCISE = "outage"\n\ndef outages(run_dir:\n')
    r = fabriclab("grade", str(broken), check=False)
    assert r.returncode == 2 and "broken.py:3: syntax error" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    lock = state.LabLock()
    lock.acquire(0)
    try:
        env = {k: v for k, v in os.environ.items() if k != state.LOCK_WAIT_ENV}
        r = subprocess.run([*CLI, "grade", str(exercises.get("outage").solution)], cwd=REPO,
                           capture_output=True, text=True, env=env, timeout=60)
    finally:
        lock.release()
    assert r.returncode == 2 and r.stderr.startswith("fabriclab: error: lab: another "
                                                     "FabricLab run"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
