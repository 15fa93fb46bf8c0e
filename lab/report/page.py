"""One run's report.html: self-contained, the plots embedded as PNG ``data:`` URIs.

The HTML it is made of (escaping, tables, figures, the page frame) is ``lab.report.html``,
shared with ``lab.report.compare``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lab.model.result import load_result
from lab.plotting.plots import Plot, Skipped
from lab.plotting.sections import Section, dict_of, kind_of, link_labels, num, sections
from lab.report.draw import make_plots
from lab.report.html import Raw, env_rows, escape, figure, heading, kv_table, page, run_date, table
from lab.report.values import flatten, format_value

PLOTS_DIR = "plots"
REPORT_NAME = "report.html"


def _fidelity_html(result: dict[str, Any]) -> str:
    fid = dict_of(result.get("fidelity"))
    valid = fid.get("valid")
    verdict = ("<p class='ok'>valid: the emulator kept up, the numbers describe the "
               "network</p>" if valid else
               "<p class='bad'>NOT valid (the notes say why): the numbers describe the "
               "emulator, not the network</p>" if valid is False else
               "<p class='muted'>no fidelity verdict in this result</p>")
    notes = fid.get("notes") or []
    note_html = "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>" if notes else ""
    rows = [(k, v) for k, v in flatten({k: v for k, v in fid.items()
                                        if k not in ("valid", "notes")})]
    return verdict + note_html + kv_table(rows)


def _metrics_html(result: dict[str, Any]) -> str:
    """Top-level metrics as field/value; per-phase metrics as one table, phases as columns."""
    metrics = dict_of(result.get("metrics"))
    phases = dict_of(metrics.get("phases"))
    first = dict_of(next(iter(phases.values()), {}))
    top = flatten({k: v for k, v in metrics.items()
                   if k != "phases" and first.get(k, object()) != v})
    parts = []
    if phases:
        names = list(phases)
        # Two levels: deeper per-phase detail (a phase's config, its predictions) is one
        # cell, not a row per key that only that phase has.
        flat = {n: dict(flatten(dict_of(phases[n]), depth=1)) for n in names}
        keys = list(dict.fromkeys(k for n in names for k in flat[n]))
        parts.append("<h3>Per phase</h3>" + table(
            ["metric", *names],
            ([k] + [format_value(k, flat[n].get(k)) if k in flat[n] else "" for n in names]
             for k in keys), numeric=range(1, len(names) + 1)))
    if top:
        parts.append(("<h3>Whole run</h3>" if phases else "")
                     + table(("metric", "value"), ((k, format_value(k, v)) for k, v in top),
                              numeric=(1,)))
    return "".join(parts) or "<p class='muted'>no metrics</p>"


def _links_table(links: list[dict[str, Any]]) -> str:
    if not links:
        return "<p class='muted'>no links</p>"
    rows = []
    for ln, label in zip(links, link_labels(links), strict=True):
        drops = int(num(ln.get("drops")) or 0)
        rows.append((label, ln.get("role", ""), format_value("", ln.get("bw_mbps")),
                     f"{100 * (num(ln.get('util_mean')) or 0):.1f}",
                     f"{100 * (num(ln.get('util_max')) or 0):.1f}",
                     Raw(f"<span class='bad'>{drops:,}</span>") if drops else "0",
                     f"{int(num(ln.get('ce_marked')) or 0):,}",
                     f"{(num(ln.get('tx_bytes')) or 0) / 1e6:.2f}"))
    return table(("link", "role", "rate (Mbit/s)", "util mean (%)", "util max (%)", "drops",
                   "CE marked", "sent (MB)"), rows, numeric=range(2, 8))


def _flows_table(flows: list[dict[str, Any]]) -> str:
    if not flows:
        return "<p class='muted'>no flows</p>"
    streams = any("stalls" in f for f in flows)
    rows = []
    for f in flows:
        path = f.get("full_path") or f.get("path") or []
        # No receiver counted it (a streaming relay has no viewer): no goodput, not zero.
        goodput = num(f.get("goodput_bps"))
        row = [f.get("id", "?"), f.get("kind", ""), f"{f.get('src', '?')} → {f.get('dst', '?')}",
               " → ".join(str(p) for p in path) if isinstance(path, list) else str(path),
               f"{(num(f.get('offered_bps')) or 0) / 1e6:.2f}",
               "—" if goodput is None else f"{goodput / 1e6:.2f}",
               f"{int(num(f.get('retransmits')) or 0):,}",
               f"{100 * (num(f.get('loss')) or 0):.2f}"]
        if streams:
            row += [format_value("", f.get("stalls")), format_value("", f.get("stall_s"))]
        rows.append(row)
    head = ["flow", "kind", "src → dst", "path", "offered (Mbit/s)", "goodput (Mbit/s)",
            "retransmits", "fabric loss (%)"] + (["stalls", "stall time (s)"] if streams else [])
    return table(head, rows, numeric=range(4, len(head)))


def _per_section(result: dict[str, Any], render: Callable[[Section], str], what: str) -> str:
    secs = sections(result)
    if len(secs) == 1 and not secs[0].name:
        return render(secs[0])
    main = result.get("phase")
    return "".join(f"<details{' open' if s.name == main else ''}><summary>{escape(what)}, phase "
                   f"{escape(s.name)}{' (the headline phase)' if s.name == main else ''}"
                   f"</summary>{render(s)}</details>" for s in secs)


def _skipped_html(skipped: list[Skipped]) -> str:
    if not skipped:
        return ""
    return ("<details><summary>Plots not made</summary><ul>"
            + "".join(f"<li>{escape(s.name)}: {escape(s.reason)}</li>" for s in skipped)
            + "</ul></details>")


def report_html(result: dict[str, Any], plots: list[Plot], skipped: list[Skipped],
                plots_dir: Path, run_date: str = "unknown") -> str:
    """The report page for one run, with ``plots`` (PNGs in ``plots_dir``) embedded."""
    now = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    head = heading(result)
    sub = (f"kind {kind_of(result) or 'not recorded'} · run finished {run_date} · measured "
           f"{format_value('duration_s', result.get('duration_s'))}"
           + (f" · phases: {', '.join(s.name for s in sections(result))}"
              if sections(result)[0].name else "")
           + f" · report made {now}")
    parts, phase = [], ""
    for p in plots:
        if p.section and p.section != phase:
            parts.append(f"<h3>Phase {escape(p.section)}</h3>")
            phase = p.section
        parts.append(figure(p, (plots_dir / p.file).read_bytes()))
    figures = "".join(parts) or "<p class='muted'>no plots: the result holds no series to draw</p>"
    params = dict_of(result.get("params"))
    timings = dict_of(result.get("timings"))
    body = (
        f"<h1>FabricLab report: {escape(head)}</h1><p class='sub'>{escape(sub)}</p>"
        "<nav><a href='#environment'>environment</a><a href='#fidelity'>fidelity</a>"
        "<a href='#plots'>plots</a><a href='#metrics'>metrics</a><a href='#links'>links</a>"
        "<a href='#flows'>flows</a></nav>"
        f"<h2 id='environment'>Environment</h2>{kv_table(env_rows(result))}"
        + (f"<details><summary>Scenario parameters</summary>{kv_table(flatten(params, depth=3))}"
           "</details>" if params else "")
        + (f"<details><summary>Timings</summary>{kv_table(flatten(timings))}</details>"
           if timings else "")
        + f"<h2 id='fidelity'>Fidelity</h2>{_fidelity_html(result)}"
        # Plots before the metrics: a phased run's metrics table is 60-100 rows, and the
        # plots are what a reader opens the report for.
        f"<h2 id='plots'>Plots</h2>{figures}{_skipped_html(skipped)}"
        f"<h2 id='metrics'>Metrics</h2>{_metrics_html(result)}"
        f"<h2 id='links'>Links</h2><p>One row per switch or router egress port.</p>"
        f"{_per_section(result, lambda s: _links_table(s.links), 'Links')}"
        f"<h2 id='flows'>Flows</h2>"
        f"{_per_section(result, lambda s: _flows_table(s.flows), 'Flows')}")
    return page(f"FabricLab: {head}", body)


def write_report(run_dir: Path) -> Path:
    """Plots into ``run_dir``/plots/ and a self-contained ``run_dir``/report.html; its path.

    ``plots/index.json`` lists the plots made (titles, axis labels, captions) and those not
    made with the reason. Raises ReportError when there is no readable result.json.
    """
    run_dir = Path(run_dir)
    result = load_result(run_dir)
    plots_dir = run_dir / PLOTS_DIR
    plots_dir.mkdir(exist_ok=True)
    for old in plots_dir.glob("*.png"):      # a previous report's plots may not apply now
        old.unlink()
    plots, skipped = make_plots(result, plots_dir, run_dir)
    (plots_dir / "index.json").write_text(json.dumps(
        {"plots": [asdict(p) for p in plots], "skipped": [asdict(s) for s in skipped]},
        indent=1) + "\n")
    out = run_dir / REPORT_NAME
    out.write_text(report_html(result, plots, skipped, plots_dir, run_date(run_dir)))
    return out
