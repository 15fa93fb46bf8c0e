"""The layers hold, the contracts that say so can fail, and ARCHITECTURE.md says what they say.

``make lint`` runs import-linter with the contracts in setup.cfg. Here the same contracts
run on the tree as it is (they must pass), and on a copy with one forbidden import or one
circle hidden in a function added (they must fail, naming it): a contract that cannot fail
would prove nothing. ARCHITECTURE.md's layer table and its claims about imports are read and
compared with setup.cfg and with the code's imports, on the real text and on a text with one
planted mismatch.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")
ARCHITECTURE = REPO / "ARCHITECTURE.md"
SETUP_CFG = REPO / "setup.cfg"

needs_lint = pytest.mark.skipif(not LINT.exists(), reason="import-linter not installed "
                                "(run: make setup)")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--config", str(root / "setup.cfg"), "--no-cache"],
                          cwd=root, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    for name in ("lab", "controllers"):
        shutil.copytree(REPO / name, root / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.sh", "*.c"))
    shutil.copy(REPO / "setup.cfg", root / "setup.cfg")
    return root


@needs_lint
def test_the_tree_keeps_every_contract() -> None:
    out = lint(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@needs_lint
@pytest.mark.parametrize(("module", "imports", "contract"), [
    ("lab/model/_upward.py", "from lab import run", "lab's layers, top to bottom"),
    ("lab/net/_upward.py", "from lab.measure import telemetry", "lab's layers, top to bottom"),
    ("lab/agents/_upward.py", "from lab.model import errors",
     "programs in hosts import nothing of the lab outside lab.agents"),
    ("controllers/_upward.py", "import lab.model.flows", "the controller never imports the lab"),
    ("lab/kinds/ecmp/_upward.py", "from lab.kinds.streaming import PHASES",
     "scenario kinds are independent of each other"),
])
def test_a_forbidden_import_breaks_its_contract(copy: Path, module: str, imports: str,
                                                contract: str) -> None:
    path = copy / module
    path.write_text(f"{imports}\n")
    try:
        out = lint(copy)
    finally:
        path.unlink()
    assert out.returncode == 1, out.stdout + out.stderr
    broken = out.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken and module[:-3].replace("/", ".") in broken, out.stdout


ACYCLIC = "no package's modules import each other in a circle"


@needs_lint
@pytest.mark.parametrize(("module", "imports", "package"), [
    # The circle lab/net had: frr asked fabric for planned_names inside a method, and fabric
    # reaches frr through the topologies' registry and the edge.
    ("lab/net/frr.py", "from lab.net.fabric import planned_names", "lab.net"),
    # The circle lab/grade had: the exercise module looked up the exercises inside a function.
    ("lab/grade/exercise.py", "from lab.grade import exercises", "lab.grade"),
    ("controllers/marking.py", "from controllers import ecn", "controllers"),
    ("controllers/policies/base.py", "from controllers.policies import hash5",
     "controllers.policies"),
])
def test_a_circle_hidden_in_a_function_breaks_the_build(copy: Path, module: str, imports: str,
                                                        package: str) -> None:
    """Each planted import sits inside a function, where it runs only when called, so the
    module imports fine and the layers (which look only between packages) stay kept; the
    circle it closes with the module's siblings must still break ``make lint``."""
    path = copy / module
    original = path.read_text()
    path.write_text(f"{original}\n\ndef _planted() -> None:\n    {imports}  # noqa\n")
    try:
        out = lint(copy)
    finally:
        path.write_text(original)
    assert out.returncode == 1, out.stdout + out.stderr
    broken = out.stdout.split("Broken contracts", 1)[-1]
    assert ACYCLIC in broken and f"No cycles are allowed in {package}." in broken, out.stdout
    assert "lab's layers, top to bottom KEPT" in out.stdout, out.stdout


# -- ARCHITECTURE.md against setup.cfg and the code ------------------------------------------

def table_rows(markdown: str) -> list[tuple[frozenset[str], str]]:
    """The layer table's rows of lab/, top to bottom: (the layers a row names, its "may
    import" cell). A row's first cell names its layers as paths (`lab/run.py`, `lab/kinds/`);
    rows outside lab/ (the scenarios' data) are not layers."""
    section = markdown.split("## The layers, top to bottom", 1)[1]
    rows = []
    for line in section.split("\n\n", 2)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = frozenset(re.sub(r"(/|\.py)$", "", path.removeprefix("lab/"))
                          for path in re.findall(r"`([^`]+)`", cells[0])
                          if path.startswith("lab/"))
        if names:
            rows.append((names, cells[-1]))
    return rows


def contracts(cfg_text: str) -> dict[str, configparser.SectionProxy]:
    parser = configparser.ConfigParser()
    parser.read_string(cfg_text)
    return {name.split(":", 2)[2]: parser[name] for name in parser.sections()
            if name.startswith("importlinter:contract:")}


def lines(value: str) -> list[str]:
    return [v.strip() for v in value.splitlines() if v.strip()]


