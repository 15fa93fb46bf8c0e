"""hls.js without npm (``lab/machine/hlsjs.py``): a tarball that does not match the pinned
integrity is refused, and nothing is installed from it; a real fetch from the registry
gives the file ``npm install`` gives, and so does a mirror of it (the VM image's)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from lab.machine import hlsjs

NPM_INSTALLED = Path("/var/cache/fabriclab/hlsjs/node_modules/hls.js/dist/hls.min.js")


def tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class _Resp(io.BytesIO):
    def __enter__(self) -> _Resp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def test_a_tarball_not_matching_the_pinned_integrity_is_refused(tmp_path, monkeypatch) -> None:
    evil = tarball({"package.json": json.dumps({"version": hlsjs.VERSION}).encode(),
                    "LICENSE": b"x", "dist/hls.min.js": b"alert(1)"})
    monkeypatch.setattr(hlsjs.urllib.request, "urlopen", lambda url, timeout: _Resp(evil))
    with pytest.raises(ValueError, match="pinned integrity"):
        hlsjs.ensure(tmp_path)
    assert not (tmp_path / "node_modules").exists()
    assert hlsjs.main(["ensure", str(tmp_path)]) == 1


def test_present_means_this_version_with_its_file(tmp_path) -> None:
    pkg = tmp_path / "node_modules" / "hls.js"
    (pkg / "dist").mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps({"version": "1.0.0"}))
    (pkg / "dist" / "hls.min.js").write_text("x")
    assert not hlsjs.present(pkg)
    (pkg / "package.json").write_text(json.dumps({"version": hlsjs.VERSION}))
    assert hlsjs.present(pkg)


@pytest.mark.skipif(not NPM_INSTALLED.exists(), reason="no npm-installed hls.js to compare")
def test_the_registry_fetch_equals_what_npm_installed(tmp_path) -> None:
    line = hlsjs.ensure(tmp_path)
    assert "sha512 checked" in line
    got = tmp_path / "node_modules" / "hls.js" / "dist" / "hls.min.js"
    assert got.read_bytes() == NPM_INSTALLED.read_bytes()
    assert hlsjs.ensure(tmp_path) == f"hls.js {hlsjs.VERSION} present"


@pytest.mark.skipif(not NPM_INSTALLED.exists(), reason="no npm-installed hls.js to compare")
def test_a_mirror_is_a_registry_that_installs_through_the_same_check(tmp_path,
                                                                      monkeypatch) -> None:
    """The VM image's way: the host mirrors the tarball, the offline guest installs from it
    over ``file://``, and a tampered mirror is refused as a tampered registry would be."""
    reg = tmp_path / "registry"
    assert "sha512 checked" in hlsjs.mirror(reg)
    assert hlsjs.mirror(reg) == f"hls.js {hlsjs.VERSION} mirrored in {reg}"
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", f"file://{reg}")
    line = hlsjs.ensure(tmp_path / "guest")
    assert f"from file://{reg}/" in line and "sha512 checked" in line
    got = tmp_path / "guest" / "node_modules" / "hls.js" / "dist" / "hls.min.js"
    assert got.read_bytes() == NPM_INSTALLED.read_bytes()
    (reg / hlsjs.TARBALL).write_bytes(tarball({"dist/hls.min.js": b"alert(1)"}))
    with pytest.raises(ValueError, match="pinned integrity"):
        hlsjs.ensure(tmp_path / "other")
    assert not (tmp_path / "other" / "node_modules").exists()
