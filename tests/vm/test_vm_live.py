"""`fabriclab vm run --live`: the run's live view, served in the guest, is read from this
machine's 127.0.0.1 while the run goes on, and nothing listens once the VM is gone.

The page's state is fetched the way the page itself fetches it (``/state``, with the Host
header a browser here sends): the phase it names and the rates it reports come from the
guest's samplers, so a reading with traffic on the links proves the way in works end to end.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.vm.conftest import CLI, REPO, load

URL = re.compile(r"live view: (http://127\.0\.0\.1:(\d+)/)")


def listeners(port: int) -> list[str]:
    """Sockets listening on ``port`` on this machine (``ss``)."""
    out = subprocess.run(["ss", "-Htln", f"sport = :{port}"], capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def read_state(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url + "state", timeout=5) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


@pytest.mark.vm_full              # about 2 minutes under TCG: make test-vm only
def test_the_live_view_in_the_guest_is_read_from_the_host(vm_image, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen([*CLI, "vm", "run", "ecmp-one-pair", "--policy", "hash-l3",
                             "--duration", "30", "--live", "--out", str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[dict] = []
    url = port = None
    deadline = time.monotonic() + 1500
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if url is None:
                m = next((URL.search(ln) for ln in list(lines) if URL.search(ln)), None)
                if m:
                    url, port = m.group(1), int(m.group(2))
                    # QEMU's forward, on this machine's loopback only
                    assert all("127.0.0.1:" in ln for ln in listeners(port)), listeners(port)
            elif (state := read_state(url)) is not None:
                seen.append(state)
                if state["phase"] == "traffic" and max(state["bps"].values(), default=0) > 0:
                    break
            time.sleep(0.5)
        assert proc.wait(timeout=1500) == 0, "".join(lines)[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
    text = "".join(lines)
    print(text[-3000:])
    assert url is not None, "no live view URL printed"
    traffic = [s for s in seen if s["phase"] == "traffic"]
    assert traffic and max(traffic[-1]["bps"].values()) > 0, seen[-5:]
    assert load(out / "result.json")["environment"]["vm"]["accelerator"] in ("kvm", "tcg")
    # The VM is gone, and its forward with it.
    assert listeners(port) == []
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
