"""One weathermap on its own: a phase of a run, with the flows a reader names drawn as
paths (``fabriclab report`` draws every phase's with the default group of flows)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from lab.model.result import load_result
from lab.plotting.plots import Plot, Skipped
from lab.plotting.sections import ReportError, sections
from lab.plotting.weathermap import flow_group, weathermap_spec
from lab.report.draw import draw_spec


def draw_weathermap(run_dir: Path, out_dir: Path, phase: str = "",
                    flows: Iterable[str] = (), label: str | None = None) -> Plot | Skipped:
    """The weathermap of ``phase`` (the first one when not given) of the run in ``run_dir``
    as a PNG in ``out_dir``; ``flows`` (ids, with or without the phase prefix) are drawn as
    paths, else the section's default group is."""
    result = load_result(run_dir)
    secs = sections(result)
    sec = next((s for s in secs if s.name == phase), None) if phase else secs[0]
    if sec is None:
        raise ReportError(str(run_dir), f"no phase {phase!r}; it has "
                                        f"{', '.join(s.name for s in secs) or 'none'}")
    ids = list(flows)
    spec = weathermap_spec(sec, result, flow_group(sec, ids, label) if ids else None)
    if isinstance(spec, Skipped):
        return spec
    out_dir.mkdir(parents=True, exist_ok=True)
    return draw_spec(spec, out_dir)
