"""Regression-testing a hash policy: scenarios × seeds, compared with a stored baseline.

A policy change that makes one seed unlucky proves nothing; one that moves the *mean over the
same seeds* beyond what TCP's own noise moves it is a regression. So a regression run replays
the baseline's scenarios with the baseline's seeds (the flows' 5-tuples come from the seed, so
trial *i* sees the same flows under both policies) and compares each metric's mean with the
baseline's, within a tolerance stated per metric. Every number is from an emulated run: a
trial's result directory (result.json, report.html) is kept next to the comparison.

Every metric here is "lower is better"; a regression is ``now > base + max(abs, rel·base)``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab import kinds
from lab.model import junit
from lab.model.errors import LabError
from lab.model.stats import percentile

BASELINE_SCHEMA = "fabriclab-baseline/1"
DEFAULT_SCENARIOS = ("ecmp-basic", "ecmp-one-pair", "allreduce-ecmp")
DEFAULT_TRIALS = 5


class RegressError(LabError):
    """Bad regression input (a baseline, a scenario list); the message names the field."""


@dataclass(frozen=True)
class Metric:
    """One regression metric: what it measures and how far it may move before it fails."""

    what: str
    rel: float                 # allowed increase, as a fraction of the baseline mean
    abs: float                 # allowed increase, in the metric's own unit

    def limit(self, base: float) -> float:
        return base + max(self.abs, self.rel * abs(base))


#: The metrics by their last name (a phased scenario prefixes the phase: ``hashed.step_p99_s``).
#: Tolerances come from repeated runs of one policy on this 2-core machine: trial-to-trial
#: noise at one seed was ~0.02 in imbalance, ~±50 % in drops, ~10 % in step p99.
METRICS: dict[str, Metric] = {
    "imbalance": Metric("max/mean bytes over the source leaf's uplinks", 0.05, 0.05),
    "collisions": Metric("flows above the fair share on the fullest uplink", 0.0, 0.5),
    "drops": Metric("packets dropped at the fabric's queues", 0.5, 100),
    "goodput_shortfall": Metric("1 - goodput/offered", 0.0, 0.05),
    "stalls": Metric("viewer stalls", 0.25, 1.0),
    "step_p99_s": Metric("99th percentile training step time (s)", 0.15, 0.02),
    "gpu_idle_fraction": Metric("share of a step the GPU waits for the network", 0.0, 0.05),
    # a lossless class drops nothing: any drop is a regression
    "lossless_drops": Metric("packets the lossless (RoCE) class dropped", 0.0, 0.0),
    "pause_time_s": Metric("seconds ports spent paused by PFC, summed over ports", 0.5, 0.5),
    "max_uplink_util": Metric("the busiest uplink's mean utilisation", 0.05, 0.05),
    "retransmits": Metric("packets the senders sent again", 0.5, 100),
    "reordering": Metric("reorderings the receivers saw (TCP: detected; RoCE: packets "
                         "out of sequence or placed out of order)", 0.5, 100),
    "receiver_cpu_pct": Metric("the receiving programs' own CPU, % of a core", 0.25, 5.0),
}


def metric_of(key: str) -> Metric:
    return METRICS[key.rsplit(".", 1)[-1]]


# -- what one emulated result says -------------------------------------------------------------

def extract(result: dict[str, Any]) -> dict[str, float]:
    """The regression metrics of one result, as its kind defines them (``regress_metrics``).
    Keys are ``METRICS`` names, prefixed with a phase for phased kinds."""
    return kinds.get(result["kind"]).regress_metrics(result)


# -- many trials -------------------------------------------------------------------------------

@dataclass
class Stat:
    """One metric over the trials."""

    values: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else 0.0

    @property
    def p50(self) -> float:
        return percentile(self.values, 50)

    @property
    def p95(self) -> float:
        return percentile(self.values, 95)

    @property
    def max(self) -> float:
        return max(self.values, default=0.0)

    def as_dict(self) -> dict[str, Any]:
        return {"values": self.values, "mean": round(self.mean, 6), "p50": round(self.p50, 6),
                "p95": round(self.p95, 6), "max": round(self.max, 6)}


@dataclass(frozen=True)
class Contender:
    """What one column of a regression runs: a policy, and ``sets`` on top of the scenario's
    (a transport, a spray width), under a ``label`` of its own (the policy's name if none)."""

    label: str
    policy: str
    sets: tuple[str, ...] = ()

    @property
    def is_variant(self) -> bool:
        """Named by the user (``--variant``), not simply a policy run as the scenario is."""
        return bool(self.sets) or self.label != self.policy


def parse_variant(text: str) -> Contender:
    """``LABEL=POLICY[,KEY=VALUE...]``: e.g. ``mptcp=hash5,traffic.proto=mptcp``."""
    label, sep, rest = text.partition("=")
    parts = rest.split(",") if sep else []
    if not label.strip() or not parts or not parts[0].strip() or "=" in parts[0]:
        raise RegressError("variant", f"{text!r}: expected LABEL=POLICY[,KEY=VALUE...], "
                           "e.g. mptcp=hash5,traffic.proto=mptcp")
    sets = tuple(p.strip() for p in parts[1:])
    bad = [p for p in sets if "=" not in p]
    if bad:
        raise RegressError("variant", f"{text!r}: {bad[0]!r} is not KEY=VALUE")
    return Contender(label.strip(), parts[0].strip(), sets)


@dataclass
class ScenarioRun:
    """One policy on one scenario over its trials: each trial's directory and metrics."""

    scenario: str
    policy: str
    sets: list[str]
    duration: float | None
    seeds: list[int]
    dirs: list[Path] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    trial_metrics: list[dict[str, float]] = field(default_factory=list)

    @property
    def predicted(self) -> dict[str, float]:
        """The kind's predictions (``Kind.predictions``), averaged over the trials."""
        per = [kinds.get(r["kind"]).predictions(r) for r in self.results]
        keys = sorted({k for p in per for k in p})
        return {k: statistics.fmean(p[k] for p in per if k in p) for k in keys}

    @property
    def stats(self) -> dict[str, Stat]:
        keys = sorted({k for tm in self.trial_metrics for k in tm})
        return {k: Stat([tm[k] for tm in self.trial_metrics if k in tm]) for k in keys}

    @property
    def invalid_trials(self) -> list[int]:
        return [r["seed"] for r in self.results if not r["fidelity"]["valid"]]


Progress = Callable[[str], None]


def run_trials(scenario_name: str, policy: str, seeds: Sequence[int], out_root: Path,
               sets: Sequence[str] = (), duration: float | None = None,
               step: Progress | None = None, log: Progress | None = None,
               label: str | None = None) -> ScenarioRun:
    """Run ``scenario_name`` once per seed under ``policy``; every result kept on disk
    (under ``label``, a variant's, else the policy's)."""
    from lab import run as runmod
    sr = ScenarioRun(scenario_name, policy, list(sets), duration, list(seeds))
    for seed in seeds:
        (plan,) = runmod.make_plans(scenario_name, policy=policy, sets=list(sets),
                                    duration=duration, seed=seed)
        out_dir = out_root / (label or plan.policy_label) / scenario_name / f"seed-{seed}"
        result = runmod.execute(plan, out_dir, log or (lambda _msg: None))
        runmod.write_report_quietly(out_dir, log)
        sr.dirs.append(out_dir)
        sr.results.append(result)
        sr.trial_metrics.append(extract(result))
        if step is not None:
            step(f"{plan.policy_label} {scenario_name} seed {seed}")
    return sr


def validate_inputs(scenarios: Sequence[str], policies_: Sequence[str], sets: Sequence[str],
                    duration: float | None) -> None:
    """Everything checked before the first fabric starts: scenarios, policies, --set, and
    what each kind asks of the machine (e.g. PyTorch for ``library=gloo``)."""
    from lab import run as runmod
    if not scenarios:
        raise RegressError("scenarios", "no scenario to run")
    for name in scenarios:
        for policy in policies_:
            for plan in runmod.make_plans(name, policy=policy, sets=list(sets),
                                          duration=duration, seed=1):
                plan.kind.prepare(plan)


# -- baselines ---------------------------------------------------------------------------------

def make_baseline(runs: Sequence[ScenarioRun], environment: dict[str, Any]) -> dict[str, Any]:
    """A baseline file's content from one policy's runs."""
    policies_ = {r.policy for r in runs}
    if len(policies_) != 1:
        raise RegressError("policy", "a baseline is of one policy; got "
                           f"{', '.join(sorted(policies_))}")
    first = runs[0].results[0]
    return {
        "schema": BASELINE_SCHEMA,
        "policy": first["policy"],
        "policy_spec": runs[0].policy,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "environment": environment,
        "seeds": runs[0].seeds,
        "tolerances": {k: {"rel": m.rel, "abs": m.abs} for k, m in METRICS.items()},
        "scenarios": {r.scenario: {"sets": r.sets, "duration": r.duration,
                                   "metrics": {k: s.as_dict() for k, s in r.stats.items()}}
                      for r in runs},
    }


def load_baseline(path: Path) -> dict[str, Any]:
    """A baseline file, checked: its schema, and the fields a comparison reads."""
    where = f"baseline {path}"
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise RegressError("baseline", f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise RegressError("baseline", f"{path} is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("schema") != BASELINE_SCHEMA:
        got = raw.get("schema") if isinstance(raw, dict) else type(raw).__name__
        raise RegressError("baseline.schema", f"{path} has schema {got!r}, this FabricLab "
                           f"reads {BASELINE_SCHEMA!r} (write a new one with "
                           f"--update-baseline)")
    seeds = raw.get("seeds")
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
        raise RegressError("baseline.seeds", f"{where}: expected a non-empty list of ints")
    scenarios = raw.get("scenarios")
    if not isinstance(scenarios, dict) or not scenarios:
        raise RegressError("baseline.scenarios", f"{where}: expected a mapping of scenarios")
    for name, sc in scenarios.items():
        metrics = sc.get("metrics") if isinstance(sc, dict) else None
        if not isinstance(metrics, dict):
            raise RegressError(f"baseline.scenarios.{name}.metrics", f"{where}: missing")
        for key, stat in metrics.items():
            if key.rsplit(".", 1)[-1] not in METRICS:
                raise RegressError(f"baseline.scenarios.{name}.metrics.{key}",
                                   f"{where}: unknown metric (known: {', '.join(METRICS)})")
            if not isinstance(stat, dict) or not isinstance(stat.get("mean"), int | float):
                raise RegressError(f"baseline.scenarios.{name}.metrics.{key}.mean",
                                   f"{where}: expected a number")
    return raw


@dataclass(frozen=True)
class Row:
    """One metric of one scenario: baseline, now, and the verdict."""

    scenario: str
    metric: str
    base: float
    now: float
    limit: float
    status: str                # ok, REGRESSED, improved, missing

    @property
    def delta(self) -> float:
        return self.now - self.base


def compare(baseline: dict[str, Any], runs: Sequence[ScenarioRun]) -> list[Row]:
    """Each baseline metric against the same scenario's trials now."""
    rows = []
    now_by_scenario = {r.scenario: r.stats for r in runs}
    for name, sc in baseline["scenarios"].items():
        stats = now_by_scenario.get(name)
        if stats is None:
            continue
        for key, stat in sorted(sc["metrics"].items()):
            base = float(stat["mean"])
            tol = baseline.get("tolerances", {}).get(key.rsplit(".", 1)[-1])
            metric = (Metric("", float(tol["rel"]), float(tol["abs"])) if tol
                      else metric_of(key))
            limit = metric.limit(base)
            if key not in stats:
                rows.append(Row(name, key, base, math.nan, limit, "missing"))
                continue
            now = stats[key].mean
            status = ("REGRESSED" if now > limit
                      else "improved" if now < base - (limit - base) else "ok")
            rows.append(Row(name, key, base, now, limit, status))
    return rows


def regressed(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.status in ("REGRESSED", "missing")]


# -- output ------------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    if math.isnan(x):
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3f}"


def render_table(policy: str, base_policy: str, rows: Sequence[Row]) -> str:
    """The comparison as text: which metric moved, by how much, against which limit."""
    head = ("scenario", "metric", f"baseline ({base_policy})", f"now ({policy})", "change",
            "limit", "")
    body = [(r.scenario, r.metric, _fmt(r.base), _fmt(r.now),
             ("-" if math.isnan(r.now) else f"{r.delta:+.3f}"
              + (f" ({r.delta / r.base * 100:+.0f}%)" if r.base else "")),
             _fmt(r.limit), r.status) for r in rows]
    return _grid(head, body)


def _grid(head: Sequence[str], body: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, a rule under the head: the tables' one layout."""
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
             for line in (head, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_stats(runs: Sequence[ScenarioRun]) -> str:
    """Each scenario's metrics over its trials (no baseline to compare with)."""
    lines = []
    for r in runs:
        lines.append(f"{r.scenario} ({len(r.seeds)} trials, seeds {r.seeds[0]}..{r.seeds[-1]})")
        for key, s in r.stats.items():
            lines.append(f"  {key:32s} mean {_fmt(s.mean):>8s}  p95 {_fmt(s.p95):>8s}  "
                         f"max {_fmt(s.max):>8s}")
        if r.invalid_trials:
            lines.append(f"  note: CPU-bound (invalid fidelity) trials: seeds "
                         f"{r.invalid_trials}")
    return "\n".join(lines)


#: The side-by-side table's columns, in this order, where a scenario has them.
SIDE_COLUMNS = ("imbalance", "max_uplink_util", "step_p99_s", "gpu_idle_fraction",
                "goodput_shortfall", "retransmits", "reordering", "receiver_cpu_pct",
                "drops", "lossless_drops", "pause_time_s", "stalls")


def side_by_side(runs: dict[str, list[ScenarioRun]]) -> dict[str, list[dict[str, Any]]]:
    """Per scenario, one row per contender (and phase, for a phased kind): the mean of each
    metric over the trials, and the policy's predicted imbalance beside the measured."""
    out: dict[str, list[dict[str, Any]]] = {}
    for label, scenario_runs in runs.items():
        for r in scenario_runs:
            stats, pred = r.stats, r.predicted
            # ``phase.metric``; a phase's per-group metrics (``phase.group.metric``) stay
            # in the trials' stats, the table has the phase's own
            phases = sorted({k.split(".")[0] for k in stats if k.count(".") == 1}) or [""]
            for ph in phases:
                pre = f"{ph}." if ph else ""
                row: dict[str, Any] = {"contender": label, "phase": ph}
                for col in SIDE_COLUMNS:
                    if pre + col in stats:
                        row[col] = round(stats[pre + col].mean, 4)
                if pre + "imbalance" in pred:
                    row["predicted_imbalance"] = round(pred[pre + "imbalance"], 4)
                out.setdefault(r.scenario, []).append(row)
    return out


def render_side_by_side(table: dict[str, list[dict[str, Any]]]) -> str:
    """The side-by-side rows as text, one block per scenario."""
    blocks = []
    for scenario, rows in table.items():
        cols = [c for c in ("phase", *SIDE_COLUMNS[:1], "predicted_imbalance",
                            *SIDE_COLUMNS[1:]) if any(c in r and r[c] != "" for r in rows)]
        head = ["contender", *cols]
        body = [[str(r["contender"]), *("-" if c not in r else str(r[c]) if c == "phase"
                                        else _fmt(float(r[c])) for c in cols)] for r in rows]
        blocks.append(f"{scenario}\n" + _grid(head, body))
    return "\n\n".join(blocks)


def write_junit(path: Path, suites: dict[str, list[Row]]) -> None:
    """JUnit XML, one testsuite per policy and one testcase per scenario metric."""
    cases: dict[str, list[junit.Case]] = {}
    for policy, rows in suites.items():
        bad = regressed(rows)
        cases[f"regress.{policy}"] = [
            junit.Case(policy, f"{r.scenario}.{r.metric}",
                       f"{r.metric} {r.status}: baseline {_fmt(r.base)}, now {_fmt(r.now)}, "
                       f"limit {_fmt(r.limit)}" if r in bad else None)
            for r in rows]
    junit.write(path, cases)
