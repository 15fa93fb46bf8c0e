"""A running fabric's lossless class: the traffic classes on every port, and PFC on them
through the controller (which runs ``pfcd``, ``controllers.pfc``).

Shared by every kind that runs RoCE on the lab's switches (the roce kind's flow groups, the
collective kind's ring on RoCE), so the ports are laid out, pfcd is configured, recorded
and stopped one way. The settings come from ``lab.model.lossless``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lab.model import lossless
from lab.net.links import set_port_layouts

if TYPE_CHECKING:
    from lab.net.fabric import Fabric


class LosslessClass:
    """The fabric's ports with their classes, and PFC on the lossless one when a phase
    asks. ``request`` is the caller's way to the controller (``LabController.request``,
    which raises on a refusal)."""

    def __init__(self, fabric: Fabric, topo: dict[str, Any],
                 request: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.fabric, self.topo, self.request = fabric, topo, request
        self.hosts = {h["name"] for h in topo["hosts"]}
        self.pfc_running = False

    def ends(self) -> list[tuple[Any, str, bool]]:
        """Every shaped end of the fabric: (node, device, is a host's NIC)."""
        out = []
        for ln in self.topo["links"]:
            for n, p in ((ln["a"], ln["a_port"]), (ln["b"], ln["b_port"])):
                node = self.fabric.host(n) if n in self.hosts else self.fabric.net.get(n)
                out.append((node, f"{n}-eth{p}", n in self.hosts))
        return out

    def devices(self) -> list[tuple[Any, str]]:
        """Every shaped end as (node, device): what the per-class counters read."""
        return [(node, dev) for node, dev, _ in self.ends()]

    def classes_on(self, pp: dict[str, Any]) -> None:
        """Traffic classes on every port, sized by ``pp`` (classes are the fabric's, the
        same in every phase: a run lays them once)."""
        rates = {f"{n}-eth{p}": ln["bw_mbps"] for ln in self.topo["links"]
                 for n, p in ((ln["a"], ln["a_port"]), (ln["b"], ln["b_port"]))}
        set_port_layouts([(node, dev, lossless.classes_of(pp, host).tc_commands(
            dev, rates[dev])) for node, dev, host in self.ends()])

    def ns_of(self, node_name: str) -> str:
        """A node's network namespace as pfcd takes it: a host's by its shell's PID, the
        switches' ("-") is the lab's own."""
        if node_name in self.hosts:
            return f"/proc/{self.fabric.host(node_name).pid}/ns/net"
        return "-"

    def pfc_config(self, pp: dict[str, Any]) -> dict[str, Any]:
        """pfcd's configuration for this fabric, hosts by their shells' namespaces."""
        return lossless.pfc_config(self.topo, pp, self.ns_of)

    def feeders(self, pp: dict[str, Any]) -> dict[str, list[str]]:
        """{watched port: the ports that feed it}: how a pause tree is read."""
        return {p["dev"]: [f["dev"] for f in p["feeders"]]
                for p in self.pfc_config(pp)["ports"]}

    def pfc_on(self, pp: dict[str, Any]) -> None:
        """pfcd started by the controller with the phase's thresholds; its PID recorded
        (the controller's child), so an interrupted run kills it by PID."""
        started = self.request({"cmd": "pfc", "config": self.pfc_config(pp)})
        self.pfc_running = True
        self.fabric.record.add_pid(int(started["pid"]), "pfcd (the controller's)")

    def pfc_off(self) -> dict[str, Any] | None:
        """pfcd stopped (every paused class let go); its counters, None if it was not
        running. Stop it only once the hosts' queues have drained: a paused host queue let
        go at once would flood the switch."""
        if not self.pfc_running:
            return None
        self.pfc_running = False
        return self.request({"cmd": "pfc", "off": True}).get("counters")
