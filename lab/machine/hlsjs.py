"""hls.js for the browser viewer, fetched from the npm registry without npm.

A plain Debian 12 has no ``npm`` (Debian's pulls in Node.js and some 300 packages to fetch
one file). The browser viewer needs only hls.js's built ``dist/hls.min.js``: this fetches
the pinned release's tarball from the registry, checks it against the registry's own
``integrity`` (sha512) pinned here, and unpacks only the files the lab uses, in the layout
``npm install --prefix DIR hls.js@VERSION`` leaves (``DIR/node_modules/hls.js``), so an
install made either way is the same to the lab. Standard library only: ``lab/setup.sh``
runs it with Debian's Python before any environment exists.

``python3 lab/machine/hlsjs.py ensure DIR``: exit 0 when present or installed, 1 (one
line on stderr) when it could not be fetched; the streaming runs then skip the browser.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import sys
import tarfile
import urllib.request
from pathlib import Path

VERSION = "1.7.4"
#: The registry's ``dist.integrity`` of hls.js 1.7.4 (``npm view hls.js@1.7.4 dist``).
INTEGRITY = ("sha512-3GlxGdPvT2YHvQYOt+yOzT/DEior/qJVNIylHA77kgeoBTdQQqi70GwefNEUmHQeNGyjC8U62"
             "+bruqW/Tpm+tg==")
#: What the lab uses of the package (the tarball's paths, under ``package/``).
FILES = ("package.json", "LICENSE", "dist/hls.min.js")
TIMEOUT_S = 60


def registry() -> str:
    """npm's own setting where one is made (a mirror), else the public registry."""
    return os.environ.get("NPM_CONFIG_REGISTRY", "https://registry.npmjs.org").rstrip("/")


def present(pkg: Path) -> bool:
    try:
        have = json.loads((pkg / "package.json").read_text()).get("version")
    except (OSError, ValueError):
        return False
    return have == VERSION and (pkg / "dist" / "hls.min.js").stat().st_size > 0


def verified(data: bytes) -> bool:
    algo, _, want = INTEGRITY.partition("-")
    return base64.b64encode(hashlib.new(algo, data).digest()).decode() == want


def ensure(prefix: Path) -> str:
    """hls.js under ``prefix/node_modules/hls.js``; what was done, as one line."""
    pkg = prefix / "node_modules" / "hls.js"
    if present(pkg):
        return f"hls.js {VERSION} present"
    url = f"{registry()}/hls.js/-/hls.js-{VERSION}.tgz"
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
        data = resp.read()
    if not verified(data):
        raise ValueError(f"{url}: does not match the pinned integrity {INTEGRITY[:20]}...")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for name in FILES:
            member = tar.getmember(f"package/{name}")
            src = tar.extractfile(member)
            if src is None:
                raise ValueError(f"{url}: package/{name} is not a file")
            dest = pkg / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".part")
            tmp.write_bytes(src.read())
            tmp.replace(dest)
    return f"hls.js {VERSION} installed into {prefix} (from {url}, sha512 checked)"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "ensure":
        print("usage: hlsjs.py ensure DIR", file=sys.stderr)
        return 2
    try:
        print(ensure(Path(argv[1])))
    except (OSError, ValueError, KeyError, tarfile.TarError) as exc:
        print(f"hls.js could not be fetched: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
