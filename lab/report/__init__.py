"""Reports: a run's result.json as plots and one report.html, and two runs side by side."""

from lab.report.page import (
    COMPARE_NAME,
    PLOTS_DIR,
    REPORT_NAME,
    Plot,
    ReportError,
    Section,
    Skipped,
    compare_html,
    compare_rows,
    flatten,
    format_value,
    kind_of,
    load_result,
    make_plots,
    report_html,
    sections,
    write_compare,
    write_report,
)

__all__ = [
    "COMPARE_NAME", "PLOTS_DIR", "REPORT_NAME", "Plot", "ReportError", "Section", "Skipped",
    "compare_html", "compare_rows", "flatten", "format_value", "kind_of", "load_result",
    "make_plots", "report_html", "sections", "write_compare", "write_report",
]
