"""The controller's config file, as the lab writes it, checked once at start-up.

The controller never discovers the topology: the lab knows it exactly (it built it) and a
learning controller would add its own timing and flooding to every measurement. So a
config mistake must stop the controller at start with a message naming the field, not
surface later as a silently unreachable host.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from controllers import policies

#: Set by ``controllers.launch`` from ``--config``; read by the app at instantiation.
CONFIG_ENV = "FABRICLAB_CONTROLLER_CONFIG"
MAX_PORT = 0xFFFFFF00            # OFPP_MAX: above it OpenFlow port numbers are reserved


class ConfigError(ValueError):
    """A config file the controller cannot run with; the message starts with the field."""


@dataclass(frozen=True)
class Switch:
    name: str
    dpid: int


@dataclass(frozen=True)
class Host:
    """A host, or a router's fabric-facing interface (``gateway``).

    A gateway also receives traffic for addresses outside the fabric: hosts send it to the
    gateway's MAC (their next hop), so the fabric forwards frames addressed to that MAC
    towards the gateway, whatever their destination IP.
    """

    name: str
    ip: str
    mac: str
    switch: str
    port: int
    gateway: bool = False


@dataclass(frozen=True)
class Link:
    """A switch-to-switch link; host attachments are in ``Host``."""

    a: str
    a_port: int
    b: str
    b_port: int


@dataclass(frozen=True)
class Port:
    """A switch egress port and the queue the lab configured on it (rate, byte limit).

    The controller needs both to program ECN marking: a marker that models the queue must
    drain it at the port's rate and cap it at the port's limit.
    """

    switch: str
    port: int
    intf: str
    rate_bps: int
    limit_bytes: int


#: ECN marking mechanisms the controller can program (``controllers.ecn``), or none.
ECN_MECHANISMS = ("red", "tc-bpf", "none")


@dataclass(frozen=True)
class Config:
    policy: str
    seed: int
    control_socket: str
    switches: tuple[Switch, ...]
    hosts: tuple[Host, ...]
    links: tuple[Link, ...]
    ports: tuple[Port, ...] = ()
    ecn_mechanism: str = "none"
    build_dir: str = ""
    #: Where a policy file's jail answers (an inherited socket), when the lab started one:
    #: the file is then asked there (``controllers.policies.remote``), never run here.
    policy_fd: int | None = None

    def switch_by_dpid(self) -> dict[int, str]:
        return {s.dpid: s.name for s in self.switches}

    def topology(self) -> dict[str, list[dict[str, Any]]]:
        """The plain-dict form ``controllers.routing`` and ``controllers.plan`` take."""
        return {"switches": [asdict(s) for s in self.switches],
                "hosts": [asdict(h) for h in self.hosts],
                "links": [asdict(lk) for lk in self.links]}


def build(topo_desc: dict, policy: str, seed: int, gateways: frozenset[str] = frozenset(),
          ecn: str = "none", build_dir: str = "") -> dict[str, object]:
    """The config the lab writes for a topology description (``lab.net.topologies.describe``):
    what the controller needs to program L3 ECMP forwarding, no guessing on its side. Built
    here, beside ``parse``, so the file's two ends are one contract.

    ``gateways`` are hosts that route for addresses outside the fabric (a router's
    fabric-facing interface): frames sent to their MAC are forwarded to them.
    """
    switch_names = {s["name"] for s in topo_desc["switches"]}
    hosts = []
    fabric_links = []
    for link in topo_desc["links"]:
        a, b = link["a"], link["b"]
        if a in switch_names and b in switch_names:
            fabric_links.append({k: link[k] for k in ("a", "a_port", "b", "b_port")})
        else:
            host, sw, port = (a, b, link["b_port"]) if b in switch_names else (b, a,
                                                                                link["a_port"])
            hosts.append((host, sw, port))
    by_name = {h["name"]: h for h in topo_desc["hosts"]}
    switch_ports = [{"switch": node, "port": port, "intf": f"{node}-eth{port}",
                     "rate_bps": int(link["bw_mbps"] * 1e6), "limit_bytes": link["queue_bytes"]}
                    for link in topo_desc["links"]
                    for node, port in ((link["a"], link["a_port"]), (link["b"], link["b_port"]))
                    if node in switch_names]
    return {
        "ports": switch_ports, "ecn": {"mechanism": ecn, "build_dir": build_dir},
        "policy": policy, "seed": seed,
        "switches": [{"name": s["name"], "dpid": s["dpid"]} for s in topo_desc["switches"]],
        "hosts": [{"name": h, "ip": by_name[h]["ip"], "mac": by_name[h]["mac"], "switch": sw,
                   "port": port, "gateway": h in gateways} for h, sw, port in hosts],
        "links": fabric_links,
    }


def _get(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise ConfigError(f"{where}.{key}: missing")
    return obj[key]


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"{where}: {value} is out of range {lo}..{hi}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _ipv4(value: Any, where: str) -> str:
    try:
        return str(ipaddress.IPv4Address(_str(value, where)))
    except ipaddress.AddressValueError:
        raise ConfigError(f"{where}: {value!r} is not a dotted IPv4 address") from None


def _mac(value: Any, where: str) -> str:
    text = _str(value, where).lower()
    parts = text.split(":")
    if len(parts) != 6 or not all(len(p) == 2 and all(ch in "0123456789abcdef" for ch in p)
                                  for p in parts):
        raise ConfigError(f"{where}: {value!r} is not a MAC address like 00:00:00:00:00:01")
    return text


def _list(obj: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = _get(obj, key, "config")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ConfigError(f"{key}: expected a list of objects")
    return items


def parse(raw: Any) -> Config:
    """Validate a decoded config; extra keys are ignored (the lab may record more)."""
    if not isinstance(raw, dict):
        raise ConfigError("config: expected a JSON object")
    switches = tuple(Switch(_str(_get(s, "name", f"switches[{i}]"), f"switches[{i}].name"),
                            _int(_get(s, "dpid", f"switches[{i}]"), f"switches[{i}].dpid",
                                 1, 2**64 - 1))
                     for i, s in enumerate(_list(raw, "switches")))
    names = [s.name for s in switches]
    if len(set(names)) != len(names):
        raise ConfigError("switches: duplicate switch name")
    if len({s.dpid for s in switches}) != len(switches):
        raise ConfigError("switches: duplicate dpid")
    known = set(names)
    used: set[tuple[str, int]] = set()

    def port_of(sw: str, port: Any, where: str) -> int:
        if sw not in known:
            raise ConfigError(f"{where}: unknown switch {sw!r}")
        p = _int(port, where, 1, MAX_PORT)
        if (sw, p) in used:
            raise ConfigError(f"{where}: port {p} of {sw} is used twice")
        used.add((sw, p))
        return p

    hosts = []
    for i, h in enumerate(_list(raw, "hosts")):
        w = f"hosts[{i}]"
        sw = _str(_get(h, "switch", w), f"{w}.switch")
        gateway = h.get("gateway", False)
        if not isinstance(gateway, bool):
            raise ConfigError(f"{w}.gateway: expected true or false, got {gateway!r}")
        hosts.append(Host(_str(_get(h, "name", w), f"{w}.name"),
                          _ipv4(_get(h, "ip", w), f"{w}.ip"),
                          _mac(_get(h, "mac", w), f"{w}.mac"), sw,
                          port_of(sw, _get(h, "port", w), f"{w}.port"), gateway))
    if len({h.ip for h in hosts}) != len(hosts):
        raise ConfigError("hosts: duplicate IP address")
    links = []
    for i, lk in enumerate(_list(raw, "links")):
        w = f"links[{i}]"
        a = _str(_get(lk, "a", w), f"{w}.a")
        b = _str(_get(lk, "b", w), f"{w}.b")
        if a == b:
            raise ConfigError(f"{w}: a link from {a} to itself")
        links.append(Link(a, port_of(a, _get(lk, "a_port", w), f"{w}.a_port"),
                          b, port_of(b, _get(lk, "b_port", w), f"{w}.b_port")))
    ports = []
    for i, p in enumerate(raw.get("ports", [])):
        w = f"ports[{i}]"
        if not isinstance(p, dict):
            raise ConfigError(f"{w}: expected an object")
        sw = _str(_get(p, "switch", w), f"{w}.switch")
        if sw not in known:
            raise ConfigError(f"{w}.switch: unknown switch {sw!r}")
        ports.append(Port(sw, _int(_get(p, "port", w), f"{w}.port", 1, MAX_PORT),
                          _str(_get(p, "intf", w), f"{w}.intf"),
                          _int(_get(p, "rate_bps", w), f"{w}.rate_bps", 1, 10**12),
                          _int(_get(p, "limit_bytes", w), f"{w}.limit_bytes", 1, 2**31)))
    ecn = raw.get("ecn", {})
    if not isinstance(ecn, dict):
        raise ConfigError("ecn: expected an object")
    mechanism = ecn.get("mechanism", "none")
    if mechanism not in ECN_MECHANISMS:
        raise ConfigError(f"ecn.mechanism: {mechanism!r} is not one of "
                          f"{', '.join(ECN_MECHANISMS)}")
    build_dir = ecn.get("build_dir", "")
    if not isinstance(build_dir, str):
        raise ConfigError(f"ecn.build_dir: expected a path, got {build_dir!r}")
    policy, policy_fd = _policy(raw)
    return Config(policy=policy, seed=_int(raw.get("seed", 0), "seed", -(2**63), 2**63 - 1),
                  control_socket=_str(_get(raw, "control_socket", "config"),
                                      "control_socket"),
                  switches=switches, hosts=tuple(hosts), links=tuple(links),
                  ports=tuple(ports), ecn_mechanism=mechanism, build_dir=build_dir,
                  policy_fd=policy_fd)


def _policy(raw: dict[str, Any]) -> tuple[str, int | None]:
    """The policy, checked here unless it is a file whose jail answers on ``policy_fd``
    (then it is checked there, by ``controllers.launch``, and never run in this process)."""
    policy = _str(_get(raw, "policy", "config"), "policy")
    policy_fd = raw.get("policy_fd")
    if policy_fd is not None:
        policy_fd = _int(policy_fd, "policy_fd", 0, 65535)
        if not policies.is_file_spec(policy):
            raise ConfigError("policy_fd: given for a registered policy, which needs no jail")
        return policy, policy_fd
    try:
        policies.resolve(policy)    # a file given without a jail: the user's own rights
    except policies.UnknownPolicy as exc:
        raise ConfigError(str(exc)) from None
    return policy, None


def load(path: str | os.PathLike[str]) -> Config:
    """Read and validate the config file at ``path``."""
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config: {path} is not JSON: {exc}") from None
    return parse(raw)


def load_from_env() -> Config:
    path = os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"config: {CONFIG_ENV} is not set (start via controllers.launch)")
    return load(path)
