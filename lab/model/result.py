"""result.json, schema 1: what every run writes, one check that holds results to it, and
the one way to read a result back (report, compare, diagnose, regress).

Fields are only ever added; none may be removed or change meaning. ``validate`` is what the
tests and ``fabriclab`` itself use to hold every result to that contract.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.model.errors import LabError

SCHEMA_VERSION = 1

#: Before the envelope was stamped in one place, the ecmp kind's results were the only ones
#: written without ``kind``: a schema-1 result without it is an ecmp result.
KIND_BEFORE_ENVELOPE = "ecmp"

TOP_KEYS = ("schema", "scenario", "policy", "seed", "duration_s", "environment", "topology",
            "links", "flows", "metrics", "fidelity")
ENV_KEYS = ("datapath", "ecn", "delay", "controller", "kernel")
LINK_KEYS = ("node", "port", "peer", "bw_mbps", "tx_bytes", "tx_packets", "drops", "util_mean",
             "util_max", "series", "ce_marked")
#: ``fidelity.expected`` (optional: runs before it existed lack it): the estimate made before
#: the run started (``lab.model.capacity.Expectation``).
EXPECTED_KEYS = ("verdict", "load", "flow_hops", "pkt_hops_per_s", "fields", "advice", "source")
EXPECTED_VERDICTS = ("valid", "invalid", "not estimated")
#: The fidelity numbers that are percentages of a core (the lab's own CPU may exceed 100: it
#: is summed over cores); null where a run could not measure them.
FIDELITY_PERCENTS = ("cpu_idle_min_pct", "lab_cpu_pct")
FLOW_KEYS = ("id", "kind", "src", "dst", "proto", "sport", "dport", "path", "bytes",
             "goodput_bps", "loss", "retransmits")


class ResultError(LabError):
    """A run directory a result cannot be read from: no result.json, or not a result."""


def load_result(run_dir: str | Path) -> dict[str, Any]:
    """``run_dir``/result.json (``run_dir`` may also be the file itself), or a ResultError
    that names the file and what is wrong.

    A result is often asked for in the wrong directory (``results/`` instead of one run in
    it) or from a run that was killed while writing; the message says which.
    """
    run_dir = Path(run_dir)
    if run_dir.name == "result.json" and run_dir.is_file():
        run_dir = run_dir.parent
    path = run_dir / "result.json"
    if not run_dir.is_dir():
        raise ResultError(str(run_dir), "no such run directory")
    if not path.is_file():
        runs = sorted(p.parent.name for p in run_dir.glob("*/result.json"))
        hint = (f"; it holds runs, pick one: {', '.join(runs[:5])}" if runs
                else "; a finished `fabriclab run` writes it in its output directory")
        raise ResultError(str(path), f"not found{hint}")
    try:
        result = json.loads(path.read_bytes())
    except OSError as e:
        raise ResultError(str(path), f"cannot be read: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise ResultError(str(path), f"not valid JSON (line {e.lineno}, column {e.colno}: "
                                     f"{e.msg}); was the run stopped while writing it?") from e
    except ValueError as e:            # bytes that are not UTF-8/16/32 text
        raise ResultError(str(path), f"not valid JSON ({e})") from e
    if not isinstance(result, dict):
        raise ResultError(str(path), f"not a FabricLab result: the top level is a "
                                     f"{type(result).__name__}, not an object")
    return upgrade(result)


def upgrade(result: dict[str, Any]) -> dict[str, Any]:
    """A result as this lab writes it: one written before the envelope had ``kind`` gets
    the kind it was (``KIND_BEFORE_ENVELOPE``). The one place old results are read into
    new ones, so no reader has to guess a kind."""
    if "kind" not in result and result.get("schema") == SCHEMA_VERSION:
        result["kind"] = KIND_BEFORE_ENVELOPE
    return result


def _missing(obj: dict[str, Any], keys: tuple[str, ...], where: str) -> list[str]:
    return [f"{where}.{key} missing" for key in keys if key not in obj]


def validate(result: dict[str, Any]) -> list[str]:
    """Problems with ``result`` against schema 1 (empty list: valid)."""
    problems = []
    for key in TOP_KEYS:
        if key not in result:
            problems.append(f"missing top-level key {key!r}")
    if result.get("schema") != SCHEMA_VERSION:
        problems.append(f"schema is {result.get('schema')!r}, expected {SCHEMA_VERSION}")
    problems += _missing(result.get("environment", {}), ENV_KEYS, "environment")
    topo = result.get("topology", {})
    for key in ("switches", "hosts", "links"):
        if not isinstance(topo.get(key), list):
            problems.append(f"topology.{key} missing or not a list")
    for i, link in enumerate(result.get("links", [])):
        problems += _missing(link, LINK_KEYS, f"links[{i}]")
        series = link.get("series", {})
        if len(series.get("t", [])) != len(series.get("tx_bps", [])):
            problems.append(f"links[{i}].series t and tx_bps differ in length")
        if "queue_bytes" in series and len(series["queue_bytes"]) != len(series.get("t", [])):
            problems.append(f"links[{i}].series t and queue_bytes differ in length")
    for i, flow in enumerate(result.get("flows", [])):
        problems += _missing(flow, FLOW_KEYS, f"flows[{i}]")
    problems += _missing(result.get("fidelity", {}), ("cpu_idle_min_pct", "valid", "notes"),
                         "fidelity")
    for key in FIDELITY_PERCENTS:
        v = result.get("fidelity", {}).get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            problems.append(f"fidelity.{key} is {v!r}, expected a percentage (>= 0) or null")
    expected = result.get("fidelity", {}).get("expected")
    if expected is not None:
        problems += _missing(expected, EXPECTED_KEYS, "fidelity.expected")
        if expected.get("verdict") not in EXPECTED_VERDICTS:
            problems.append(f"fidelity.expected.verdict is {expected.get('verdict')!r}, "
                            f"expected one of {', '.join(EXPECTED_VERDICTS)}")
    if not isinstance(result.get("metrics"), dict):
        problems.append("metrics missing or not a mapping")
    return problems
