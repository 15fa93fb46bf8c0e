"""The live view of a running run: a page on 127.0.0.1 that draws the weathermap's fabric and
colours every link by its utilisation over the last half second, about twice a second, with
the phase, the clocks and a bar per uplink; and, while a kind publishes lanes (the streaming
kind's viewers: ``lab.kinds.streaming.liveview``; the collective kind's ring ranks:
``lab.kinds.collective.liveview``), one figure under it on the phase's clock: the uplinks'
utilisation since the phase began on top, a lane per viewer or rank coloured by its state
below (waiting for the first picture, playing, stalled; a step's data wait, compute, exposed
communication, barrier), as the reports' figures have them (``lab.kinds.streaming.plots``,
``lab.kinds.collective.gpuplot``). One drawing for every lane: a kind adds states, not code.

Why this shape: the layout is the weathermap's own (``lab.plotting.weathermap``: tiers,
networkx's tiered layout, each direction of a cable bent off the straight line as matplotlib
bends it), computed once here and put into the page as JSON, so the live map and the
report's map look alike; the browser only recolours what it was given. The page is one
file with its script and style inline (``live.html``) and fetches nothing but ``/state``
from the server that served it, so it works on a machine with no network. It polls rather
than holding a stream open: every request is short, so stopping the server leaves no
connection behind, and a tab left open finds the next run on the same port by itself.

The server is the standard library's ``ThreadingHTTPServer`` on 127.0.0.1 only (a fixed
port when it is free, else one the kernel picks), in a thread of the run's own process: its
CPU is counted in the run's ``fidelity.lab_cpu_pct`` like the samplers'. ``watching`` stops
it and closes its socket on every exit of the run: normal end, error, Ctrl-C, SIGTERM.
"""

from __future__ import annotations

import errno
import json
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from lab.measure import live
from lab.measure.routerstats import router_ports
from lab.measure.telemetry import fabric_ports
from lab.model.errors import MachineError
from lab.plotting.plots import UTIL_CMAP
from lab.plotting.weathermap import (
    EXTERNAL_TIER,
    HOST_TIER,
    MAP_WIDTH,
    OTHER_TIER,
    TIER_GAP,
    arc_rad,
    arcs_of,
    fabric_of,
    positions,
)

#: Where the page is served when the port is free (else the kernel picks one).
DEFAULT_PORT = 8765
HOST = "127.0.0.1"
#: How often the page asks for the state, in ms: the rates it shows are over 0.5 s.
POLL_MS = 500
#: Colour stops of the utilisation scale 0-100 %, the weathermap's colormap sampled.
CMAP_STOPS = 11
#: Layout units left of the map for the tiers' names.
LABEL_MARGIN = 1.9


def _hex_stops(name: str, n: int) -> list[str]:
    from matplotlib import colormaps
    from matplotlib.colors import to_hex
    cmap = colormaps[name]
    return [to_hex(cmap(i / (n - 1))) for i in range(n)]


