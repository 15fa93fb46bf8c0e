"""Two runs side by side: the metrics with b − a (terminal and HTML), plots in pairs."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from lab.model.result import load_result
from lab.plotting.plots import Plot
from lab.plotting.sections import dict_of, num, sections
from lab.report.draw import draw_spec, specs_for
from lab.report.html import env_rows, escape, figure, heading, page, run_date, table
from lab.report.values import flatten, format_value

COMPARE_NAME = "compare.html"


def _metric_rows(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """The result's metrics as (dotted key, value); a phased result's as ``<phase>.<key>``.

    A collective result repeats its first phase's numbers at the top level: those appear
    once, under the phase.
    """
    metrics = dict_of(result.get("metrics"))
    phases = dict_of(metrics.get("phases"))
    first = dict_of(next(iter(phases.values()), {}))
    rows = [(k, v) for k, v in flatten(
        {k: v for k, v in metrics.items() if k != "phases" and first.get(k, object()) != v})]
    for name, m in phases.items():
        rows += flatten(dict_of(m), str(name), depth=1)
    return rows


def _totals(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """Per section, totals a comparison needs even when the kind's metrics lack them."""
    rows: list[tuple[str, Any]] = [("duration_s", result.get("duration_s"))]
    for sec in sections(result):
        p = f"{sec.name}." if sec.name else ""
        rows += [
            (f"{p}flows.goodput_bps (sum)",
             sum(num(f.get("goodput_bps")) or 0 for f in sec.flows) if sec.flows else None),
            (f"{p}flows.retransmits (sum)",
             sum(int(num(f.get("retransmits")) or 0) for f in sec.flows)
             if sec.flows else None),
            (f"{p}links.drops (sum)",
             sum(int(num(ln.get("drops")) or 0) for ln in sec.links) if sec.links else None),
            (f"{p}links.util_max (max)",
             max((num(ln.get("util_max")) or 0 for ln in sec.links), default=None)),
        ]
    fid = dict_of(result.get("fidelity"))
    rows += [("fidelity.valid", fid.get("valid")),
             ("fidelity.cpu_idle_min_pct", fid.get("cpu_idle_min_pct")),
             ("fidelity.datapath_wait_max_ms", fid.get("datapath_wait_max_ms"))]
    return rows


