"""The layers hold, and the contracts that say so can fail.

``make lint`` runs import-linter with the contracts in setup.cfg. Here the same contracts
run on the tree as it is (they must pass), and on a copy with one forbidden import added
(they must fail, naming it): a contract that cannot fail would prove nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter not installed "
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


def test_the_tree_keeps_every_contract() -> None:
    out = lint(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


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


def test_no_two_test_modules_share_a_name():
    """pytest imports test modules by basename (the folders are not packages): two files of
    one name in different folders stop the whole run at collection."""
    tests = Path(__file__).resolve().parents[1]
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
