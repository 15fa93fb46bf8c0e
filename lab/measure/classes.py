"""Per traffic class counters of ports: each class's leaf queue, as ``tc -s qdisc`` has it.

A port with traffic classes (``controllers.classes``) drops, queues and sends per class;
its root qdisc sums them. Which class dropped is the question a lossless fabric is judged
by (the lossless class must drop nothing), so each leaf is read on its own, in every
namespace that holds a port: the switches' (the lab's) and each host's.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from typing import Any

from lab.model.errors import MachineError

#: What is kept of a leaf: tc's own names.
FIELDS = ("bytes", "packets", "drops", "overlimits")

LeafCounters = dict[str, dict[str, dict[str, int]]]


def _parse(text: str, devs: set[str], where: str) -> LeafCounters:
    try:
        qdiscs = json.loads(text or "[]")
    except json.JSONDecodeError as exc:
        raise MachineError("classes", f"{where}: `tc -s -j qdisc show` printed no JSON: "
                           f"{exc}") from None
    out: LeafCounters = {}
    for q in qdiscs:
        if q.get("dev") in devs and not q.get("root"):
            out.setdefault(q["dev"], {})[q["handle"]] = {k: int(q.get(k, 0)) for k in FIELDS}
    return out


def leaf_counters(ports: Iterable[tuple[Any, str]]) -> LeafCounters:
    """{device: {leaf handle: counters}} of the ports (node, device): one ``tc`` per
    namespace (the lab's for a switch's port, a host's own for its NIC)."""
    by_node: dict[Any, set[str]] = {}
    for node, dev in ports:
        by_node.setdefault(node if node.inNamespace else None, set()).add(dev)
    out: LeafCounters = {}
    for node, devs in by_node.items():
        if node is None:
            r = subprocess.run(["tc", "-s", "-j", "qdisc", "show"], capture_output=True,
                               text=True, check=False)
            if r.returncode != 0:
                raise MachineError("classes", f"`tc -s -j qdisc show` failed: {r.stderr}")
            out.update(_parse(r.stdout, devs, "the lab's namespace"))
        else:
            out.update(_parse(node.cmd("tc -s -j qdisc show"), devs, node.name))
    return out


def delta(before: LeafCounters, after: LeafCounters) -> LeafCounters:
    """What each leaf counted between two reads."""
    return {dev: {h: {k: c[k] - before.get(dev, {}).get(h, {}).get(k, 0) for k in FIELDS}
                  for h, c in leaves.items()} for dev, leaves in after.items()}
