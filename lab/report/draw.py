"""Which plots a result gets, in report order, and drawing them to PNGs.

matplotlib (Agg) is imported by the functions that draw: importing it costs about a
second, which ``fabriclab`` should not pay for commands that draw nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab import kinds
from lab.plotting.plots import Plot, Skipped, Spec, goodput_spec, queue_spec, util_spec
from lab.plotting.sections import dict_of, kind_of, num, sections
from lab.plotting.weathermap import weathermap_spec

#: Plot size: 8 in at 100 dpi is 800 px, readable in a report and on a laptop screen.
WIDTH_IN, DPI = 8.0, 100


def specs_for(result: dict[str, Any], run_dir: Path | None) -> tuple[list[Spec], list[Skipped]]:
    """Every plot the result has data for, in report order, and the ones it has not."""
    specs: list[Spec] = []
    skipped: list[Skipped] = []
    kind = kind_of(result)
    secs = sections(result)
    queue_limit = num(dict_of(dict_of(result.get("params")).get("topology")).get("queue_bytes"))

    def add(made: Spec | Skipped | None) -> None:
        if isinstance(made, Spec):
            specs.append(made)
        elif isinstance(made, Skipped):
            skipped.append(made)

    # A kind's own plots come from the kind (``run_plots`` before, ``section_plots`` after
    # the ones every run gets); a result of a kind this lab does not have gets none.
    own = kinds.get(kind) if kind in kinds.KINDS else None
    for made in own.run_plots(result, secs) if own else []:
        add(made)
    for sec in secs:
        add(weathermap_spec(sec, result))
        add(util_spec(sec))
        add(queue_spec(sec, queue_limit))
        add(goodput_spec(sec))
        for made in own.section_plots(sec, run_dir) if own else []:
            add(made)
    return specs, skipped


def draw_spec(spec: Spec, out_dir: Path, limit: float | None = None) -> Plot:
    """Draw one spec to ``out_dir``/<name>.png and read back the words that ended up on it."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, spec.height_in), dpi=DPI, layout="constrained")
    caption = spec.draw(fig, spec.vmax if limit is None else limit)
    ax = fig.axes[0]
    legend = ax.get_legend()
    cbar = next((a.get_ylabel() for a in fig.axes[1:] if a.get_ylabel()), "")
    file = f"{spec.name}.png"
    fig.savefig(out_dir / file, dpi=DPI, metadata={
        "Title": ax.get_title(), "Description": caption, "Software": "FabricLab lab.report"})
    width, height = fig.canvas.get_width_height()
    return Plot(name=spec.name, file=file, kind=spec.kind, section=spec.section,
                title=ax.get_title(), xlabel=ax.get_xlabel(), ylabel=ax.get_ylabel(),
                legend=[t.get_text() for t in legend.get_texts()] if legend else [],
                colorbar=cbar, caption=caption, width_px=width, height_px=height)


def make_plots(result: dict[str, Any], out_dir: Path,
               run_dir: Path | None = None,
               limits: dict[str, float] | None = None) -> tuple[list[Plot], list[Skipped]]:
    """Draw every plot ``result`` has data for into ``out_dir``; the made and the skipped.

    ``run_dir`` is where the players' timelines are (streaming); ``limits`` overrides the
    value-axis extent per plot name (a comparison draws both runs on one scale).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    specs, skipped = specs_for(result, run_dir)
    made = [draw_spec(s, out_dir, (limits or {}).get(s.name)) for s in specs]
    return made, skipped
