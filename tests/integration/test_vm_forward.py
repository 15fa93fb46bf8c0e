"""The guest's half of `fabriclab vm run --live`, on this machine's kernel, without a VM.

A network namespace stands in for the guest: a veth end with the forwarding device's MAC is
its device, the other end plays QEMU's user network (10.0.2.2). The guest's step
(``vmnet.guest_step``) runs in it as is; a server listening on the namespace's own loopback
must then answer a connection to the guest's address on that device, as QEMU's forward
makes one. The whole lane (`make test-vm`) does the same through QEMU in
tests/vm/test_vm_live.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from lab.machine import vmnet

NS, HOST_END, GUEST_END = "fctfwd", "fctfwdh", "fctfwdg"
PORT = 8765


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def guest() -> Iterator[str]:
    """The stand-in guest's namespace; removed with its veth pair afterwards."""
    sh("ip", "netns", "add", NS)
    try:
        sh("ip", "link", "add", HOST_END, "type", "veth", "peer", "name", GUEST_END)
        sh("ip", "link", "set", GUEST_END, "netns", NS)
        sh("ip", "netns", "exec", NS, "ip", "link", "set", GUEST_END, "address", vmnet.MAC)
        sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
        sh("ip", "addr", "add", f"{vmnet.GATEWAY}/24", "dev", HOST_END)
        sh("ip", "link", "set", HOST_END, "up")
        yield NS
    finally:
        subprocess.run(["ip", "link", "del", HOST_END], capture_output=True)
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status


def test_the_guest_step_sends_the_forwarded_port_to_the_guests_loopback(guest, tmp_path):
    (tmp_path / "index.html").write_text("live")
    server = subprocess.Popen(["ip", "netns", "exec", guest, sys.executable, "-m",
                               "http.server", str(PORT), "--bind", "127.0.0.1",
                               "--directory", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://{vmnet.GUEST_ADDR}:{PORT}/"
        time.sleep(1.0)
        # Before the step the device has no address: nothing answers.
        with pytest.raises(OSError):
            get(url)
        r = subprocess.run(["ip", "netns", "exec", guest, "bash", "-c",
                            "set -e\n" + vmnet.guest_step(PORT)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 10
        while True:
            try:
                assert get(url) == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "the forwarded port never answered"
                time.sleep(0.2)
        # Only that port is sent on: another one on the device reaches nothing.
        with pytest.raises(OSError):
            get(f"http://{vmnet.GUEST_ADDR}:{PORT + 1}/")
    finally:
        server.kill()
        server.wait()
