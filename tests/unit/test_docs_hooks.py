"""The documentation site's generated parts say what the code says, and fail loudly.

The hooks in docs/_hooks/ fill the command reference from the CLI's parser, result.json's
keys from ``lab.model.result``, the benchmark tables from ``bench/out/`` and the lessons'
links; each is checked here against its source, so a page cannot quietly fall behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from lab.cli import build_parser
from lab.model import result

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "fabriclab_docs", REPO / "docs" / "_hooks" / "fabriclab_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_and_option_is_on_the_commands_page(hooks: ModuleType) -> None:
    page = hooks.commands()
    names = [name for name, _, _ in hooks._subcommands(build_parser())]
    assert {"run", "regress", "vm", "vm run", "grade", "doctor"} <= set(names)
    for name in names:
        assert f"## fabriclab {name}\n" in page
    run = page.split("## fabriclab run\n")[1].split("\n## ")[0]
    for option in ("--policy", "--set", "--duration", "--seed", "--out", "--live", "--dry-run"):
        assert f"`{option}" in run
    assert "results/&lt;scenario&gt;-&lt;time&gt;/" in run    # not swallowed as a tag


def test_result_keys_are_the_ones_validate_requires(hooks: ModuleType) -> None:
    """Each tuple of keys ``lab.model.result`` holds results to is one row of the page."""
    page = hooks.result_keys()
    assert f"Schema version: **{result.SCHEMA_VERSION}**" in page
    tuples = [v for k, v in vars(result).items() if k.isupper() and isinstance(v, tuple)]
    assert result.TOP_KEYS in tuples and len(tuples) >= 4
    rows = [line for line in page.splitlines() if line.startswith("| ") and "`" in line]
    for keys in tuples:
        assert any(all(f"`{key}`" in row for key in keys) for row in rows), keys


def test_benchmark_tables_are_dated_and_name_the_machine(hooks: ModuleType,
                                                         tmp_path: Path) -> None:
    assert "No benchmark output" in hooks.benchmarks(tmp_path / "missing")
    (tmp_path / "bringup.json").write_text(json.dumps(
        {"leafspine": {"bringup_s": [1.5, 1.6, 1.7]}, "fattree_k4": {"teardown_s": 1.63},
         "rows": [{"policy": "hash5", "flows_s": 1263000.0},
                  {"policy": "flowlet", "flows_s": 396633.4, "verdict": "-"}]}))
    os.utime(tmp_path / "bringup.json", (1764900000, 1764900000))   # 2025-12-05 02:00 UTC
    page = hooks.benchmarks(tmp_path)
    assert "### bringup.json" in page
    assert "Written 2025-12-05 02:00 UTC on " in page
    assert f"{os.cpu_count()} cores" in page
    assert "| `leafspine.bringup_s` | 1.5, 1.6, 1.7 |" in page
    assert "| `fattree_k4.teardown_s` | 1.63 |" in page
    assert "| `policy` | `flows_s` | `verdict` |" in page      # records: a column per key
    assert "| hash5 | 1263000 |  |" in page and "| flowlet | 3.966e+05 | - |" in page


def test_lesson_links_point_where_the_files_land_in_the_site(hooks: ModuleType) -> None:
    extra: dict[str, str] = {}
    text = ("[skeleton](exercises/congested_uplink.py) [arch](../../ARCHITECTURE.md) "
            "[web](https://example.org/x) [gone](exercises/no_such_file.py)")
    out = hooks.rewrite_links(text, "scenarios/ecmp-basic/README.md", extra)
    assert "[skeleton](exercises/congested_uplink.py)" in out
    assert "[arch](../../architecture.md)" in out
    assert "(https://example.org/x)" in out
    assert "[gone](exercises/no_such_file.py)" in out     # left for --strict to report
    assert extra == {"scenarios/ecmp-basic/exercises/congested_uplink.py":
                     "scenarios/ecmp-basic/exercises/congested_uplink.py"}
    assert hooks.rewrite_links("![p](docs/architecture.svg)", "ARCHITECTURE.md", {}) \
        == "![p](architecture.svg)"
    readme = hooks.rewrite_links("[i](docs/install.md#the-documentation) "
                                 "[l](scenarios/incast-ecn/README.md)", "README.md", {})
    assert readme == "[i](install.md#the-documentation) [l](scenarios/incast-ecn/README.md)"


def test_every_scenario_is_in_the_nav_and_the_table(hooks: ModuleType) -> None:
    folders = sorted(p.parent.name for p in REPO.glob("scenarios/*/scenario.yaml"))
    table = hooks.scenarios()
    nav = (REPO / "mkdocs.yml").read_text()
    for name in folders:
        assert f"[{name}](scenarios/{name}/README.md)" in table
        assert re.search(rf"^\s+- {re.escape(name)}: scenarios/{name}/README\.md$", nav, re.M)


def test_an_unknown_marker_fails_the_build(hooks: ModuleType) -> None:
    page = SimpleNamespace(file=SimpleNamespace(src_uri="x.md"))
    with pytest.raises(hooks.PluginError, match="unknown generated section 'nope'"):
        hooks.on_page_markdown("<!-- fabriclab:nope -->", page, None, None)
    filled = hooks.on_page_markdown("a\n<!-- fabriclab:scenarios -->\n", page, None, None)
    assert "| scenario | kind |" in filled
