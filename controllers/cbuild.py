"""C programs the lab and the controller build on the machine that runs them: compiled once
per source.

Why here and not at set-up: a program's file is named by the sha256 of its sources and
flags, so an edited source rebuilds on its next use and an unchanged one is reused, with no
step for a user to forget; the same call works on this machine, in the VM and on a cluster's
workers (each has clang from ``lab/packages.txt``). Why in ``controllers``: the controller
builds what it runs (the ECN marker's BPF object, pfcd) and never imports the lab, while
the lab, its tests and benchmarks may import this. Pure stdlib.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

#: Where built programs are kept when the caller names no directory: a cache on the root
#: filesystem, beside the lab's other caches. Not the state directory under /run: on a
#: machine with systemd (a plain Debian 12, the VM lane's guests, the Vagrant box) /run is a
#: tmpfs mounted noexec, and a program built there cannot be run. A program's name is its
#: sources' digest, so the cache outlives a reboot safely.
BUILD_DIR = Path(os.environ.get("FABRICLAB_BUILD_CACHE", "/var/cache/fabriclab/build"))
CFLAGS = ("-O2", "-g", "-Wall", "-Wextra", "-Werror", "-std=gnu11")
_TIMEOUT_S = 180
#: Characters ``str.splitlines`` breaks at, each shown as its escape: the compiler's
#: message is several lines, the error stays one.
_LINE_BREAKS = str.maketrans({c: repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


class BuildError(ValueError):
    """clang could not build a program: one line, ``NAME: `command` failed: why``."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}".translate(_LINE_BREAKS))


def build(name: str, sources: Sequence[Path], *, shared: bool = False,
          flags: Sequence[str] = (), build_dir: Path | None = None) -> Path:
    """The executable (or, with ``shared``, the shared library) ``name`` built from
    ``sources`` with the lab's warnings as errors; headers beside them count towards the
    digest, so editing one rebuilds."""
    argv = [*CFLAGS, *(("-shared", "-fPIC") if shared else ()), *flags]
    return _compile(name, sources, argv, ".so" if shared else "", build_dir)


def compile_object(name: str, source: Path, *, flags: Sequence[str],
                   build_dir: Path | None = None) -> Path:
    """The object file (``clang -c``) ``name``.o from one ``source``, with exactly
    ``flags``: an object for another target (a BPF program's ``-target bpf``) takes no
    host flags of ours."""
    return _compile(name, [source], [*flags, "-c"], ".o", build_dir)


def _compile(name: str, sources: Sequence[Path], argv: list[str], suffix: str,
             build_dir: Path | None) -> Path:
    """Compile ``sources`` with ``argv`` into ``name-DIGEST`` + ``suffix``, unless a file
    of that digest exists; written under a temporary name and renamed, so a concurrent
    build never sees half a file."""
    srcs = [Path(s).resolve() for s in sources]
    headers = sorted({h for s in srcs for h in s.parent.glob("*.h")})
    digest = hashlib.sha256()
    for path in [*srcs, *headers]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(" ".join(argv).encode())
    out_dir = Path(build_dir) if build_dir is not None else BUILD_DIR
    out = out_dir / f"{name}-{digest.hexdigest()[:16]}{suffix}"
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = ["clang", *argv, "-o", str(tmp), *map(str, srcs)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        tmp.unlink(missing_ok=True)
        raise BuildError(name, f"`{' '.join(cmd)}` failed: {e}") from e
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(name, f"`{' '.join(cmd)}` failed: {r.stderr.strip()}")
    os.replace(tmp, out)
    return out
