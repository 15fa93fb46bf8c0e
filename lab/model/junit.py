"""JUnit XML, the one writer: ``fabriclab regress`` and ``fabriclab grade`` both hand a
course's or a team's CI their verdicts in it (one testsuite per policy or per submission,
one testcase per metric or per check)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr


@dataclass(frozen=True)
class Case:
    """One testcase: who it belongs to, what it checked, and why it failed (None: passed)."""

    classname: str
    name: str
    failure: str | None = None


def render(suites: Mapping[str, Sequence[Case]]) -> str:
    """The XML text: a ``<testsuite>`` per key, its cases in the order given."""
    out = ['<?xml version="1.0" encoding="UTF-8"?>', "<testsuites>"]
    for suite, cases in suites.items():
        failed = sum(1 for c in cases if c.failure is not None)
        out.append(f"  <testsuite name={quoteattr(suite)} tests=\"{len(cases)}\" "
                   f"failures=\"{failed}\">")
        for c in cases:
            out.append(f"    <testcase classname={quoteattr(c.classname)} "
                       f"name={quoteattr(c.name)}>")
            if c.failure is not None:
                out.append(f"      <failure message={quoteattr(c.failure)}/>")
            out.append("    </testcase>")
        out.append("  </testsuite>")
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


def write(path: Path, suites: Mapping[str, Sequence[Case]]) -> None:
    Path(path).write_text(render(suites))
