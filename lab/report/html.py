"""The HTML every report page is made of: escaping, tables, embedded figures, a run's
heading, date and environment, and the self-contained page frame (inline CSS, one script).

Shared by one run's page (``lab.report.page``) and two runs side by side
(``lab.report.compare``), so both look and escape alike.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lab.plotting.plots import Plot
from lab.plotting.sections import dict_of
from lab.report.values import format_value

CSS = """
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
SCRIPT = ("<script>window.addEventListener('load',function(){document.body.dataset.plots="
           "String(Array.prototype.filter.call(document.images,function(i){"
           "return i.complete&&i.naturalWidth>0;}).length);});</script>")


#: A cell that reads as a number (right-aligned); lists and names stay left-aligned.
NUMERIC = re.compile(r"^[-+]?[\d.,]+( [^\s,]+)?( \([-+\d.]+ %\))?$")


def escape(x: Any) -> str:
    """``x`` as HTML text (quotes too: it may land in an attribute)."""
    return html.escape(str(x), quote=True)


def table(head: Iterable[str], rows: Iterable[Iterable[Any]],
           numeric: Iterable[int] = ()) -> str:
    nums = set(numeric)
    out = ["<div class='wrap'><table><thead><tr>"]
    out += [f"<th>{escape(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for row in rows:
        cells = []
        for i, c in enumerate(row):
            cls = " class='n'" if i in nums and NUMERIC.match(str(c)) else ""
            cells.append(f"<td{cls}>{c if isinstance(c, Raw) else escape(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


class Raw(str):
    """HTML already escaped (a table cell that carries markup)."""


def kv_table(rows: list[tuple[str, Any]]) -> str:
    return table(("field", "value"), ((k, format_value(k, v)) for k, v in rows))


def img(plot: Plot, png: bytes) -> str:
    data = base64.b64encode(png).decode()
    return (f"<img src=\"data:image/png;base64,{data}\" alt=\"{escape(plot.title)}\" "
            f"width=\"{plot.width_px}\" height=\"{plot.height_px}\">")


def figure(plot: Plot, png: bytes, caption: bool = True) -> str:
    axes = f"x: {plot.xlabel}; y: {plot.ylabel}" + \
        (f"; colour: {plot.colorbar}" if plot.colorbar else "")
    cap = (f"<figcaption><b>{escape(plot.title)}.</b> {escape(plot.caption)} "
           f"<span class='axes'>({escape(axes)})</span></figcaption>") if caption else ""
    return f"<figure id='plot-{escape(plot.name)}'>{img(plot, png)}{cap}</figure>"


def run_date(run_dir: Path) -> str:
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


def heading(result: dict[str, Any]) -> str:
    return (f"{result.get('scenario', '?')} — policy {result.get('policy', '?')}, "
            f"seed {result.get('seed', '?')}")


def env_rows(result: dict[str, Any]) -> list[tuple[str, Any]]:
    env = dict_of(result.get("environment"))
    first = ("datapath", "ecn", "delay", "controller", "kernel")
    return [(k, env.get(k)) for k in first] + [(k, v) for k, v in env.items() if k not in first]


def page(title: str, body: str) -> str:
    """A whole self-contained page: ``body`` in the frame every report has."""
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{escape(title)}</title><style>{CSS}</style></head>"
            f"<body>{body}{SCRIPT}</body></html>\n")