def table_problems(markdown: str, cfg_text: str) -> list[str]:
    """Where ARCHITECTURE.md's layer table and setup.cfg's contracts disagree (none: agree).

    The rows are the layers contract's layers, in its order; a row's "may import" names the
    layer right below it (`X` and below) or says "everything below", the last says "nothing
    of the lab"; a row of layers the contract keeps independent (``a | b``) says "never each
    other"; and the programs in hosts are forbidden every other layer and the controller."""
    found = contracts(cfg_text)
    layers = next(c for c in found.values()
                  if c["type"] == "layers" and lines(c["containers"]) == ["lab"])
    cfg_rows = [(frozenset(re.split(r"\s*[|:]\s*", ln)), "|" in ln)
                for ln in lines(layers["layers"])]
    rows = table_rows(markdown)
    problems = []
    if [names for names, _ in rows] != [names for names, _ in cfg_rows]:
        problems.append(f"table rows {[sorted(n) for n, _ in rows]} are not setup.cfg's layers "
                        f"{[sorted(n) for n, _ in cfg_rows]}")
    for i, (names, cell) in enumerate(rows):
        row = ", ".join(sorted(names))
        if i == len(rows) - 1:
            if "nothing of the lab" not in cell:
                problems.append(f"{row}: the bottom layer's cell must say 'nothing of the lab'")
            continue
        below = re.search(r"`(\w+)` and below", cell)
        if below and below.group(1) not in rows[i + 1][0]:
            problems.append(f"{row}: says `{below.group(1)}` and below, but the layer below it "
                            f"is {', '.join(sorted(rows[i + 1][0]))}")
        elif not below and "everything below" not in cell:
            problems.append(f"{row}: says neither `X` and below nor everything below")
        independent = dict(cfg_rows).get(names, False)
        if independent and "never each other" not in cell:
            problems.append(f"{row}: setup.cfg keeps them independent; the table must say "
                            "'never each other'")
    agents = next(c for c in found.values()
                  if c["type"] == "forbidden" and lines(c["source_modules"]) == ["lab.agents"])
    forbidden = set(lines(agents["forbidden_modules"]))
    wanted = {f"lab.{n}" for names, _ in rows for n in names if n != "agents"} | {"controllers"}
    if wanted - forbidden:
        problems.append(f"the agents contract leaves out {', '.join(sorted(wanted - forbidden))}")
    return problems


def test_the_layer_table_says_what_setup_cfg_says() -> None:
    assert table_problems(ARCHITECTURE.read_text(), SETUP_CFG.read_text()) == []


@pytest.mark.parametrize(("file", "old", "new", "problem"), [
    # The table's old mistake: run imports the report too, which sits between it and kinds.
    ("md", "| `report` and below |", "| `kinds` and below |",
     "run: says `kinds` and below, but the layer below it is report"),
    ("md", "`lab/regress_session.py`, `lab/grade/`", "`lab/regress_session.py`",
     "are not setup.cfg's layers"),
    ("md", "`regress` and below; never each other", "`regress` and below",
     "must say 'never each other'"),
    # setup.cfg's old mistake: the programs in hosts were not forbidden lab.grade.
    ("cfg", "    lab.grade\n", "", "the agents contract leaves out lab.grade"),
    ("cfg", "    run\n    report\n", "    report\n    run\n", "are not setup.cfg's layers"),
])
def test_a_planted_mismatch_is_found(file: str, old: str, new: str, problem: str) -> None:
    md, cfg = ARCHITECTURE.read_text(), SETUP_CFG.read_text()
    if file == "md":
        assert md.count(old) == 1
        md = md.replace(old, new)
    else:
        assert cfg.count(old) == 1
        cfg = cfg.replace(old, new)
    problems = table_problems(md, cfg)
    assert any(problem in p for p in problems), problems


@pytest.fixture(scope="module")
def graph() -> Any:
    """The code's imports, as import-linter reads them (grimp: imports inside functions
    included)."""
    grimp = pytest.importorskip("grimp", reason="import-linter not installed (run: make setup)")
    return grimp.build_graph("lab", "controllers", cache_dir=None)


def direct_imports(graph: Any, importers: str, imported: str) -> set[str]:
    """The modules under ``imported`` that a module under ``importers`` imports itself."""
    return {m for importer in graph.find_descendants(importers) | {importers}
            for m in graph.find_modules_directly_imported_by(importer)
            if m == imported or m.startswith(imported + ".")}


def controllers_claimed(markdown: str) -> set[str]:
    """The modules of controllers/ the text says the lab imports (its controllers bullet)."""
    bullet = markdown.split("\n- `controllers/`:", 1)[1].split("\n- ", 1)[0]
    return set(re.findall(r"`(\w+)`", bullet.split("the lab imports", 1)[1]))


def test_the_lab_imports_of_controllers_what_the_text_says(graph: Any) -> None:
    imported = {m.split(".")[1] for m in direct_imports(graph, "lab", "controllers")}
    assert controllers_claimed(ARCHITECTURE.read_text()) == imported
    # The text before: policies and marking only. The comparison sees what it leaves out.
    old = ARCHITECTURE.read_text().replace("`routing` (", "routing (")
    assert controllers_claimed(old) != imported


def test_model_imports_of_the_agents_only_the_percentile(graph: Any) -> None:
    assert direct_imports(graph, "lab.model", "lab.agents") <= {"lab.agents.common"}


def test_no_two_test_modules_share_a_name():
    """pytest imports test modules by basename (the folders are not packages): two files of
    one name in different folders stop the whole run at collection."""
    tests = Path(__file__).resolve().parents[1]
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
