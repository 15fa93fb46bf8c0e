"""What an exercise is, how an answer is read without running it, and the helpers the
exercises' checks share. The exercises themselves, one module each, and the registry that
finds them are ``lab.grade.exercises``: they import this module, never the reverse.

An exercise's checks are plain functions of what the lab measured (a run's result.json, and
for a counter analysis what the answer returned): the one definition ``fabriclab grade`` and
the lessons' tests both use.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lab.model.errors import ScenarioError

#: The module-level line that says which exercise a file answers: ``EXERCISE = "name"``.
MARKER = "EXERCISE"
REPO = Path(__file__).resolve().parents[2]


class NotAnAnswerError(ScenarioError):
    """A file the grader cannot take: missing, not Python, no marker, unknown exercise."""


@dataclass(frozen=True)
class Outcome:
    """One check's verdict as a student reads it: what was measured, and on failure, a hint."""

    check: str
    passed: bool
    measured: str
    hint: str = ""


@dataclass(frozen=True)
class Exercise:
    """One code exercise of a lesson.

    ``kind`` says how an answer runs: a ``policy`` is loaded by the controller process of a
    real run (the lab's usual ``--policy file.py``); an ``analysis`` is a function the
    grader calls in a subprocess with a time limit, on a reference run's files.
    """

    name: str
    lesson: str                        # the scenario folder the lesson lives in
    file: str                          # the skeleton's (and solution's) file name
    kind: Literal["policy", "analysis"]
    scenario: str                      # the scenario the checks run
    checks: Callable[..., list[Outcome]]
    duration: float | None = None
    policy: str | None = None          # analysis: the reference run's policy
    seed: int | None = None
    function: str = ""                 # analysis: the function the answer defines
    given: Callable[[Path, Path], Path] | None = None   # analysis: the answer's input
    probes: Sequence[tuple[str, Sequence[int]]] = ()    # policy: where choose() is tried
    forbidden: Sequence[str] = field(default=("lab",))   # imports that give the answer away
    sets: Sequence[str] = ()           # the reference run's --set items (e.g. its phases)

    @property
    def skeleton(self) -> Path:
        return REPO / "scenarios" / self.lesson / "exercises" / self.file

    @property
    def solution(self) -> Path:
        return REPO / "scenarios" / self.lesson / "solutions" / self.file


# -- reading an answer without running it ---------------------------------------------------

def parse(path: Path) -> ast.Module:
    """The file's syntax tree; a missing file, a non-.py file or a syntax error is bad input."""
    if path.suffix != ".py":
        raise NotAnAnswerError("file", f"{path}: not a .py file")
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise NotAnAnswerError("file", f"{path}: cannot read it: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    try:
        return ast.parse(source, str(path))
    except SyntaxError as exc:
        raise NotAnAnswerError("file", f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None


def marker(tree: ast.Module) -> str | None:
    """The value of the module-level ``EXERCISE = "..."`` line, if the file has one."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == MARKER
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    return None


def imports(tree: ast.Module) -> list[tuple[str, int]]:
    """(module, line) of every import the file states: ``import``, ``from``, and
    ``__import__``/``importlib.import_module`` called with a literal name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.module, node.lineno)]
            found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Name) and node.func.id == "__import__")
                   or (isinstance(node.func, ast.Attribute)
                       and node.func.attr == "import_module"))):
            found.append((node.args[0].value, node.lineno))
    return found


def import_check(ex: Exercise, tree: ast.Module) -> Outcome:
    """The answer must not import what gives the answer away (the lab's own analyses, the
    shipped policy that solves it)."""
    bad = [(m, line) for m, line in imports(tree)
           if any(m == f or m.startswith(f + ".") for f in ex.forbidden)]
    if bad:
        first = ", ".join(f"{m} (line {line})" for m, line in bad[:3])
        return Outcome("imports", False, f"imports {first}",
                       f"{', '.join(ex.forbidden)} may not be imported: it holds the "
                       f"answer; write it yourself")
    return Outcome("imports", True, "nothing forbidden (" + ", ".join(ex.forbidden) + ")")


# -- helpers the exercises' checks share ------------------------------------------------------

def one_path(result: dict[str, Any], hint: str) -> Outcome:
    """Every flow's packets took one path (the switches' per-flow counters say so)."""
    flows = result["flows"]
    clean = sum(1 for f in flows if f.get("path_clean"))
    return Outcome("one path per flow", clean == len(flows),
                   f"{clean} of {len(flows)} flows on one path", hint)
