"""The collective kind's part of the live view: a lane per training rank (the synthetic
ring's or DDP's), its step parts (data wait, compute, exposed communication, barrier) as
they happen, beside the uplinks.

Why files and a poller, as the streaming kind's viewers do: the ranks are processes in the
hosts' namespaces, and only they know when a step crosses from one part to the next. With
``--live-file`` (given only while a live view is on) each rank rewrites a small JSON file
with its recent parts at most every half second (``lab.agents.workerbase.LiveParts``); a thread of
the lab reads the files at the same pace and hands the lanes to the live feed
(:meth:`lab.measure.live.Feed.set_lanes`). The ranks stamp ``time.monotonic()`` (less the
head's offset over a cluster, none on one machine), one clock for every namespace of a
kernel, so their spans are already on the feed's clock. Without a live view nothing of this
runs: no option, no file, no thread.

A rank whose file lives on another machine of a cluster is not read: its lane is missing,
nothing else changes.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from lab.measure import live

#: The states a rank's spans may have: the step's parts, as the ranks name them.
STATES = ("data_wait", "compute", "exposed_comm", "barrier")


def live_path(work: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its live file."""
    return work / f"rank{rank}.live.json"


def live_file_args(work: Path, rank: int) -> list[str]:
    """``--live-file`` for a training rank while a live view is on; else nothing."""
    if live.current() is None:
        return []
    return ["--live-file", str(live_path(work, rank))]


def spans_of(doc: dict[str, Any]) -> tuple[live.Span, ...]:
    """A rank's live file as a lane's spans; a state it does not know is left out."""
    out: list[live.Span] = []
    for state, a, b in doc.get("spans") or []:
        if state in STATES:
            out.append((str(state), float(a), None if b is None else float(b)))
    return tuple(out)


def read_lanes(files: list[tuple[int, Path]]) -> list[live.Lane]:
    """The lanes of the ranks that have written (``(rank, path)``); a file that cannot be
    read this round (mid-rename never: it is renamed whole) keeps no lane this round."""
    lanes = []
    for rank, path in files:
        try:
            doc = json.loads(path.read_text())
            lanes.append(live.Lane(f"rank:{rank}", f"rank {rank}", spans_of(doc),
                                   float(doc["now"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return lanes


def rank_lanes(work: Path, ranks: int) -> AbstractContextManager[None]:
    """For the body (the wait for the job's ranks), publish the ranks' lanes to the live
    feed, if there is one."""
    files = [(r, live_path(work, r)) for r in range(ranks)]
    return live.polling_lanes(lambda: read_lanes(files))
