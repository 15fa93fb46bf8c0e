"""`fabriclab grade`'s pure parts: which exercise a file answers, what it imports, the batch
table and the JUnit XML. No root, no packets (tests/integration/test_lessons.py runs them)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lab import grade
from lab.analysis import gpuwait
from lab.grade import exercise, exercises
from lab.grade.exercise import NotAnAnswerError, Outcome
from lab.grade.exercises import who_waited
from lab.model import scenario


def test_every_shipped_skeleton_and_solution_names_its_exercise() -> None:
    known = exercises.registry()
    assert set(known) == {"end-the-incident", "anti-polarisation", "congested-uplink",
                          "outage", "hot-streams", "who-waited", "pause-root", "held-ring",
                          "spray-split"}
    for ex in known.values():
        for path in (ex.skeleton, ex.solution):
            found, _ = exercises.find(path)
            assert found is ex, path
        assert "fabriclab grade" in (ex.skeleton.parents[1] / "README.md").read_text()


def test_the_classroom_page_lists_every_exercise() -> None:
    page = (exercise.REPO / "docs" / "classroom.md").read_text()
    for ex in exercises.registry().values():
        assert f"| `{ex.name}` | {ex.lesson} | {ex.kind} |" in page, ex.name


def test_who_waited_knows_what_every_gpu_wait_phase_injects() -> None:
    """The grader's ground truth covers every phase the reference run makes, in the causes
    the diagnosis names: a new phase must say what it injects before it can be graded."""
    phases = scenario.load(who_waited.EXERCISE.scenario).params["phases"]
    assert set(who_waited.INJECTED) == set(phases)
    for name, causes in who_waited.INJECTED.items():
        assert set(causes) <= set(gpuwait.FIXES), (name, causes)


def test_a_file_without_marker_needs_the_option(tmp_path: Path) -> None:
    f = tmp_path / "mine.py"
    f.write_text("def congested_uplink(result):\n    return None\n")
    with pytest.raises(NotAnAnswerError, match=r"not an exercise answer.*--exercise"):
        exercises.find(f)
    assert exercises.find(f, "congested-uplink")[0].name == "congested-uplink"
    with pytest.raises(NotAnAnswerError, match="unknown exercise 'nope'"):
        exercises.find(f, "nope")


@pytest.mark.parametrize(("name", "text", "message"), [
    ("broken.py", 'EXERCISE = "outage"\ndef outages(:\n', r"broken.py:2: syntax error"),
    ("notes.txt", "hello", "not a .py file"),
    ("absent.py", None, "cannot read it"),
])
def test_bad_files_are_one_line(tmp_path: Path, name: str, text: str | None,
                                message: str) -> None:
    f = tmp_path / name
    if text is not None:
        f.write_text(text)
    with pytest.raises(NotAnAnswerError, match=message) as err:
        exercises.find(f)
    assert "\n" not in str(err.value)


def test_forbidden_imports_are_found_however_written(tmp_path: Path) -> None:
    ex = exercises.get("anti-polarisation")
    for source in ("from lab.analysis import offline\n",
                   "import controllers.policies.hash5_tier as t\n",
                   "from controllers.policies import hash5_tier\n",
                   "import importlib\nm = importlib.import_module('lab.analysis.diagnose')\n",
                   "m = __import__('lab')\n"):
        verdict = exercise.import_check(ex, exercise.ast.parse(source))
        assert not verdict.passed and "line" in verdict.measured and verdict.hint, source
    fine = exercise.import_check(ex, exercise.ast.parse(
        "import zlib\nfrom controllers.policies.base import pick\n"))
    assert fine.passed


ROWS = [
    grade.Graded(Path("a.py"), "outage", [Outcome("imports", True, "ok"),
                                          Outcome("answers", True, "0.01 s")], 1.0),
    grade.Graded(Path("b.py"), "outage", [Outcome("imports", True, "ok"),
                                          Outcome("answers", False, "KeyError", "read it")],
                 2.0),
    grade.Graded(Path("c.py"), error="c.py:1: syntax error: invalid syntax"),
]


def test_the_table_has_a_row_per_file_and_a_total() -> None:
    lines = grade.table(ROWS).splitlines()
    assert lines[0].split() == ["file", "exercise", "checks", "verdict", "time"]
    assert lines[2].split() == ["a.py", "outage", "2/2", "pass", "1.0", "s"]
    assert lines[3].split() == ["b.py", "outage", "1/2", "FAIL", "2.0", "s"]
    assert lines[4].split() == ["c.py", "-", "-", "error", "0.0", "s"]
    assert lines[-1] == "1 of 3 files pass"


def test_a_failed_check_is_one_line_with_its_hint() -> None:
    text = grade.render(ROWS[1]).splitlines()
    assert text[0].startswith("b.py (outage): 1 of 2 checks pass")
    assert text[2] == "  FAIL  answers: KeyError  (hint: read it)"


def test_junit_has_a_suite_per_file_and_a_case_per_check(tmp_path: Path) -> None:
    path = tmp_path / "grade.xml"
    grade.junit.write(path, grade.junit_suites(ROWS))
    suites = ET.parse(path).getroot().findall("testsuite")
    assert [s.get("name") for s in suites] == ["grade.a.py", "grade.b.py", "grade.c.py"]
    assert [(s.get("tests"), s.get("failures")) for s in suites] == [
        ("2", "0"), ("2", "1"), ("1", "1")]
    failure = suites[1].find("testcase[@name='answers']/failure")
    assert failure is not None and failure.get("message") == "KeyError (hint: read it)"