def layout(topo_desc: dict[str, Any]) -> dict[str, Any]:
    """The map as the page draws it, in SVG coordinates (layout units, y down): nodes,
    tiers, every direction of every cable as a quadratic curve with its arrowhead, which
    of them are sampled (``id``: the port, as ``lab.measure.live`` names it) and which
    are uplinks (a bar each), and the colour scale."""
    fabric = fabric_of({"topology": topo_desc})
    if fabric is None or not fabric.cables:
        raise MachineError("live", "the topology has no links to show")
    pos = positions(fabric)
    top = (len(fabric.tiers) - 1) * TIER_GAP + 0.7

    def pt(x: float, y: float) -> list[float]:
        return [round(x, 3), round(top - y, 3)]

    rank = {n: r for r, _, names in fabric.tiers for n in names}
    sampled = {(p.node, p.port) for p in fabric_ports(topo_desc)}
    sampled |= {(p.node, p.port) for p in router_ports(topo_desc)}
    arcs = []
    for a in arcs_of(fabric, []):
        (xa, ya), (xb, yb) = pos[a.src], pos[a.dst]
        rad = arc_rad(a, pos)
        # matplotlib's arc3: the control point is the chord's middle moved by rad x (dy, -dx).
        cx, cy = (xa + xb) / 2 + rad * (yb - ya), (ya + yb) / 2 - rad * (xb - xa)
        mx, my = 0.25 * xa + 0.5 * cx + 0.25 * xb, 0.25 * ya + 0.5 * cy + 0.25 * yb
        length = math.hypot(xb - xa, yb - ya) or 1.0
        ux, uy = (xb - xa) / length, (yb - ya) / length       # the tangent at the middle
        s = 0.13
        head = [pt(mx + ux * s, my + uy * s), pt(mx - ux * s * 0.6 - uy * s * 0.6,
                                                 my - uy * s * 0.6 + ux * s * 0.6),
                pt(mx - ux * s * 0.6 + uy * s * 0.6, my - uy * s * 0.6 - ux * s * 0.6)]
        key = (a.src, a.port) if a.port is not None else None
        port = live.port_id(*key) if key in sampled else None
        up = (port is not None and rank[a.src] != HOST_TIER[0]
              and rank[a.src] < rank[a.dst] < EXTERNAL_TIER[0])
        arcs.append({"id": port, "src": a.src, "dst": a.dst, "bw_mbps": a.bw_mbps,
                     "name": f"{a.src}→{a.dst}" + (f" ({a.key + 1})" if a.key else ""),
                     "d": [pt(xa, ya), pt(cx, cy), pt(xb, yb)], "head": head, "uplink": up})
    nodes = [{"name": n, "tier": r, "xy": pt(*pos[n])} for r, _, names in fabric.tiers
             for n in names]
    tiers = [{"label": label, "y": pt(0, i * TIER_GAP)[1]}
             for i, (r, label, _) in enumerate(fabric.tiers) if r != OTHER_TIER[0]]
    return {"nodes": nodes, "tiers": tiers, "arcs": arcs,
            "view": [-LABEL_MARGIN, 0.0, MAP_WIDTH + 0.6 + LABEL_MARGIN, top + 0.7],
            "cmap": _hex_stops(UTIL_CMAP, CMAP_STOPS), "poll_ms": POLL_MS,
            "host_tier": HOST_TIER[0]}


def page_html(title: str, lay: dict[str, Any]) -> bytes:
    """The page: ``live.html`` with the title and the layout put in."""
    text = resources.files("lab.report").joinpath("live.html").read_text(encoding="utf-8")
    # "</" inside the JSON would end the script element early.
    data = json.dumps({"title": title, **lay}).replace("</", "<\\/")
    return text.replace("__TITLE__", _escape(title)).replace("/*LAYOUT*/null", data).encode()


def _escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, page: bytes, feed: live.Feed) -> None:
        self.page, self.feed = page, feed
        super().__init__((HOST, port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        # Only names of this machine's loopback: a page elsewhere that rebinds its own
        # name to 127.0.0.1 must not read the run.
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
        if host not in (HOST, "localhost"):
            self.send_error(403)
            return
        path = self.path.split("?", 1)[0]
        if path == "/":
            body, ctype = self.server.page, "text/html; charset=utf-8"
        elif path == "/state":
            body, ctype = json.dumps(self.server.feed.state()).encode(), "application/json"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Not logged: two requests a second would bury the run's own output."""


def _bind(port: int, page: bytes, feed: live.Feed) -> _Server:
    """The server on ``port`` of 127.0.0.1, or on one the kernel picks if it is taken."""
    try:
        return _Server(port, page, feed)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or port == 0:
            raise MachineError("live", f"cannot listen on {HOST}:{port}: {exc}") from exc
        return _Server(0, page, feed)


@contextmanager
def watching(topo_desc: dict[str, Any], title: str, progress: Callable[[str], None],
             port: int = DEFAULT_PORT) -> Iterator[live.Feed]:
    """Serve the live view of a run for the body; the feed the samplers write is set.

    The URL is said through ``progress`` before the body starts. On any exit the server is
    shut down, its socket closed and its thread joined: no listener is left.
    """
    feed = live.Feed()
    server = _bind(port, page_html(title, layout(topo_desc)), feed)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                              name="fabriclab-live", daemon=True)
    thread.start()
    try:
        progress(f"live view: http://{HOST}:{server.server_address[1]}/ (stops with the run)")
        with live.publishing(feed):
            yield feed
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
