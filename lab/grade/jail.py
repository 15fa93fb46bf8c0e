"""The jail an answer's code runs in: not root, seeing only its input, with no network.

A teacher grades a class's files on the lab machine, as root: thirty strangers' programs.
``python -m lab.grade.jail SPEC.json`` is started by the grader inside new mount, network
and PID namespaces (``unshare``, util-linux: no daemon, no image). As root, still, it builds
a root file system of its own on a tmpfs - the system's ``/usr`` read-only (the Python
interpreter and its standard library), the ``controllers`` package read-only (a policy
answer subclasses its ``HashPolicy``), the answer file and its input read-only, one
writable folder (``/work``), a private ``/tmp`` - then chroots into it, sets resource
limits (address space, CPU seconds, processes, file size, open files), drops to the
unprivileged ``nobody`` user with no capabilities and ``no_new_privs``, and only then runs
the answer through ``lab/grade/runner.py``.

So an answer cannot read the reference run or the lab's own diagnosis (neither is in its
file system), cannot write anywhere but ``/work`` and ``/tmp``, reaches no network (its
namespace has only a loopback, down), and a fork bomb stops at the process limit. The
grader's time limit kills the whole namespace.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import resource
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("runner.py")
#: Where things are inside the jail.
CODE, ANSWER, INPUT, WORK = "/code", "/answer", "/input", "/work"
USER = "nobody"
#: The answer's limits: memory (address space) and processes, file size and open files.
#: A gpu-wait result is a few MB as JSON; Python with it parsed stays under 300 MB.
MEMORY_BYTES = 1 << 30
PROCESSES = 64
FILE_BYTES = 64 << 20
OPEN_FILES = 256
TMP_BYTES = 32 << 20
PR_SET_NO_NEW_PRIVS = 38
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000

_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def _mount(source: str, target: str | Path, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    if _libc.mount(source.encode(), str(target).encode(),
                   fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _bind(source: str | Path, target: Path, writable: bool = False,
          device: bool = False) -> None:
    """``source`` at ``target`` (a file or a folder), read-only unless ``writable``; device
    files open only where ``device``."""
    if Path(source).is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    _mount(str(source), target, None, MS_BIND | MS_REC)
    flags = (MS_BIND | MS_REMOUNT | MS_NOSUID | (0 if device else MS_NODEV)
             | (0 if writable else MS_RDONLY))
    _mount("none", target, None, flags)


def build(root: Path, spec: dict[str, Any]) -> None:
    """The jail's file system at ``root`` (in this process's own mount namespace)."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)      # nothing leaks back to the host
    root.mkdir(parents=True, exist_ok=True)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=8m,mode=0755")
    _bind("/usr", root / "usr")
    for name in ("bin", "lib", "lib64", "sbin"):
        if Path(f"/{name}").is_symlink():                # merged /usr, as Debian 12 has
            (root / name).symlink_to(os.readlink(f"/{name}"))
    _bind(REPO / "controllers", root / CODE[1:] / "controllers")
    shutil.copy(RUNNER, root / CODE[1:] / "runner.py")
    _bind(spec["answer"], root / ANSWER[1:] / Path(spec["answer"]).name)
    if spec.get("input"):
        _bind(spec["input"], root / INPUT[1:] / Path(spec["input"]).name)
    _bind(spec["work"], root / WORK[1:], writable=True)
    for dev in ("null", "zero", "urandom"):
        _bind(f"/dev/{dev}", root / "dev" / dev, writable=True, device=True)
    (root / "proc").mkdir()
    _mount("proc", root / "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    (root / "tmp").mkdir()
    _mount("tmpfs", root / "tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={TMP_BYTES},mode=1777")
    _mount("none", root, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def nobody() -> tuple[int, int]:
    """The user and group an answer runs as."""
    user = pwd.getpwnam(USER)
    return user.pw_uid, user.pw_gid


def drop(timeout_s: float) -> None:
    """Limits first (raising a limit later needs what is given up next), then the user."""
    cpu = int(timeout_s) + 2
    for what, n in ((resource.RLIMIT_AS, MEMORY_BYTES), (resource.RLIMIT_CPU, cpu),
                    (resource.RLIMIT_NPROC, PROCESSES), (resource.RLIMIT_FSIZE, FILE_BYTES),
                    (resource.RLIMIT_NOFILE, OPEN_FILES), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(what, (n, n))
    uid, gid = nobody()
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)                 # every uid non-zero: the capabilities are gone
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.nice(19)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    root = Path(spec["root"])
    build(root, spec)
    os.chroot(root)
    os.chdir(WORK)
    drop(float(spec["timeout_s"]))
    argv = ["python3", "-B", "-s", f"{CODE}/runner.py", spec["mode"], spec["answer_in_jail"],
            f"{WORK}/{spec['mode']}-in.json", f"{WORK}/{spec['mode']}-out.json"]
    os.execve("/usr/bin/python3", argv, {"PATH": "/usr/bin", "HOME": WORK, "LANG": "C.UTF-8",
                                         "PYTHONDONTWRITEBYTECODE": "1"})
    return 1                                # not reached: execve replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