def compare_rows(result_a: dict[str, Any],
                 result_b: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(metric, a, b, delta) for every metric either run has; delta is b − a.

    For the terminal (``fabriclab compare``) and compare.html alike. Numbers get a signed
    difference and, where a is not 0, the relative change; other values say whether they
    differ.
    """
    a_rows = dict(_metric_rows(result_a) + _totals(result_a))
    b_rows = dict(_metric_rows(result_b) + _totals(result_b))
    keys = list(dict.fromkeys([*a_rows, *b_rows]))
    out = []
    for key in keys:
        va, vb = a_rows.get(key), b_rows.get(key)
        if va is None and vb is None:
            continue
        out.append((key, format_value(key, va), format_value(key, vb),
                    _delta(key, va, vb, key in a_rows, key in b_rows)))
    return out


def _delta(key: str, va: Any, vb: Any, in_a: bool, in_b: bool) -> str:
    if not in_a:
        return "only in B"
    if not in_b:
        return "only in A"
    na, nb = num(va), num(vb)
    if na is not None and nb is not None:
        d = nb - na
        if d == 0:
            return "0"
        as_int = isinstance(va, int) and isinstance(vb, int)
        text = format_value(key, int(d) if as_int else d, signed=True)
        return f"{text} ({100 * d / abs(na):+.1f} %)" if na else text
    return "same" if va == vb else "differs"



def write_compare(dir_a: Path, dir_b: Path, out: Path) -> Path:
    """A self-contained compare.html of two runs; ``out`` is the file or its directory.

    The metrics table has both values and b − a; plots of the same name stand side by side,
    drawn on the same axis limits so that a taller bar is a bigger number. The runs'
    directories are only read: the plots are drawn in a temporary directory and embedded.
    """
    dir_a, dir_b, out = Path(dir_a), Path(dir_b), Path(out)
    ra, rb = load_result(dir_a), load_result(dir_b)
    path = out if out.suffix.lower() in (".html", ".htm") else out / COMPARE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    specs_a, skip_a = specs_for(ra, dir_a)
    specs_b, skip_b = specs_for(rb, dir_b)
    limits = {s.name: s.vmax for s in specs_a}
    for s in specs_b:
        limits[s.name] = max(limits.get(s.name, s.vmax), s.vmax)
    with tempfile.TemporaryDirectory(prefix="fabriclab-compare-") as tmp:
        da, db = Path(tmp) / "a", Path(tmp) / "b"
        da.mkdir()
        db.mkdir()
        plots_a = {s.name: draw_spec(s, da, limits[s.name]) for s in specs_a}
        plots_b = {s.name: draw_spec(s, db, limits[s.name]) for s in specs_b}
        pngs = {("a", n): (da / p.file).read_bytes() for n, p in plots_a.items()}
        pngs |= {("b", n): (db / p.file).read_bytes() for n, p in plots_b.items()}
    why_a = {s.name: s.reason for s in skip_a}
    why_b = {s.name: s.reason for s in skip_b}
    path.write_text(compare_html(ra, rb, dir_a, dir_b, plots_a, plots_b, pngs, why_a, why_b))
    return path


def _side(result: dict[str, Any], run_dir: Path, tag: str) -> str:
    return (f"<b>{tag}</b>: {escape(heading(result))} <span class='muted'>({escape(run_dir)}, "
            f"finished {escape(run_date(run_dir))})</span>")


def compare_html(ra: dict[str, Any], rb: dict[str, Any], dir_a: Path, dir_b: Path,
                 plots_a: dict[str, Plot], plots_b: dict[str, Plot],
                 pngs: dict[tuple[str, str], bytes],
                 why_a: dict[str, str], why_b: dict[str, str]) -> str:
    """The compare page: who is A and B, what differs in set-up, metrics, plots in pairs."""
    label_a = f"A: {ra.get('policy', '?')}"
    label_b = f"B: {rb.get('policy', '?')}"
    if ra.get("policy") == rb.get("policy"):
        label_a += f" (seed {ra.get('seed', '?')})"
        label_b += f" (seed {rb.get('seed', '?')})"
    warn = ""
    if ra.get("scenario") != rb.get("scenario"):
        warn = ("<p class='bad'>Different scenarios: the numbers need not be comparable.</p>")
    env_a, env_b = dict(env_rows(ra)), dict(env_rows(rb))
    env_pairs = [(k, format_value(k, env_a.get(k)), format_value(k, env_b.get(k)))
                 for k in dict.fromkeys([*env_a, *env_b])]
    fa, fb = dict_of(ra.get("fidelity")), dict_of(rb.get("fidelity"))
    for key in ("valid", "cpu_idle_min_pct", "datapath_wait_max_ms"):
        env_pairs.append((f"fidelity.{key}", format_value(key, fa.get(key)),
                         format_value(key, fb.get(key))))
    rows = compare_rows(ra, rb)
    metric_rows = "".join(
        f"<tr{' class=diff' if d not in ('0', 'same') else ''}><td>{escape(m)}</td>"
        f"<td class='n'>{escape(a)}</td><td class='n'>{escape(b)}</td>"
        f"<td class='n'>{escape(d)}</td></tr>"
        for m, a, b, d in rows)
    metrics = ("<div class='wrap'><table><thead><tr><th>metric</th>"
               f"<th>{escape(label_a)}</th><th>{escape(label_b)}</th><th>Δ (B − A)</th>"
               "</tr></thead>"
               f"<tbody>{metric_rows}</tbody></table></div>")
    names = list(dict.fromkeys([*plots_a, *plots_b]))
    pairs = []
    for n in names:
        cells = []
        for tag, plots, why in (("a", plots_a, why_a), ("b", plots_b, why_b)):
            p = plots.get(n)
            cells.append(figure(p, pngs[(tag, n)], caption=False) if p else
                         f"<p class='muted'>not made for this run: "
                         f"{escape(why.get(n, 'no such data'))}</p>")
        p = plots_a.get(n) or plots_b[n]
        cap_a = plots_a[n].caption if n in plots_a else ""
        cap_b = plots_b[n].caption if n in plots_b else ""
        pairs.append(f"<h3>{escape(p.title)}</h3><div class='pair'><div><p><b>{escape(label_a)}</b>"
                     f"</p>{cells[0]}<p class='muted'>{escape(cap_a)}</p></div><div><p><b>"
                     f"{escape(label_b)}</b></p>{cells[1]}<p class='muted'>{escape(cap_b)}</p>"
                     "</div></div>")
    body = (f"<h1>FabricLab compare: {escape(ra.get('scenario', '?'))} — {escape(label_a)} vs "
            f"{escape(label_b)}</h1><p>{_side(ra, dir_a, 'A')}<br>{_side(rb, dir_b, 'B')}</p>"
            f"{warn}<h2>Set-up</h2>"
            + table(("field", label_a, label_b), env_pairs)
            + "<h2>Metrics</h2><p>Rows where the runs differ are shaded; Δ is B − A, with "
              "the change relative to A in brackets.</p>" + metrics
            + "<h2>Plots</h2><p>Each pair is drawn on the same axis limits.</p>"
            + ("".join(pairs) or "<p class='muted'>no plots</p>"))
    return page(f"FabricLab compare: {ra.get('scenario', '?')} {label_a} vs {label_b}", body)
