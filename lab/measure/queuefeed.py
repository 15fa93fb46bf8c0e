"""The switch ports' queues, sample by sample, to a policy that places flows by them.

Adaptive routing reads queues. The lab already samples every port's backlog at its
sampling rate (``telemetry.Sampler``), so a policy that asks for queues
(``observes_queues``) is handed those same samples through the controller's ``queues``
request, with the scenario's threshold: what the policy reacts to is what the run reports.
"""

from __future__ import annotations

import threading
from typing import Any

from controllers import policies
from lab.model.errors import MachineError, ScenarioError

#: The scenario key of the threshold: a port's queue above it is congested.
KEY = "adaptive.threshold_bytes"


def wanted(policy: str) -> bool:
    """Whether ``policy`` (a registered name) reads the ports' queues. A policy file is
    only ever loaded in its jail, so it cannot ask for queues."""
    if policies.is_file_spec(policy):
        return False
    return bool(getattr(policies.resolve(policy), "observes_queues", False))


def threshold(params: dict[str, Any], topo_desc: dict[str, Any]) -> int:
    """The scenario's threshold in bytes (default half the smallest fabric queue), refused
    when no queue of the fabric could ever hold that much."""
    queues = [ln["queue_bytes"] for ln in topo_desc["links"] if ln.get("queue_bytes")]
    smallest = min(queues, default=0)
    value = params.get("adaptive", {}).get("threshold_bytes")
    if value is None:
        return max(1, smallest // 2)
    if queues and value >= smallest:
        raise ScenarioError(KEY, f"{value} B is not below the queue size "
                            f"(topology.queue_bytes: {smallest} B): the queue would never "
                            "pass it, and no flow would ever move")
    return int(value)


class QueueFeed:
    """Called by the sampler with {intf: backlog bytes}; sends them on to the controller.

    A refused or failed request is counted, not raised: the sampler's own series (what the
    run reports) must not stop because the policy's feed did.
    """

    def __init__(self, controller: Any, threshold_bytes: int) -> None:
        self.controller = controller
        self.threshold = threshold_bytes
        self.sent = self.failed = self.moved = 0
        self.last_error = ""
        self._lock = threading.Lock()

    def __call__(self, backlog: dict[str, int]) -> None:
        try:
            reply = self.controller.request({"cmd": "queues", "ports": backlog,
                                             "threshold_bytes": self.threshold}, timeout=2.0)
        except (MachineError, OSError, ValueError) as exc:
            with self._lock:
                self.failed += 1
                self.last_error = str(exc)
            return
        with self._lock:
            self.sent += 1
            self.moved += int(reply.get("moved", 0))

    def report(self, moves: list[dict[str, Any]], t_origin: float = 0.0) -> dict[str, Any]:
        """What the feed sent, and the controller's ``moves`` (its status), their times
        from ``t_origin`` on the monotonic clock (0: the clock's own)."""
        with self._lock:
            return {"threshold_bytes": self.threshold, "samples_sent": self.sent,
                    "samples_failed": self.failed, "moved": self.moved,
                    **({"last_error": self.last_error} if self.failed else {}),
                    "moves": [{**m, "t": round(float(m["t"]) - t_origin, 3)} for m in moves]}


def feed_for(plan_policy: str, controller: Any, params: dict[str, Any],
             topo_desc: dict[str, Any]) -> QueueFeed | None:
    """The feed a run's sampler calls, or None when its policy does not read queues."""
    if controller is None or not wanted(plan_policy):
        return None
    return QueueFeed(controller, threshold(params, topo_desc))
