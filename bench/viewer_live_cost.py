"""What ``--live-file`` costs a real viewer: the CPU seconds of ``rtmpview`` and ``hlsview``
(their own process: the summary's ``cpu_s``; ffprobe's apart) watching the lab's clip for
the same time, without and with the live file, on 127.0.0.1 (ffmpeg into the lab's CDN
nginx-rtmp, no fabric).

    bench/viewer_live_cost.py --duration 20 --runs 3

The numbers are the machine's of the moment: on 2 shared cores, repeat, and run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab.kinds.streaming import media  # noqa: E402 - the repo's root first
from tests.unit.media_support import nginx, until  # noqa: E402


def view(agent: str, url: str, duration: float, tmp: Path, live: bool) -> dict[str, float]:
    """One watch; its CPU seconds and how many live writes it made."""
    out = tmp / f"{agent}-{time.monotonic_ns()}.json"
    argv = [sys.executable, "-m", f"lab.agents.{agent}", "--url", url,
            "--duration", f"{duration:g}", "--out", str(out)]
    if agent == "rtmpview":
        argv += ["--fps", "25"]
    if live:
        argv += ["--live-file", str(out.with_suffix(".live.json"))]
    subprocess.run(argv, cwd=REPO, check=True, timeout=duration + 30,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    doc = json.loads(out.read_text())
    return {"cpu_s": float(doc["cpu_s"]), "writes": float(doc.get("live_writes") or 0),
            "stalls": float(doc["streams"][0]["stalls"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=6.0, help="the clip's Mbit/s (big stream: 6)")
    a = ap.parse_args()
    results: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="viewer-live-cost-") as d:
        tmp = Path(d)
        clip = media.clip(a.rate, 25, 1.0, cache=tmp)
        (tmp / "cdn").mkdir()
        with nginx(tmp / "cdn", "cdn") as srv:
            push = subprocess.Popen(
                media.push_argv(clip, f"rtmp://127.0.0.1:{srv.rtmp_port}/live/s"),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            try:
                log = tmp / "cdn" / "error.log"
                until(lambda: "publish: name='s'" in log.read_text(), 10, "published")
                time.sleep(4)  # three HLS segments, so that hlsview starts at once
                urls = {"rtmpview": f"rtmp://127.0.0.1:{srv.rtmp_port}/live/s",
                        "hlsview": f"http://127.0.0.1:{srv.http_port}/hls/s.m3u8"}
                for agent, url in urls.items():
                    for live in [x for _ in range(a.runs) for x in (False, True)]:
                        r = view(agent, url, a.duration, tmp, live)
                        print(json.dumps({"agent": agent, "live_file": live, **r}), flush=True)
                        results.setdefault((agent, live), []).append(r["cpu_s"])
            finally:
                media.stop([push])
    for (agent, live), cpu in sorted(results.items()):
        print(f"{agent:9} live_file={live!s:5} cpu_s median {statistics.median(cpu):.3f} "
              f"over {len(cpu)} watches of {a.duration:g} s: {cpu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
