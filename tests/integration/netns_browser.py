"""Headless Chromium in a network namespace of its own whose one way out is one TCP port of
this machine's loopback, driven over the DevTools protocol on a pipe.

Why: a page served by the lab on 127.0.0.1 must work with no network at all, so the browser
runs where there is none (as report.html's test renders it under ``unshare --net``). But a
new namespace has its own loopback, where the lab's server is not. A relay bridges the one
port: started in the root namespace, it enters a new one (``unshare``), brings its loopback
up, listens there on the port, starts the browser there, returns to the root namespace
(``setns``) and forwards each connection the browser makes to the same port in the root
namespace. Anything else the page tried to reach does not exist for it.

Run as a script, this file is the relay (``relay``); ``NetnsBrowser`` starts it and talks
to the browser over ``--remote-debugging-pipe`` (JSON messages ending in NUL on fds 3 and
4), so no port is opened for the protocol either.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import fcntl
import itertools
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium-headless-shell")
CLONE_NEWNET = 0x40000000


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def relay(port: int, cdp_in: int, cdp_out: int, browser_args: list[str]) -> int:
    """The relay process (see the module's docstring); returns the browser's exit status."""
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.open("/proc/self/ns/net", os.O_RDONLY)
    if libc.unshare(CLONE_NEWNET) != 0:              # still one thread: the whole process
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    listener = socket.create_server(("127.0.0.1", port))

    def fds_3_and_4() -> None:
        # Out of the way first: either pipe may itself be fd 3 or 4.
        a, b = fcntl.fcntl(cdp_in, fcntl.F_DUPFD, 10), fcntl.fcntl(cdp_out, fcntl.F_DUPFD, 10)
        os.dup2(a, 3)
        os.dup2(b, 4)

    browser = subprocess.Popen(browser_args, pass_fds=(3, 4), preexec_fn=fds_3_and_4,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if libc.setns(root, CLONE_NEWNET) != 0:
        browser.kill()
        raise OSError(ctypes.get_errno(), "setns(root)")
    os.close(root)
    # Stopped, the relay takes its browser with it.
    signal.signal(signal.SIGTERM, lambda *_: (browser.kill(), sys.exit(1)))

    def serve() -> None:
        while True:
            inside, _ = listener.accept()
            try:
                outside = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:                              # the lab's server is gone
                inside.close()
                continue
            outside.settimeout(None)
            for a, b in ((inside, outside), (outside, inside)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return browser.wait()


class NetnsBrowser:
    """The browser in its namespace, at ``url`` (a page on 127.0.0.1:``port``)."""

    def __init__(self, port: int, url: str, profile: Path, size: tuple[int, int]) -> None:
        if CHROMIUM is None:
            raise RuntimeError("chromium-headless-shell is not installed")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                "--remote-debugging-pipe", f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}", url]
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(port), str(to_browser_r), str(from_browser_w),
             *args], pass_fds=(to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._ids = itertools.count(1)
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        self.session = self._attach(url)

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._from_browser, 65536):
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        q = self._replies.get(msg["id"])
                    if q is not None:
                        q.put(msg)

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout: float = 30) -> dict[str, Any]:
        """One protocol command; its result (raises on an error reply)."""
        n = next(self._ids)
        q: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._replies[n] = q
        msg: dict[str, Any] = {"id": n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        reply = q.get(timeout=timeout)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def _attach(self, url: str) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            targets = self.send("Target.getTargets")["targetInfos"]
            page = next((t for t in targets if t["type"] == "page"), None)
            if page is not None:
                return self.send("Target.attachToTarget",
                                 {"targetId": page["targetId"], "flatten": True})["sessionId"]
            time.sleep(0.2)
        raise RuntimeError(f"no page for {url}")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True},
                      self.session)
        return r["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png"}, self.session)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, queue.Empty, OSError):
            self.send("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)

    def __enter__(self) -> NetnsBrowser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



def live_port(run: Any, timeout_s: float) -> int:
    """The port a run started with ``--live`` (a ``RunWatcher``) says its page is on."""
    run.wait_for("live view: ", timeout=timeout_s)
    found = re.search(r"live view: http://127\.0\.0\.1:(\d+)/", run.output())
    assert found is not None, run.output()
    return int(found.group(1))


def live_pages(run: Any, port: int, profile: Path, size: tuple[int, int], read: str,
               watch_s: float = 240) -> Iterator[tuple[NetnsBrowser, dict[str, Any]]]:
    """Read a live run's page over and over (``read``: a script that returns the page's
    state as JSON) in a browser of its own: each read once the page has loaded, with the
    browser (for a screenshot), until the page says the run ended and the run has exited,
    or ``watch_s`` has passed."""
    with NetnsBrowser(port, f"http://127.0.0.1:{port}/", profile, size) as browser:
        deadline = time.monotonic() + watch_s
        while time.monotonic() < deadline:
            page = json.loads(browser.evaluate(read) or "null")
            if page is not None and "state" in page:      # not about:blank any more
                yield browser, page
                if page["state"] == "ended" and run.proc.poll() is not None:
                    return
            time.sleep(0.2)

if __name__ == "__main__":
    sys.exit(relay(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]))
