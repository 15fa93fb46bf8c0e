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

A machine that cannot reach the registry (the VM lane's guest) is given one the way pip is
given a wheelhouse: ``hlsjs.py mirror DIR`` keeps the checked tarball at the registry's own
path under ``DIR``, and ``NPM_CONFIG_REGISTRY=file://DIR`` there makes ``ensure`` install
from it, through the same integrity check.
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


#: The tarball's path under a registry (npm's layout), for a fetch and for a mirror.
TARBALL = f"hls.js/-/hls.js-{VERSION}.tgz"


def fetch() -> tuple[str, bytes]:
    """The pinned tarball from the registry, refused unless it matches the pinned integrity."""
    url = f"{registry()}/{TARBALL}"
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
        data = resp.read()
    if not verified(data):
        raise ValueError(f"{url}: does not match the pinned integrity {INTEGRITY[:20]}...")
    return url, data


def mirror(root: Path) -> str:
    """The checked tarball at its registry path under ``root``: a registry for ``file://``."""
    dest = root / TARBALL
    if dest.is_file() and verified(dest.read_bytes()):
        return f"hls.js {VERSION} mirrored in {root}"
    url, data = fetch()
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    return f"hls.js {VERSION} mirrored in {root} (from {url}, sha512 checked)"


def mirror_or_why(root: Path) -> str:
    """:func:`mirror`, or why not, as one line. A VM image is built either way (its guest
    then has no browser viewer): the image's manifest keeps the line, for its test."""
    root.mkdir(parents=True, exist_ok=True)
    try:
        return mirror(root)
    except (OSError, ValueError) as exc:
        return f"hls.js not mirrored ({type(exc).__name__}: {exc}): no browser viewer"


def ensure(prefix: Path) -> str:
    """hls.js under ``prefix/node_modules/hls.js``; what was done, as one line."""
    pkg = prefix / "node_modules" / "hls.js"
    if present(pkg):
        return f"hls.js {VERSION} present"
    url, data = fetch()
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
    commands = {"ensure": ensure, "mirror": mirror}
    if len(argv) != 2 or argv[0] not in commands:
        print("usage: hlsjs.py ensure|mirror DIR", file=sys.stderr)
        return 2
    try:
        print(commands[argv[0]](Path(argv[1])))
    except (OSError, ValueError, KeyError, tarfile.TarError) as exc:
        print(f"hls.js could not be fetched: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
