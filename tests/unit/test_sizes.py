"""No module over 600 lines and no function over 80, anywhere in the tree (tests included).

A reader takes in a function whole and a module in one sitting; past these sizes they are
split instead (a run class per phase, a drawing in parts, a test's bench in a module of its
own). Counted with ``ast``: a function's lines run from its ``def`` (decorators not counted)
to its last statement, nested functions inside it included.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

#: Files that may still break a limit, with why. Meant to stay empty: an entry is a debt
#: with a name on it, to be split and then removed from here.
ALLOWED: dict[str, str] = {}


def python_files(root: Path) -> list[Path]:
    """The tree's Python files as git sees them (tracked, and untracked but not ignored);
    every .py file outside hidden folders where the tree is not a git checkout."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                          "--", "*.py"], cwd=root, capture_output=True, check=False)
    if out.returncode == 0:
        return sorted(root / n for n in out.stdout.decode().split("\0")
                      if n and (root / n).is_file())
    return sorted(p for p in root.rglob("*.py")
                  if not any(part.startswith(".") for part in p.relative_to(root).parts))


def oversized(source: str, name: str) -> list[str]:
    """Each limit ``source`` breaks, one line each: ``name: N lines`` for the module,
    ``name:LINE function(): N lines`` for a function."""
    problems = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        problems.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                problems.append(f"{name}:{node.lineno} {node.name}(): {length} lines "
                                f"(at most {MAX_FUNCTION_LINES})")
    return problems


def test_no_module_or_function_is_over_its_limit() -> None:
    problems = []
    for path in python_files(REPO):
        rel = str(path.relative_to(REPO))
        if rel not in ALLOWED:
            problems += oversized(path.read_text(encoding="utf-8"), rel)
    assert not problems, "split these:\n" + "\n".join(problems)


def test_every_allowed_file_still_needs_it() -> None:
    """An entry whose file now keeps both limits is stale: remove it."""
    stale = [rel for rel in ALLOWED
             if not (REPO / rel).exists()
             or not oversized((REPO / rel).read_text(encoding="utf-8"), rel)]
    assert not stale, f"remove from ALLOWED: {stale}"


def test_the_check_sees_a_long_function_and_a_long_module() -> None:
    """The check can fail: a function one line over, a module one line over."""
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    long_function = f"def f():\n{body}"
    assert oversized(long_function, "m.py") == []
    assert oversized(long_function + "    return 0\n", "m.py") == [
        f"m.py:1 f(): {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})"]
    nested = "class C:\n    " + (long_function + "    return 0\n").replace("\n", "\n    ")
    assert [p.split(" ", 1)[1] for p in oversized(nested, "m.py")] == [
        f"f(): {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})"]
    module = "x = 0\n" * (MAX_MODULE_LINES + 1)
    assert oversized(module, "m.py") == [
        f"m.py: {MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})"]
    assert oversized("x = 0\n" * MAX_MODULE_LINES, "m.py") == []
