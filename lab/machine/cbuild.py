"""C programs the lab builds on the machine that runs them: compiled once per source.

Why here and not at set-up: a program's object is named by the sha256 of its sources and
flags, so an edited source rebuilds on its next use and an unchanged one is reused, with no
step for a user to forget; the same call works on this machine, in the VM and on a cluster's
workers (each has clang from ``lab/packages.txt``, which the ECN marker needs anyway).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from lab.machine import state
from lab.model.errors import MachineError

#: Where built programs are kept (beside the ECN marker's objects).
BUILD_DIR = state.STATE_DIR / "build"
CFLAGS = ("-O2", "-g", "-Wall", "-Wextra", "-Werror", "-std=gnu11")


def build(name: str, sources: Sequence[Path], *, shared: bool = False,
          flags: Sequence[str] = (), build_dir: Path | None = None) -> Path:
    """The executable (or, with ``shared``, the shared library) ``name`` built from
    ``sources``; headers beside them count towards the digest, so editing one rebuilds."""
    srcs = [Path(s).resolve() for s in sources]
    headers = sorted({h for s in srcs for h in s.parent.glob("*.h")})
    argv = [*CFLAGS, *(("-shared", "-fPIC") if shared else ()), *flags]
    digest = hashlib.sha256()
    for path in [*srcs, *headers]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(" ".join(argv).encode())
    out_dir = Path(build_dir) if build_dir is not None else BUILD_DIR
    out = out_dir / f"{name}-{digest.hexdigest()[:16]}{'.so' if shared else ''}"
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = ["clang", *argv, "-o", str(tmp), *map(str, srcs)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise MachineError(name, f"`{' '.join(cmd)}` failed: {e}") from e
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise MachineError(name, f"`{' '.join(cmd)}` failed: {r.stderr.strip()}")
    os.replace(tmp, out)    # atomic: a concurrent build never sees half a file
    return out
