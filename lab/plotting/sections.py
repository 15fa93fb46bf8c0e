"""Reading a run: its kind, its phases as sections, and the labels plots and tables share.

Everything here reads the result defensively: a field that is missing or of the wrong type
is treated as absent, so a report draws what is there and says what is not.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from lab.model.result import ResultError

ReportError = ResultError


def kind_of(result: dict[str, Any]) -> str | None:
    """The result's kind, or None when it does not say one (not a result this lab wrote:
    ``lab.model.result.load_result`` gives the results of older labs theirs)."""
    kind = result.get("kind")
    return kind if isinstance(kind, str) else None


@dataclass
class Section:
    """One phase of a run (or the whole run, ``name`` empty): its links, flows and metrics."""

    name: str
    duration_s: float | None
    links: list[dict[str, Any]]
    flows: list[dict[str, Any]]
    metrics: dict[str, Any]
    events: dict[str, Any] = field(default_factory=dict)
    #: Everything ``phase_details`` keeps of the phase (empty for an unphased run): a
    #: kind's own per-phase plots (``Kind.section_plots``) read their data from here, as
    #: the hook is handed the section and not the result.
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"phase {self.name}" if self.name else "run"


def sections(result: dict[str, Any]) -> list[Section]:
    """Phases in run order, from ``phase_details``; an unphased run is one nameless section.

    The top-level links and flows of a phased result repeat one phase's, so they are not a
    section of their own.
    """
    details = result.get("phase_details")
    metrics = result.get("metrics") if isinstance(result.get("metrics"), dict) else {}
    if isinstance(details, dict) and details:
        per_phase = metrics.get("phases") if isinstance(metrics.get("phases"), dict) else {}
        return [Section(str(name), d.get("duration_s"), dicts_of(d.get("links")),
                        dicts_of(d.get("flows")), dict_of(per_phase.get(name)),
                        dict_of(d.get("events")), d)
                for name, d in details.items() if isinstance(d, dict)]
    return [Section("", result.get("duration_s"), dicts_of(result.get("links")),
                    dicts_of(result.get("flows")), metrics)]


def dict_of(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def dicts_of(x: Any) -> list[dict[str, Any]]:
    return [e for e in x if isinstance(e, dict)] if isinstance(x, list) else []


def num(x: Any) -> float | None:
    """A finite number, or None (bools, strings, NaN and missing values are not numbers)."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()


def link_labels(links: list[dict[str, Any]]) -> list[str]:
    """``node→peer``, with the interface when two links join the same pair of nodes."""
    base = [f"{ln.get('node', '?')}→{ln.get('peer', '?')}" for ln in links]
    labels = []
    for ln, b in zip(links, base, strict=True):
        if base.count(b) > 1:
            b += f" ({ln.get('intf') or 'port ' + str(ln.get('port', '?'))})"
        labels.append(b)
    return labels


def flow_label(flow: dict[str, Any], via: bool = False) -> str:
    """A flow's id without its phase prefix (``incident/big5`` → ``big5``).

    With ``via``, the path choice the plot is about: a stream's edge uplink, or the switch
    in the middle of a leaf-spine path (``f3 via spine2``), the ECMP choice.
    """
    label = str(flow.get("id", "?")).rsplit("/", 1)[-1]
    path, uplinks = flow.get("path"), flow.get("uplinks")
    if via and isinstance(uplinks, list) and uplinks:
        # A stream's story is the edge uplink it left (or entered) by, not the spine.
        label += " via " + ", ".join(str(u).split("->", 1)[0] for u in uplinks)
    elif via and isinstance(path, list) and len(path) == 3:
        label += f" via {path[1]}"
    return label
