"""One run's report.html: self-contained, the plots embedded as PNG ``data:`` URIs.

The HTML helpers here (escaping, tables, figures, the page frame) are shared with
``lab.report.compare``.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lab.model.result import load_result
from lab.plotting.plots import Plot, Skipped
from lab.plotting.sections import Section, dict_of, kind_of, link_labels, num, sections
from lab.report.draw import make_plots
from lab.report.values import flatten, format_value

PLOTS_DIR = "plots"
REPORT_NAME = "report.html"


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;
max-width:1160px;padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.5em;margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;
margin-top:1.6em}h3{margin-bottom:.3em}.sub{color:#555;margin-top:0}
table{border-collapse:collapse;font-size:.85em;margin:.4em 0 1em}
th,td{border:1px solid #ddd;padding:.2em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fafafa}.bad{color:#b00020;font-weight:600}
.ok{color:#1b7e2a;font-weight:600}.diff td{background:#fff7e0!important}
figure{margin:1em 0 2em}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.9em;color:#333;max-width:800px}figcaption .axes{color:#666}
.wrap{overflow-x:auto}details{margin:.4em 0}summary{cursor:pointer;font-weight:600}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:1em}.pair figure{margin:0}
.muted{color:#777}nav a{margin-right:1em}
"""

#: The only script: count the images that decoded, for a headless browser to read back.
_SCRIPT = ("<script>window.addEventListener('load',function(){document.body.dataset.plots="
           "String(Array.prototype.filter.call(document.images,function(i){"
           "return i.complete&&i.naturalWidth>0;}).length);});</script>")


