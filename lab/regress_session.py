"""One ``fabriclab regress`` invocation: resolve what to run, run it, compare, write.

``lab.regress`` holds the pieces (metrics, trials, baselines, verdicts, output formats); this
module strings them together the way the command line asks, so the CLI stays a parser and a
test can drive a whole regression without one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import regress
from lab.machine import state
from lab.machine.progress import Bar


@dataclass
class Request:
    """What the user asked for; ``None`` means "the baseline's, else the default"."""

    policies: list[str]
    scenarios: list[str] | None = None
    trials: int | None = None
    first_seed: int = 1
    sets: list[str] | None = None
    duration: float | None = None
    baseline: Path | None = None
    update_baseline: bool = False
    junit: Path | None = None
    out: Path | None = None
    #: ``LABEL=POLICY[,KEY=VALUE...]``: a policy with settings of its own, as one more column
    variants: list[str] | None = None


@dataclass
class RegressPlan:
    """A request resolved against its baseline: every input checked, nothing started."""

    contenders: list[regress.Contender]
    scenarios: list[str]
    seeds: list[int]
    per_scenario: dict[str, tuple[list[str], float | None]]    # --set values, duration
    baseline: dict[str, Any] | None
    out: Path


def resolve(req: Request) -> RegressPlan:
    """Fill the request's gaps from the baseline (scenarios, seeds, sets) and validate."""
    contenders = [regress.Contender(p, p) for p in req.policies] + [
        regress.parse_variant(v) for v in req.variants or []]
    labels = [c.label for c in contenders]
    if len(set(labels)) != len(labels):
        raise regress.RegressError("variant", "two columns have one label: "
                                   + ", ".join(sorted({x for x in labels
                                                       if labels.count(x) > 1})))
    if req.update_baseline:
        if req.baseline is None:
            raise regress.RegressError("baseline", "--update-baseline needs --baseline FILE")
        if len(contenders) != 1 or req.variants:
            raise regress.RegressError("policy", "--update-baseline writes one policy's "
                                       "baseline; give exactly one --policy or --policy-file")
    baseline = (regress.load_baseline(req.baseline)
                if req.baseline is not None and not req.update_baseline else None)
    if baseline is not None:
        scenarios = req.scenarios or list(baseline["scenarios"])
        seeds = (list(baseline["seeds"]) if req.trials is None
                 else list(range(req.first_seed, req.first_seed + req.trials)))
    else:
        scenarios = req.scenarios or list(regress.DEFAULT_SCENARIOS)
        trials = regress.DEFAULT_TRIALS if req.trials is None else req.trials
        seeds = list(range(req.first_seed, req.first_seed + trials))
    if not seeds:
        raise regress.RegressError("trials", "at least one trial")
    per_scenario = {}
    for name in scenarios:
        stored = (baseline or {}).get("scenarios", {}).get(name)
        if stored is not None and not req.sets:
            # Compare like with like: the baseline's own --set values and duration.
            sets = list(stored.get("sets") or [])
            duration = stored.get("duration") if req.duration is None else req.duration
        else:
            sets, duration = list(req.sets or []), req.duration
        per_scenario[name] = (sets, duration)
    state.require_root()
    for name, (sets, duration) in per_scenario.items():
        for c in contenders:
            regress.validate_inputs([name], [c.policy], [*sets, *c.sets], duration)
    out = req.out or Path("results") / f"regress-{time.strftime('%Y%m%d-%H%M%S')}"
    return RegressPlan(contenders, scenarios, seeds, per_scenario, baseline, out)


def execute(req: Request, say: Callable[[str], None] = print) -> int:
    """Run the request; 1 if any policy regressed against the baseline, else 0."""
    plan = resolve(req)
    plan.out.mkdir(parents=True, exist_ok=True)
    bar = Bar(len(plan.contenders) * len(plan.scenarios) * len(plan.seeds), "regress")
    all_runs: dict[regress.Contender, list[regress.ScenarioRun]] = {}
    with open(plan.out / "regress.log", "a") as log:
        def to_log(msg: str) -> None:
            log.write(msg + "\n")
            log.flush()
        for c in plan.contenders:
            for name in plan.scenarios:
                sets, duration = plan.per_scenario[name]
                bar.show(f"{c.label} {name} ...")
                all_runs.setdefault(c, []).append(regress.run_trials(
                    name, c.policy, plan.seeds, plan.out, [*sets, *c.sets], duration,
                    step=bar.step, log=to_log, label=c.label if c.is_variant else None))
    bar.close()
    summary: dict[str, Any] = {"seeds": plan.seeds, "scenarios": plan.scenarios,
                               "policies": {}}
    suites: dict[str, list[regress.Row]] = {}
    failed = False
    labels = {}
    for c, runs in all_runs.items():
        label = c.label if c.is_variant else runs[0].results[0]["policy"]
        labels[label] = runs
        say(f"\n== {label}: {len(plan.scenarios)} scenarios x {len(plan.seeds)} trials")
        say(regress.render_stats(runs))
        entry: dict[str, Any] = {"stats": {r.scenario: {k: s.as_dict() for k, s in
                                                        r.stats.items()} for r in runs}}
        if plan.baseline is not None:
            rows = regress.compare(plan.baseline, runs)
            suites[label] = rows
            say("")
            say(regress.render_table(label, plan.baseline["policy"], rows))
            bad = regress.regressed(rows)
            failed = failed or bool(bad)
            verdict = (f"REGRESSION: {len(bad)} metric(s) beyond tolerance" if bad
                       else "no regression")
            say(f"{label} vs baseline {plan.baseline['policy']}: {verdict}")
            entry["comparison"] = [r.__dict__ | {"delta": r.delta} for r in rows]
        summary["policies"][label] = entry
        if req.update_baseline and req.baseline is not None:
            env = runs[0].results[0]["environment"]
            data = regress.make_baseline(runs, env)
            req.baseline.write_text(json.dumps(data, indent=1) + "\n")
            say(f"baseline written: {req.baseline}")
    table = regress.side_by_side(labels)
    if len(labels) > 1 or any(r["phase"] for rows in table.values() for r in rows):
        summary["side_by_side"] = table
        say("\n== side by side (means over the trials)")
        say(regress.render_side_by_side(table))
    (plan.out / "regress.json").write_text(json.dumps(summary, indent=1, default=str))
    if req.junit is not None:
        regress.write_junit(req.junit, suites)
    say(f"results: {plan.out}")
    return 1 if failed else 0
