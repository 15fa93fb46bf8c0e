"""A policy in a user's file, asked across a channel instead of run in the asker's process.

A policy file is code the lab did not write: a student's answer, an engineer's experiment.
The lab and its controller run as root, so they do not import it. The file is loaded in a
jail (unprivileged, no network, its own file system; the lab starts it) by :func:`serve`,
and the asker holds a :class:`RemotePolicy` subclass built from the file's own class
attributes, whose ``choose``, ``placed`` and ``observe_ports`` are requests over one
stream socket. Everything that resolves a policy (``controllers.policies.resolve``) gets
that class through :func:`controllers.policies.set_file_loader`, so the controller, the
offline model and the pre-run check ask the same decisions of the same code.

The protocol is one JSON object per line each way, every request numbered and every reply
carrying its number (a controller killed mid-request leaves a reply its successor must
skip). Calls block: a decision is a function call the asker would otherwise have made in
its own process, and it is bounded by ``CALL_TIMEOUT_S``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from controllers.policies.base import FlowKey, HashPolicy

#: How long one request may take before the asker gives up on it (a policy stuck in a loop
#: fails its caller instead of freezing it).
CALL_TIMEOUT_S = 5.0
#: A policy's class attributes the asker needs without asking (its contract).
CLASS_ATTRS = ("name", "granularity", "idle_timeout", "port_stats_interval", "decides_ahead")


class PolicyCallError(RuntimeError):
    """A policy file's code failed, or answered what it may not, in the jail."""


class Channel:
    """The asker's end: numbered requests over a connected stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(CALL_TIMEOUT_S)
        self.rfile = sock.makefile("rb")
        # Numbered from this process's id: a successor on the same socket (a controller
        # restarted) never takes its predecessor's late reply for its own.
        self.next_id = os.getpid() << 32

    def call(self, op: str, **args: Any) -> Any:
        self.next_id += 1
        rid = self.next_id
        self.sock.sendall(json.dumps({"id": rid, "op": op, **args}).encode() + b"\n")
        while True:
            try:
                line = self.rfile.readline()
            except TimeoutError:
                raise PolicyCallError(f"{op}: no answer within {CALL_TIMEOUT_S:g} s (an "
                                      f"endless loop?)") from None
            if not line:
                raise PolicyCallError(f"{op}: the policy's jail ended")
            reply = json.loads(line)
            if reply.get("id") == rid:
                break                   # earlier ids: replies to an asker that was killed
        if not reply.get("ok"):
            raise PolicyCallError(str(reply.get("error")))
        return reply.get("value")


class RemotePolicy(HashPolicy):
    """A policy whose decisions are made across ``channel``; subclassed per file."""

    channel: ClassVar[Channel]
    #: The ``file.py[:Class]`` the class was resolved from (``policies.spec_of``).
    file_spec: ClassVar[str] = ""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.handle = self.channel.call("new", seed=seed)

    def choose(self, flow: FlowKey, switch: str, ports: Sequence[int]) -> int:
        port = self.channel.call("choose", obj=self.handle, flow=list(astuple(flow)),
                                 switch=switch, ports=list(ports))
        if isinstance(port, bool) or port not in ports:
            raise PolicyCallError(f"choose() returned {port!r} at {switch}, not one of "
                                  f"{list(ports)}")
        return int(port)

    def placed(self, flow: FlowKey, switch: str, port: int, rate_bps: float | None) -> None:
        self.channel.call("placed", obj=self.handle, flow=list(astuple(flow)), switch=switch,
                          port=port, rate=rate_bps)

    def observe_ports(self, switch: str, tx_bps: dict[int, float]) -> None:
        self.channel.call("observe", obj=self.handle, switch=switch,
                          tx={str(p): r for p, r in tx_bps.items()})


def _observe_jobs(self: RemotePolicy, jobs: Mapping[FlowKey, str]) -> None:
    """The optional hook, on the classes whose file defines it (the lab looks for it)."""
    self.channel.call("jobs", obj=self.handle,
                      jobs=[[list(astuple(k)), job] for k, job in jobs.items()])


def remote_class(channel: Channel, spec: str, shown: str = "") -> type[HashPolicy]:
    """The policy class the jail loaded, as a ``RemotePolicy`` subclass with the file's own
    class attributes, held to the same contract as any policy (they come from the file).
    ``shown``: the file as its user named it, which the jail's errors then say."""
    from controllers.policies import _check_class, split_file_spec
    shown = shown or split_file_spec(spec)[0]
    info = channel.call("hello", shown=shown)
    attrs: dict[str, Any] = {k: info[k] for k in CLASS_ATTRS}
    attrs["channel"] = channel
    if info.get("observe_jobs"):
        attrs["observe_jobs"] = _observe_jobs
    attrs["file_spec"] = f"{Path(split_file_spec(spec)[0]).expanduser().resolve()}:{info['class']}"
    cls = type(str(info["class"]), (RemotePolicy,), attrs)
    try:
        _check_class(cls, f"policy-file: {shown}: class {cls.__name__}")
    except TypeError as exc:
        raise PolicyCallError(str(exc)) from None
    if not isinstance(cls.decides_ahead, bool):
        raise PolicyCallError(f"policy-file: {shown}: decides_ahead must be a bool")
    return cls


