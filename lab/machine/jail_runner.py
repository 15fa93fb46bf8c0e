"""The process a file the lab did not write runs in (in the jail, ``lab.machine.jail``).

``python -m lab.machine.jail_runner MODE FILE IN.json OUT.json``. MODE ``policy``: load the
policy file as the controller does (``controllers.policies.load_file``) and ask ``choose()``
about the run's own flows at the exercise's switches. MODE ``analysis``: import the file and
call its function on the given input. Either way OUT.json says ``{"ok": true, "value": ...,
"seconds": ...}`` or ``{"ok": false, "error": "one line"}``; an answer that loops is the
parent's to stop (it kills this process's whole session). MODE ``serve`` (``FILE`` only):
answer requests about the policy on standard input and output
(``controllers.policies.remote.serve``) until the asker closes its end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from controllers.policies.remote import where


def decide(spec: str, given: dict[str, Any]) -> dict[str, Any]:
    """``spec``: ``file.py`` or ``file.py:Class``, as the controller takes it."""
    from controllers.policies import FlowKey, load_file
    cls = load_file(spec)
    policy = cls(seed=given["seed"])
    flows = [FlowKey(*f) for f in given["flows"]]
    n = 0
    t0 = time.monotonic()
    if policy.granularity != "switch":
        for switch, ports in given["probes"]:
            for flow in flows:
                key = flow if policy.granularity == "flow" else FlowKey(flow.src, flow.dst,
                                                                        0, 0, 0)
                port = policy.choose(key, switch, ports)
                if port not in ports:
                    raise ValueError(f"choose() returned {port!r} at {switch}, not one of "
                                     f"{ports}")
                policy.placed(key, switch, port, None)
                n += 1
    return {"value": n, "seconds": time.monotonic() - t0}


def call(path: Path, given: dict[str, Any]) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("answer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(module)
    fn = getattr(module, given["function"], None)
    if not callable(fn):
        raise AttributeError(f"the file defines no function {given['function']}()")
    arg = Path(given["argument"])
    t0 = time.monotonic()
    value = fn(json.loads(arg.read_text()) if given["load_json"] else arg)
    seconds = time.monotonic() - t0
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise TypeError(f"{given['function']}() returned a {type(value).__name__}, which "
                        f"is not plain data (str, number, dict, list, None)") from None
    return {"value": value, "seconds": seconds}


def main(argv: list[str]) -> int:
    if argv[0] == "serve":
        from controllers.policies import remote
        return remote.main(argv[1:])
    mode, file, given_path, out_path = argv
    me = os.getpid()
    from controllers.policies import split_file_spec
    # A policy may be named file.py:Class; the answer's own lines are the file's.
    path = Path(split_file_spec(file)[0]).resolve()
    given = json.loads(Path(given_path).read_text())
    try:
        out = {"ok": True, **(decide(file, given) if mode == "policy" else call(path, given))}
    except BaseException as exc:       # the answer's failure is the verdict
        msg = str(exc).split(": ", 1)[-1] if type(exc).__name__ == "PolicyFileError" \
            else where(exc, path)
        out = {"ok": False, "error": msg}
    if os.getpid() != me:           # a process the answer forked: the answer is not its
        os._exit(0)
    tmp = Path(f"{out_path}.tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(out_path)           # whole or not at all, whatever else is still running
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
