"""The jail code the lab did not write runs in: not root, seeing only its input, no network.

A teacher grades a class's files on the lab machine, as root: thirty strangers' programs;
an engineer runs the lab with a policy of their own. ``python lab/machine/jail.py SPEC.json``
is started (``command``) inside new mount, network and PID namespaces (``unshare``,
util-linux: no daemon, no image). As root, still, it builds a root file system of its own on
a tmpfs - the system's ``/usr`` read-only (the Python interpreter and its standard library),
the ``controllers`` package read-only (a policy subclasses its ``HashPolicy``), a copy of the
file and its input read-only, one writable folder (``/work``), a private ``/tmp`` - then
chroots into it, sets resource limits (address space, CPU seconds, processes, file size,
open files), drops to the unprivileged ``nobody`` user with no capabilities and
``no_new_privs``, and only then runs the file through ``lab/machine/jail_runner.py``.

Graded answers run once, on files (``lab.grade.sandbox``). A policy file is loaded once
per asker and then asked for decisions across a socket pair (``PolicyJail``;
``controllers.policies.remote``): by the lab's own process, and by the controller, whose
jail the lab starts and hands over.

So an answer cannot read the reference run or the lab's own diagnosis (neither is in its
file system), cannot write anywhere but ``/work`` and ``/tmp``, reaches no network (its
namespace has only a loopback, down), and a fork bomb stops at the process limit. The
grader's time limit kills the whole namespace.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import pwd
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("jail_runner.py")
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
#: CPU seconds a policy's jail may use over its asker's life (a run, a sweep): a bound on
#: a policy that spins, not on one that decides.
SERVE_CPU_S = 3600.0
#: Seconds a policy's jail has to end by itself once its asker closes the socket.
CLOSE_WAIT_S = 2.0
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
    # A copy, not a bind: the file's own mode (0600 in root's home) would keep nobody out.
    answer = root / ANSWER[1:] / Path(spec["answer"]).name
    answer.parent.mkdir(parents=True)
    shutil.copyfile(spec["answer"], answer)
    answer.chmod(0o444)
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


def drop(timeout_s: float, nice: int) -> None:
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
    os.nice(nice)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    root = Path(spec["root"])
    build(root, spec)
    os.chroot(root)
    os.chdir(WORK)
    drop(float(spec["timeout_s"]), int(spec["nice"]))
    argv = ["python3", "-B", "-s", f"{CODE}/runner.py", spec["mode"], spec["answer_in_jail"]]
    if spec["mode"] != "serve":
        argv += [f"{WORK}/{spec['mode']}-in.json", f"{WORK}/{spec['mode']}-out.json"]
    os.execve("/usr/bin/python3", argv, {"PATH": "/usr/bin", "HOME": WORK, "LANG": "C.UTF-8",
                                         "PYTHONDONTWRITEBYTECODE": "1"})
    return 1                                # not reached: execve replaced this process


def command(mode: str, spec_text: str, work: Path, scratch: Path, timeout_s: float,
            input_path: Path | None = None, nice: int = 19) -> list[str]:
    """The command that runs ``spec_text`` (``file.py[:Class]``) in a jail through the
    runner's ``mode``, with ``work`` (made ``nobody``'s) as its one writable folder and
    ``input_path``, if any, under ``INPUT``. ``nice``: a graded answer's 19 (it competes
    with nothing timed); a policy the controller asks on packets' paths keeps 0."""
    from controllers.policies import split_file_spec
    os.chown(work, *nobody())
    file, cls = split_file_spec(spec_text)
    answer = Path(file).resolve()
    spec = {"root": str(scratch / f"{mode}-root"), "mode": mode, "timeout_s": timeout_s,
            "nice": nice, "answer": str(answer),
            "input": str(input_path) if input_path else None, "work": str(work),
            "answer_in_jail": f"{ANSWER}/{answer.name}" + (f":{cls}" if cls else "")}
    spec_path = scratch / f"{mode}-jail.json"
    spec_path.write_text(json.dumps(spec))
    return ["unshare", "--mount", "--net", "--pid", "--fork", "--kill-child",
            sys.executable, __file__, str(spec_path)]


class PolicyJail:
    """A policy file loaded in a jail of its own, answering requests on ``sock`` until it
    is closed (``controllers.policies.remote.serve``). Its process leads its own session:
    ``close`` kills the session, and with it the jail's PID namespace."""

    def __init__(self, spec_text: str, log: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="fabriclab-policy-"))
        work = self.scratch / "serve-work"
        work.mkdir()
        self.sock, theirs = socket.socketpair()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
               **(env or {})}
        with open(log or os.devnull, "ab") as err:
            self.proc = subprocess.Popen(
                command("serve", spec_text, work, self.scratch, SERVE_CPU_S, nice=0),
                stdin=theirs, stdout=theirs, stderr=err, env=env, cwd=self.scratch,
                start_new_session=True)
        theirs.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        """Its end of the socket first: the jail's loop ends there and ``unshare`` reaps it
        (killed first, the jail's process would be left to init as a zombie of
        ``nobody``'s); then its session, for a policy stuck in a loop or what it forked."""
        with contextlib.suppress(OSError):      # whoever else holds it (a Channel's file)
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=CLOSE_WAIT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)


_OPEN: dict[tuple[str, int, str], tuple[PolicyJail, Any]] = {}


def load_policy(spec_text: str) -> Any:
    """The policy class of ``file.py[:Class]``, loaded in a ``PolicyJail`` and asked across
    its socket: ``controllers.policies.resolve``'s loader in a process running as root
    (``guard_policy_files``). One jail per version of the file, kept until this process
    exits. Errors are ``load_file``'s, naming the file as it was given."""
    from controllers.policies import PolicyFileError, split_file_spec
    from controllers.policies.remote import Channel, PolicyCallError, remote_class
    path_text, cls = split_file_spec(spec_text)
    where = f"policy-file: {path_text}"
    try:
        path = Path(path_text).expanduser().resolve()
        key = (str(path), path.stat().st_mtime_ns, cls)
        path.read_bytes()
    except OSError as exc:
        raise PolicyFileError(f"{where}: cannot read it: {exc.strerror}") from None
    except (RuntimeError, ValueError) as exc:
        raise PolicyFileError(f"{where}: not a usable file name: {exc}") from None
    if key in _OPEN:
        return _OPEN[key][1]
    jail = PolicyJail(f"{path}:{cls}" if cls else str(path))
    try:
        loaded = remote_class(Channel(jail.sock), spec_text, path_text)
    except PolicyCallError as exc:
        jail.close()
        raise PolicyFileError(str(exc) if str(exc).startswith("policy-file:")
                              else f"{where}: {exc}") from None
    if not _OPEN:
        atexit.register(close_all)
    # ``file.py`` and ``file.py:Class`` are one class, as ``load_file`` makes them.
    named = (key[0], key[1], loaded.__name__)
    if named in _OPEN:
        jail.close()
        jail, loaded = _OPEN[named]
    _OPEN[key] = _OPEN[named] = (jail, loaded)
    return loaded


def close_all() -> None:
    """Stop every policy jail this process opened."""
    jails = {id(j): j for j, _ in _OPEN.values()}
    _OPEN.clear()
    for j in jails.values():
        j.close()


def guard_policy_files() -> None:
    """In a process running as root, policy files resolve through ``load_policy``: their
    code runs in a jail, never with the lab's rights. Elsewhere the file runs with the
    user's own rights, in the user's process, as it always could."""
    if os.geteuid() == 0:
        from controllers import policies
        policies.set_file_loader(load_policy)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
