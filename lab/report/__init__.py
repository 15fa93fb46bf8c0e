"""Reports: a run's result.json as plots and one report.html, and two runs side by side.

Why a report and not just result.json: the numbers that decide a question (which uplink
was hot, when a stream stalled, how long the slow steps were) are time series and
distributions, and a table of means hides exactly the part that matters. So every plot
here is one question, captioned with what to look at and what this run shows.

Why the HTML is self-contained (PNGs as base64 ``data:`` URIs, inline CSS, no fonts,
scripts or stylesheets from anywhere): a report is mailed, attached to an issue or opened
from a CI artefact on a machine with no network, and it must look the same there as it did
when it was written. The only script sets ``data-plots`` on the body (the number of images
that decoded), so a headless browser can tell that every plot rendered.

What is plotted depends on what the result holds (``kind``: ecmp, collective, streaming;
phased kinds have ``phase_details``): nothing is drawn from data that is not there, and
every plot not made is listed with the reason. Plots are specified first (data only, no
matplotlib) and drawn second, so a comparison can draw both runs on the same axis limits.

matplotlib (Agg) is imported by the functions that draw: importing it costs about a
second, which ``fabriclab`` should not pay for commands that draw nothing.

The package, one module per part, each importing only those above it (and what it builds
on):

- ``lab.plotting``: reading a run (its kind, its phases as ``Section``s, labels) and the
  plots every run gets (utilisation, queues, goodput), as specs; a kind's own plots are in
  its package (``lab/kinds/<kind>/plots.py``);
- ``draw``: which specs a result gets, and drawing them (``make_plots``);
- ``values``: values formatted once for the HTML and the terminal;
- ``html``: the HTML every page is made of (escaping, tables, figures, the page frame);
- ``page``: one run's report.html (``write_report``);
- ``compare``: two runs side by side (``compare_rows``, ``write_compare``);
- ``weathermap``: one phase's weathermap with flows a reader names drawn as paths.
"""

from lab.model.result import load_result
from lab.plotting.plots import MAX_LINES, MAX_QUEUES, Plot, Skipped
from lab.plotting.sections import ReportError, Section, kind_of, sections
from lab.report.compare import COMPARE_NAME, compare_html, compare_rows, write_compare
from lab.report.draw import DPI, WIDTH_IN, make_plots
from lab.report.page import PLOTS_DIR, REPORT_NAME, report_html, write_report
from lab.report.values import flatten, format_value
from lab.report.weathermap import draw_weathermap

__all__ = [
    "COMPARE_NAME", "DPI", "MAX_LINES", "MAX_QUEUES", "PLOTS_DIR", "REPORT_NAME", "WIDTH_IN",
    "Plot", "ReportError", "Section", "Skipped", "compare_html", "compare_rows",
    "draw_weathermap", "flatten", "format_value", "kind_of", "load_result", "make_plots",
    "report_html", "sections", "write_compare", "write_report",
]
