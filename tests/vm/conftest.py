"""The full-kernel lane (``make test-vm``): every test here runs against a QEMU guest.

The image is built (or taken from the cache) once per session by the real CLI, as a user
would. The guest runs the lab on a full kernel: OVS's kernel datapath, netem, RED, DCTCP.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.support import assert_nothing_left_behind

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "lab.cli"]


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vm)
            if os.geteuid() != 0 or not shutil.which("qemu-system-x86_64"):
                item.add_marker(pytest.mark.skip(reason="the VM lane needs root and QEMU "
                                                        "(run: sudo make test-vm)"))


def fabriclab(*args: str, timeout: float = 1800, check: bool = True
              ) -> subprocess.CompletedProcess:
    """The real CLI; its output is printed (pytest shows it on failure)."""
    t = time.monotonic()
    r = subprocess.run(CLI + list(args), cwd=REPO, capture_output=True, text=True,
                       timeout=timeout)
    print(f"$ fabriclab {' '.join(args)}   ({time.monotonic() - t:.1f} s, exit {r.returncode})")
    print(r.stdout)
    print(r.stderr, file=sys.stderr)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="session")
def vm_image() -> dict:
    """The image's manifest, after `fabriclab vm build` built it or found it cached."""
    fabriclab("vm", "build", timeout=3600)
    from lab.machine import vm
    img = vm.cached_image()
    assert img is not None
    return img.manifest


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert_nothing_left_behind()
    from lab.machine import vm
    boots = vm.CACHE_DIR / "boots"
    assert not (boots.is_dir() and any(boots.iterdir())), list(boots.iterdir())


def load(path: Path) -> dict:
    return json.loads(path.read_text())
