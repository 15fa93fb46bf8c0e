"""The README stays a short front page, and every command it shows is one that works.

A newcomer copies the README's commands first, so each must be real: a ``fabriclab``
command must parse with the CLI's own parser, a ``make`` target must exist, the cheap ones
are run here, and each of the others is run by the test named in ``RUN_ELSEWHERE``. Its test
command must be the one CI runs. The details live in the documentation site (docs/), built
strict by ``make docs``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lab.cli import build_parser
from lab.model.result import SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MAX_LINES = 200

#: Commands too slow or too privileged for a unit test, each with the file that runs it and
#: the words (in that file) of that run.
RUN_ELSEWHERE: dict[tuple[str, ...], tuple[str, tuple[str, ...]]] = {
    ("make", "demo"): ("tests/integration/test_readme_demo.py", ('"demo"',)),
    ("make", "test"): (".ci/run", ("\nmake test\n",)),
    ("fabriclab", "run", "ecmp-one-pair", "--policy", "hash-l3", "--live"): (
        "tests/integration/test_live.py", ('"ecmp-one-pair"', '"--policy", "hash-l3"',
                                           '"--live"')),
    ("fabriclab", "vm", "run", "ecmp-basic", "--policy", "hash5"): (
        "tests/vm/test_vm_lane.py", ('"vm", "run", "ecmp-basic", "--policy", "hash5"',)),
}
#: Commands this file runs itself (below).
RUN_HERE = {("fabriclab", "list"), ("make", "docs")}


def readme_commands(text: str) -> list[tuple[str, ...]]:
    """Every command line of the README's ``sh`` blocks, without comments and ``sudo``."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:1] == ["sudo"]:
                argv = argv[1:]
            if argv:
                commands.append(tuple(argv))
    return commands


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_every_readme_command_is_real_and_run_by_a_test() -> None:
    commands = readme_commands(README.read_text())
    assert ("make", "demo") in commands and ("make", "test") in commands
    targets = make_targets()
    for argv in commands:
        if argv[0] == "make":
            assert set(argv[1:]) <= targets, f"{' '.join(argv)}: no such Makefile target"
        elif argv[0] == "fabriclab":
            try:
                build_parser().parse_args(list(argv[1:]))
            except SystemExit:
                pytest.fail(f"README command does not parse: {' '.join(argv)}")
        else:
            pytest.fail(f"README shows {' '.join(argv)!r}, which no test checks")
        assert argv in RUN_HERE or argv in RUN_ELSEWHERE, \
            f"no test runs the README's {' '.join(argv)!r}: add it to RUN_ELSEWHERE or RUN_HERE"
    for argv, (path, words) in RUN_ELSEWHERE.items():
        assert argv in commands, f"{' '.join(argv)!r} is no longer in the README: drop it here"
        text = (REPO / path).read_text()
        for word in words:
            assert word in text, f"{path} no longer runs {' '.join(argv)!r} ({word!r})"


def test_readme_test_command_is_what_ci_runs() -> None:
    """CI runs README's test command, and that command builds the documentation too."""
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert "make test" in ci
    assert re.search(r"^make test +#", README.read_text(), re.M)
    rule = re.search(r"^test:(.*)$", (REPO / "Makefile").read_text(), re.M)
    assert rule and {"lint", "docs"} <= set(rule.group(1).split())


def test_demo_recipe_is_a_command_that_parses() -> None:
    recipe = re.search(r"^demo:.*\n\t(.*)$", (REPO / "Makefile").read_text(), re.M)
    assert recipe, "no demo recipe"
    argv = shlex.split(recipe.group(1))
    assert argv[0].endswith("/fabriclab")
    build_parser().parse_args(argv[1:])


def test_readme_lists_every_scenario() -> None:
    """The scenario table has a row, and a lesson link, for each scenario folder."""
    rows = re.findall(r"^\| `([\w-]+)` \|.*\]\(scenarios/([\w-]+)/README\.md\) \|$",
                      README.read_text(), re.M)
    assert all(name == linked for name, linked in rows)
    folders = {p.parent.name for p in REPO.glob("scenarios/*/scenario.yaml")}
    assert {name for name, _ in rows} == folders


def test_fabriclab_list_runs() -> None:
    r = subprocess.run([sys.executable, "-m", "lab.cli", "list"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    listed = {line.split()[0] for line in r.stdout.splitlines() if line.strip()}
    assert listed == {p.parent.name for p in REPO.glob("scenarios/*/scenario.yaml")}


def test_make_docs_builds_strict(tmp_path: Path) -> None:
    """What ``make docs`` runs, into a scratch folder: strict, so a broken link fails."""
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                        "--site-dir", str(tmp_path / "site")], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    commands = (tmp_path / "site" / "commands" / "index.html").read_text()
    for name in ("fabriclab run", "fabriclab regress", "fabriclab vm run", "--dry-run"):
        assert name in commands
    result = (tmp_path / "site" / "result" / "index.html").read_text()
    assert f"Schema version: <strong>{SCHEMA_VERSION}</strong>" in result   # generated keys
    assert (tmp_path / "site" / "scenarios" / "ecmp-one-pair" / "exercises"
            / "end_the_incident.py").is_file()