#: A cell that reads as a number (right-aligned); lists and names stay left-aligned.
_NUMERIC = re.compile(r"^[-+]?[\d.,]+( [^\s,]+)?( \([-+\d.]+ %\))?$")


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _table(head: Iterable[str], rows: Iterable[Iterable[Any]],
           numeric: Iterable[int] = ()) -> str:
    nums = set(numeric)
    out = ["<div class='wrap'><table><thead><tr>"]
    out += [f"<th>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for row in rows:
        cells = []
        for i, c in enumerate(row):
            cls = " class='n'" if i in nums and _NUMERIC.match(str(c)) else ""
            cells.append(f"<td{cls}>{c if isinstance(c, _Raw) else _e(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


class _Raw(str):
    """HTML already escaped (a table cell that carries markup)."""


def _kv_table(rows: list[tuple[str, Any]]) -> str:
    return _table(("field", "value"), ((k, format_value(k, v)) for k, v in rows))


def _img(plot: Plot, png: bytes) -> str:
    data = base64.b64encode(png).decode()
    return (f"<img src=\"data:image/png;base64,{data}\" alt=\"{_e(plot.title)}\" "
            f"width=\"{plot.width_px}\" height=\"{plot.height_px}\">")


def _figure(plot: Plot, png: bytes, caption: bool = True) -> str:
    axes = f"x: {plot.xlabel}; y: {plot.ylabel}" + \
        (f"; colour: {plot.colorbar}" if plot.colorbar else "")
    cap = (f"<figcaption><b>{_e(plot.title)}.</b> {_e(plot.caption)} "
           f"<span class='axes'>({_e(axes)})</span></figcaption>") if caption else ""
    return f"<figure id='plot-{_e(plot.name)}'>{_img(plot, png)}{cap}</figure>"


def _run_date(run_dir: Path) -> str:
    """When the run finished: result.json's ``finished`` (UTC), else its modification time
    (results written before the field existed)."""
    try:
        finished = json.loads((run_dir / "result.json").read_text()).get("finished")
        if isinstance(finished, str):
            when = dt.datetime.strptime(finished, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
            return when.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    except (OSError, ValueError, AttributeError):
        pass
    try:
        ts = (run_dir / "result.json").stat().st_mtime
    except OSError:
        return "unknown"
    return dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _heading(result: dict[str, Any]) -> str:
    return (f"{result.get('scenario', '?')} — policy {result.get('policy', '?')}, "
            f"seed {result.get('seed', '?')}")


def _env_rows(result: dict[str, Any]) -> list[tuple[str, Any]]:
    env = dict_of(result.get("environment"))
    first = ("datapath", "ecn", "delay", "controller", "kernel")
    return [(k, env.get(k)) for k in first] + [(k, v) for k, v in env.items() if k not in first]


def _fidelity_html(result: dict[str, Any]) -> str:
    fid = dict_of(result.get("fidelity"))
    valid = fid.get("valid")
    verdict = ("<p class='ok'>valid: the emulator kept up, the numbers describe the "
               "network</p>" if valid else
               "<p class='bad'>NOT valid: the CPU ran out, the numbers describe the "
               "emulator, not the network</p>" if valid is False else
               "<p class='muted'>no fidelity verdict in this result</p>")
    notes = fid.get("notes") or []
    note_html = "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>" if notes else ""
    rows = [(k, v) for k, v in flatten({k: v for k, v in fid.items()
                                        if k not in ("valid", "notes")})]
    return verdict + note_html + _kv_table(rows)


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
        parts.append("<h3>Per phase</h3>" + _table(
            ["metric", *names],
            ([k] + [format_value(k, flat[n].get(k)) if k in flat[n] else "" for n in names]
             for k in keys), numeric=range(1, len(names) + 1)))
    if top:
        parts.append(("<h3>Whole run</h3>" if phases else "")
                     + _table(("metric", "value"), ((k, format_value(k, v)) for k, v in top),
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
                     _Raw(f"<span class='bad'>{drops:,}</span>") if drops else "0",
                     f"{int(num(ln.get('ce_marked')) or 0):,}",
                     f"{(num(ln.get('tx_bytes')) or 0) / 1e6:.2f}"))
    return _table(("link", "role", "rate (Mbit/s)", "util mean (%)", "util max (%)", "drops",
                   "CE marked", "sent (MB)"), rows, numeric=range(2, 8))


def _flows_table(flows: list[dict[str, Any]]) -> str:
    if not flows:
        return "<p class='muted'>no flows</p>"
    streams = any("stalls" in f for f in flows)
    rows = []
    for f in flows:
        path = f.get("full_path") or f.get("path") or []
        row = [f.get("id", "?"), f.get("kind", ""), f"{f.get('src', '?')} → {f.get('dst', '?')}",
               " → ".join(str(p) for p in path) if isinstance(path, list) else str(path),
               f"{(num(f.get('offered_bps')) or 0) / 1e6:.2f}",
               f"{(num(f.get('goodput_bps')) or 0) / 1e6:.2f}",
               f"{int(num(f.get('retransmits')) or 0):,}",
               f"{100 * (num(f.get('loss')) or 0):.2f}"]
        if streams:
            row += [f.get("stalls", ""), format_value("", f.get("stall_s"))]
        rows.append(row)
    head = ["flow", "kind", "src → dst", "path", "offered (Mbit/s)", "goodput (Mbit/s)",
            "retransmits", "fabric loss (%)"] + (["stalls", "stall time (s)"] if streams else [])
    return _table(head, rows, numeric=range(4, len(head)))


def _per_section(result: dict[str, Any], render: Callable[[Section], str], what: str) -> str:
    secs = sections(result)
    if len(secs) == 1 and not secs[0].name:
        return render(secs[0])
    main = result.get("phase")
    return "".join(f"<details{' open' if s.name == main else ''}><summary>{_e(what)}, phase "
                   f"{_e(s.name)}{' (the headline phase)' if s.name == main else ''}"
                   f"</summary>{render(s)}</details>" for s in secs)


def _skipped_html(skipped: list[Skipped]) -> str:
    if not skipped:
        return ""
    return ("<details><summary>Plots not made</summary><ul>"
            + "".join(f"<li>{_e(s.name)}: {_e(s.reason)}</li>" for s in skipped)
            + "</ul></details>")


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
            f"<body>{body}{_SCRIPT}</body></html>\n")


def report_html(result: dict[str, Any], plots: list[Plot], skipped: list[Skipped],
                plots_dir: Path, run_date: str = "unknown") -> str:
    """The report page for one run, with ``plots`` (PNGs in ``plots_dir``) embedded."""
    now = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    head = _heading(result)
    sub = (f"kind {kind_of(result) or 'not recorded'} · run finished {run_date} · measured "
           f"{format_value('duration_s', result.get('duration_s'))}"
           + (f" · phases: {', '.join(s.name for s in sections(result))}"
              if sections(result)[0].name else "")
           + f" · report made {now}")
    parts, phase = [], ""
    for p in plots:
        if p.section and p.section != phase:
            parts.append(f"<h3>Phase {_e(p.section)}</h3>")
            phase = p.section
        parts.append(_figure(p, (plots_dir / p.file).read_bytes()))
    figures = "".join(parts) or "<p class='muted'>no plots: the result holds no series to draw</p>"
    params = dict_of(result.get("params"))
    timings = dict_of(result.get("timings"))
    body = (
        f"<h1>FabricLab report: {_e(head)}</h1><p class='sub'>{_e(sub)}</p>"
        "<nav><a href='#environment'>environment</a><a href='#fidelity'>fidelity</a>"
        "<a href='#plots'>plots</a><a href='#metrics'>metrics</a><a href='#links'>links</a>"
        "<a href='#flows'>flows</a></nav>"
        f"<h2 id='environment'>Environment</h2>{_kv_table(_env_rows(result))}"
        + (f"<details><summary>Scenario parameters</summary>{_kv_table(flatten(params, depth=3))}"
           "</details>" if params else "")
        + (f"<details><summary>Timings</summary>{_kv_table(flatten(timings))}</details>"
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
    return _page(f"FabricLab: {head}", body)


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
    out.write_text(report_html(result, plots, skipped, plots_dir, _run_date(run_dir)))
    return out
