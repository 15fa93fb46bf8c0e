"""The exercises, one module each, and the registry that finds them.

Adding an exercise is adding a module here that defines ``EXERCISE`` (an
``lab.grade.exercise.Exercise``), and the marker line in its skeleton; the grader, its
``--exercise`` choices and the lessons' tests find it. The registry lives with the exercises,
not with ``lab.grade.exercise``: every exercise imports that module, so it must not import
them back.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

from lab.grade.exercise import MARKER, Exercise, NotAnAnswerError, marker, parse


def registry() -> dict[str, Exercise]:
    """Every exercise, by name: the ``EXERCISE`` of each module in this package."""
    found: dict[str, Exercise] = {}
    for info in pkgutil.iter_modules(__path__):
        ex = importlib.import_module(f"{__name__}.{info.name}").EXERCISE
        found[ex.name] = ex
    return found


def get(name: str) -> Exercise:
    known = registry()
    if name not in known:
        raise NotAnAnswerError("exercise", f"unknown exercise {name!r} (known: "
                               f"{', '.join(sorted(known))})")
    return known[name]


def find(path: Path, given: str | None = None) -> tuple[Exercise, ast.Module]:
    """The exercise ``path`` answers: ``given`` (``--exercise``), else its marker line."""
    tree = parse(path)
    name = given or marker(tree)
    if name is None:
        raise NotAnAnswerError("file", f"{path}: not an exercise answer: no module-level "
                               f'{MARKER} = "..." line (known exercises: '
                               f"{', '.join(sorted(registry()))}); or give --exercise NAME")
    return get(name), tree