def fd_loader(fd: int) -> Callable[[str], type[HashPolicy]]:
    """``policies.resolve``'s loader in a controller the lab handed a jail's socket
    (``fd``, inherited): the one file that jail loaded, asked there."""
    loaded: dict[str, type[HashPolicy]] = {}

    def load(spec: str) -> type[HashPolicy]:
        if not loaded:
            loaded[spec] = remote_class(Channel(socket.socket(fileno=fd)), spec)
        if spec not in loaded:
            raise PolicyCallError(f"policy-file: {spec}: the jail on fd {fd} holds "
                                  f"{next(iter(loaded))}")
        return loaded[spec]
    return load


def where(exc: BaseException, path: Path) -> str:
    """``Type: message (file.py line N)``, on one line: the file's own line where its code
    went wrong (the jail's runner says a graded answer's failure the same way)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve() == path]
    at = f" ({path.name} line {frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{at}".replace("\n", " ")


# -- the jail's end ----------------------------------------------------------------------------

def _answer(spec: str, policies: dict[int, HashPolicy], msg: dict[str, Any],
            load: Callable[[str], type[HashPolicy]]) -> Any:
    op = msg["op"]
    if op == "hello":
        cls = load(spec)
        return {"class": cls.__name__, "observe_jobs": callable(getattr(cls, "observe_jobs", None)),
                **{k: getattr(cls, k) for k in CLASS_ATTRS}}
    if op == "new":
        handle = len(policies) + 1
        policies[handle] = load(spec)(seed=msg["seed"])
        return handle
    policy = policies[msg["obj"]]
    if op == "choose":
        return policy.choose(FlowKey(*msg["flow"]), msg["switch"], msg["ports"])
    if op == "placed":
        return policy.placed(FlowKey(*msg["flow"]), msg["switch"], msg["port"], msg["rate"])
    if op == "observe":
        return policy.observe_ports(msg["switch"], {int(p): r for p, r in msg["tx"].items()})
    if op == "jobs":
        return policy.observe_jobs({FlowKey(*k): job for k, job in msg["jobs"]})
    raise ValueError(f"unknown request {op!r}")


def serve(spec: str, rfile: BinaryIO, wfile: BinaryIO) -> None:
    """Answer requests about the policy ``spec`` until the asker closes its end: run in the
    jail, the only place the file's code runs. Whatever the code raises is the reply, in
    one line naming the file's line, and the loop goes on."""
    from controllers.policies import PolicyFileError, load_file, split_file_spec
    jailed = split_file_spec(spec)[0]
    path = Path(jailed).resolve()
    shown = jailed
    policies: dict[int, HashPolicy] = {}
    for line in rfile:
        msg = json.loads(line)
        shown = msg.get("shown", shown)
        try:
            reply = {"id": msg["id"], "ok": True,
                     "value": _answer(spec, policies, msg, load_file)}
            json.dumps(reply)
        except PolicyFileError as exc:
            reply = {"id": msg["id"], "ok": False, "error": str(exc)}
        except Exception as exc:    # the file's failure is the reply
            reply = {"id": msg["id"], "ok": False, "error": f"{msg['op']}: {where(exc, path)}"}
        if not reply["ok"]:         # the file as its user named it, not where the jail has it
            reply["error"] = reply["error"].replace(jailed, shown)
        wfile.write(json.dumps(reply).encode() + b"\n")
        wfile.flush()


def main(argv: list[str]) -> int:
    """``serve`` on this process's standard input and output; what the file prints goes to
    standard error instead, so it cannot garble a reply."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(argv[0], sys.stdin.buffer, out)
    return 0
