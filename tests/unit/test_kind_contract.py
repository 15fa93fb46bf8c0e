"""The kind contract (``lab.kinds.base.Kind``) and the one envelope every result gets.

A kind is a typed value, checked when its façade builds it: one that misses a required
hook never gets as far as a run. Every result's common fields are stamped by
``lab.run.stamp`` from the plan, whatever the kind returned, so no reader has to guess
one (``kind`` above all).
"""

from __future__ import annotations

import importlib
import json
import textwrap
from pathlib import Path

import pytest

from lab import kinds, run
from lab.kinds.base import ENVELOPE_KEYS, Kind
from lab.machine import environment
from lab.model.errors import MachineError
from lab.model.result import load_result, validate
from lab.report import write_report

BROKEN_KIND = '''
from lab.kinds.base import Kind


def flows(topo_desc, params, rng):
    return []


def on_fabric(plan, fabric, progress, prepared):
    return {}


def regress_metrics(result):
    return {}


KIND = Kind(name="broken", schema={}, plan=flows, run=on_fabric,
            regress_metrics=regress_metrics)
'''


def test_a_kind_missing_a_required_hook_is_refused_at_import(tmp_path, monkeypatch):
    (tmp_path / "broken_kind").mkdir()
    (tmp_path / "broken_kind" / "__init__.py").write_text(textwrap.dedent(BROKEN_KIND))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError) as err:
        importlib.import_module("broken_kind")
    message = str(err.value)
    assert "summary_rows" in message and "\n" not in message, message


def test_every_kind_is_a_kind_with_every_hook_callable():
    for name in kinds.KINDS:
        kind = kinds.get(name)
        assert isinstance(kind, Kind) and kind.name == name
        for hook in ("plan", "run", "summary_rows", "regress_metrics", "topology_defaults",
                     "prepare", "keep_logs", "run_plots", "section_plots"):
            assert callable(getattr(kind, hook)), (name, hook)
    # The defaults do nothing: a kind without its own plots gets none.
    assert kinds.get("ecmp").run_plots({}, []) == []
    assert kinds.get("ecmp").topology_defaults({}) == {}
    # A kind's own topology needs come from its hook (the streaming edge's BFD).
    assert kinds.get("streaming").topology_defaults({"phases": "incident"}) == {"bfd": False}


def _plan(name: str = "ecmp-basic") -> run.Plan:
    given = run.check_input(name)
    env = environment.Environment(
        kernel="6.1", datapath="user", userspace_tso=True, netem=False, red=False,
        ecn="none", delay="none", congestion_controls=["cubic", "reno"], dctcp=False,
        controller="os-ken 2.0", notes=["no netem: links have no delay"])
    return run.Plan(given.scenario, given.kind, given.params, "hash5", given.topo_desc,
                    given.flows, env, "os-ken")


def _part() -> dict:
    return {"duration_s": 1.0, "links": [], "flows": [], "metrics": {},
            "fidelity": {"cpu_idle_min_pct": 60.0, "valid": True, "notes": ["the kind's"]}}


def test_the_envelope_is_stamped_from_the_plan_around_the_kinds_part():
    plan = _plan()
    result = run.stamp(plan, _part(), {"wall_s": 1.5})
    assert set(ENVELOPE_KEYS) - {"policy_file"} <= set(result)
    assert result["kind"] == "ecmp" and result["scenario"] == "ecmp-basic"
    assert result["policy"] == "hash5" and result["seed"] == 1
    assert result["topology"] is plan.topo_desc and result["params"] is plan.params
    assert result["environment"]["controller"] == "os-ken 2.0"
    assert result["timings"] == {"wall_s": 1.5} and result["finished"].endswith("Z")
    # The environment's notes come first, then the kind's own.
    assert result["fidelity"]["notes"] == ["no netem: links have no delay", "the kind's"]
    assert validate(result) == []


def test_a_part_carrying_an_envelope_field_is_refused():
    with pytest.raises(MachineError) as err:
        run.stamp(_plan(), {**_part(), "kind": "other", "scenario": "x"}, {})
    assert err.value.field == "result"
    assert "kind, scenario" in err.value.message


def test_a_result_from_before_the_envelope_is_read_as_the_ecmp_result_it_was(tmp_path: Path):
    old = {**_part(), "schema": 1, "scenario": "ecmp-basic", "policy": "hash5", "seed": 1,
           "environment": {"datapath": "user"}}
    (tmp_path / "result.json").write_text(json.dumps(old))
    assert load_result(tmp_path)["kind"] == "ecmp"
    write_report(tmp_path)
    assert "kind ecmp" in (tmp_path / "report.html").read_text()
    # A result that says its kind keeps it.
    (tmp_path / "result.json").write_text(json.dumps({**old, "kind": "streaming"}))
    assert load_result(tmp_path)["kind"] == "streaming"


def test_no_private_name_crosses_a_module_in_the_kinds_report_run_and_regress():
    """What one module keeps to itself (a ``_`` name) is not another's to import: shared
    helpers are public where they live (``lab.report.html``, the kinds' own modules)."""
    import ast

    root = Path(__file__).resolve().parents[2]
    files = [*(root / "lab" / "kinds").rglob("*.py"), *(root / "lab" / "report").rglob("*.py"),
             root / "lab" / "run.py", *(root / "lab").glob("regress*.py")]
    crossing = [f"{f.relative_to(root)}:{node.lineno} {alias.name}"
                for f in files for node in ast.walk(ast.parse(f.read_text()))
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lab")
                for alias in node.names if alias.name.startswith("_")]
    assert crossing == []
