"""The streaming kind's part of the live view: each real viewer's lane (waiting for its first
picture, playing, stalled) beside the uplinks, while a phase plays.

Why files and a poller: the viewers are processes in the hosts' namespaces, and each already
runs the player model (``lab.agents.playout``) over what it received. With ``--live-file``
(given only while a live view is on) each rewrites a small JSON file with its state about
twice a second; a thread of the lab reads those files at the same pace and hands the lanes
to the live feed (``lab.measure.live.Feed.set_lanes``). The viewers' times are
``time.monotonic()`` seconds, and CLOCK_MONOTONIC is one clock for every namespace of a
kernel, so they are already on the feed's clock. Without a live view nothing of this runs:
no option, no file, no thread.

``EdgeLiveView`` is the part of ``lab.kinds.streaming.run.EdgeRun`` that does this.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from lab.kinds.streaming.plan import Stream
from lab.measure import live

#: Each viewer by the middle of its files' names (as ``programs`` names them): its key in a
#: stream's ``players`` in result.json (the lane's id is ``key:stream id``), and its label.
VIEWERS = {"view": ("rtmp", "RTMP"), "hls": ("hls", "HLS"), "hlsjs": ("hlsjs", "hls.js")}


def live_path(work: Path, stream_id: int, what: str) -> Path:
    """Where the viewer ``what`` (``VIEWERS``) of a stream writes its live file."""
    return work / f"{stream_id}.{what}.live.json"


def spans_of(doc: dict[str, Any]) -> tuple[live.Span, ...]:
    """A viewer's live file as a lane's spans: waiting from its join to its first picture,
    then playing, broken by its stalls, until it ended (or is still on)."""
    first, ended = doc.get("first_picture"), doc.get("ended")
    spans: list[live.Span] = [("waiting", float(doc["join"]),
                               None if first is None else float(first))]
    if first is None:
        return tuple(spans)
    t: float | None = float(first)
    for start, end in doc.get("stalls") or []:
        if t is None:
            break
        if start > t:
            spans.append(("playing", t, float(start)))
        spans.append(("stalled", float(start), None if end is None else float(end)))
        t = None if end is None else float(end)
    if t is not None and (ended is not None or t < float(doc["now"])):
        spans.append(("playing", t, None if ended is None else float(ended)))
    return tuple(spans)


def read_lanes(files: list[tuple[str, str, Path]]) -> list[live.Lane]:
    """The lanes of the files there are (``(id, label, path)``); a viewer that has not
    written yet has no lane, one whose file cannot be read keeps none this round."""
    lanes = []
    for lane_id, label, path in files:
        try:
            doc = json.loads(path.read_text())
            lanes.append(live.Lane(lane_id, label, spans_of(doc), float(doc["now"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return lanes


class EdgeLiveView:
    """The viewers' lanes in the live view (a part of ``EdgeRun``)."""

    def live_file_args(self, work: Path, stream_id: int, what: str) -> list[str]:
        """``--live-file`` for a viewer (``VIEWERS``), while a live view is on; else
        nothing."""
        if live.current() is None or what not in VIEWERS:
            return []
        return ["--live-file", str(live_path(work, stream_id, what))]

    def viewer_lanes(self, work: Path, streams: list[Stream]) -> AbstractContextManager[None]:
        """For the body (the phase's watch), publish the lanes of ``streams``' viewers to
        the live feed, if there is one."""
        # Every viewer a stream may have: the files of those it has not are never there.
        files = [(f"{key}:{s.id}", f"{s.id} {label}", live_path(work, s.stream_id, what))
                 for s in streams for what, (key, label) in VIEWERS.items()]
        return live.polling_lanes(lambda: read_lanes(files))
