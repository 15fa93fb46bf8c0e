"""Scenarios are data: a YAML file per scenario folder, validated before anything starts.

A scenario names its ``kind`` (the mechanism in ``lab/kinds/`` that runs it), a topology,
traffic and defaults for policy, duration and seed. ``--set key=value`` overrides any value;
keys are dotted paths (``traffic.flows=16``) or a bare leaf name when that is unambiguous
(``flows=16``). Every bad value is reported naming its field.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab import REPO_ROOT
from lab.model.errors import ScenarioError

#: How deep a scenario file or a ``--set`` value may nest, and how many values it may hold:
#: real scenarios nest 4 deep (``phases.<name>.job.steps``) and hold a few dozen values.
#: The limits turn a YAML alias that contains itself, or a "billion laughs" of aliases,
#: into one clear error instead of a RecursionError or a hang.
MAX_NESTING = 16
MAX_VALUES = 10_000


def scenarios_dir() -> Path:
    return Path(os.environ.get("FABRICLAB_SCENARIOS", REPO_ROOT / "scenarios"))


@dataclass(frozen=True)
class Param:
    """Type and range of one scenario value."""

    type: type
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()

    def check(self, key: str, value: Any) -> Any:
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if (isinstance(value, bool) and self.type is not bool) or not isinstance(value, self.type):
            raise ScenarioError(key, f"expected {self.type.__name__}, got {value!r}")
        if isinstance(value, float) and math.isnan(value):   # NaN passes every comparison
            raise ScenarioError(key, f"expected a number, got {value!r}")
        if self.choices and value not in self.choices:
            raise ScenarioError(key, f"{value!r} is not one of {', '.join(self.choices)}")
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise ScenarioError(key, f"{value} is out of range ({self.lo}..{self.hi})")
        return value


#: Keys every scenario has, whatever its kind.
COMMON_SCHEMA: dict[str, Param] = {
    "policy": Param(str),
    "duration": Param(float, 1, 600),
    "seed": Param(int, 0, 2**31 - 1),
    # Every rate and size times this (a profile for slow machines; see scale_rates).
    "rate_scale": Param(float, 0.01, 1.0),
    # The rate_scale this scenario takes in a guest without hardware virtualisation, where
    # unset (default: environment.TCG_RATE_SCALE): a scenario with many programs per host
    # needs a lower one to leave the emulator CPU headroom there.
    "tcg_rate_scale": Param(float, 0.01, 1.0),
}

#: A value is a rate or a size when its key ends so (Mbit/s bandwidths and rates, bytes of
#: queue, message, checkpoint or marking threshold), or is one of SCALED_KEYS: a burst's
#: length in packets of fixed size, and a stream's frames per second (each frame is work
#: for its sender and player whatever its size; scaled with the rate, a frame keeps its size).
SCALED_SUFFIXES = ("_bw", "_mbps", "_bytes")
SCALED_KEYS = frozenset({"microburst.count", "streams.fps"})


@dataclass
class Scenario:
    name: str
    kind: str
    description: str
    path: Path
    params: dict[str, Any] = field(default_factory=dict)


def list_scenarios() -> list[Scenario]:
    found = []
    base = scenarios_dir()
    for sub in sorted(base.iterdir()) if base.is_dir() else []:
        if (sub / "scenario.yaml").is_file():
            try:
                found.append(load_file(sub / "scenario.yaml"))
            except ScenarioError:
                continue
    return found


def load(name: str) -> Scenario:
    """A scenario by name (a folder under scenarios/) or by path to a YAML file."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and _is_file(path):
        return load_file(path)
    candidate = scenarios_dir() / name / "scenario.yaml"
    if not _is_file(candidate):
        known = ", ".join(s.name for s in list_scenarios()) or "none"
        raise ScenarioError("scenario", f"unknown scenario {name!r} (known: {known})")
    return load_file(candidate)


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False where the name cannot be a file (too long, a NUL byte)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def check_nesting(value: Any, field: str, where: str = "") -> None:
    """Refuse values nested deeper than MAX_NESTING or holding more than MAX_VALUES.

    Walked without recursion, so that a self-containing alias ends here as a ScenarioError
    naming ``field`` rather than as a RecursionError wherever the value is next walked.
    """
    todo, seen = [(value, 0)], 0
    while todo:
        node, depth = todo.pop()
        seen += 1
        if depth > MAX_NESTING or seen > MAX_VALUES:
            raise ScenarioError(field, f"{where}nested more than {MAX_NESTING} deep or more than "
                                f"{MAX_VALUES} values (a YAML alias inside itself?)")
        if isinstance(node, dict):
            todo += [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list):
            todo += [(v, depth + 1) for v in node]


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong with the YAML and where, on one line."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"malformed YAML{where}: {problem}"


def load_file(path: Path) -> Scenario:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ScenarioError("scenario", f"{path}: {yaml_problem(exc)}") from None
    except RecursionError:
        raise ScenarioError("scenario", f"{path}: nested too deep to read") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError("scenario", f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ScenarioError("scenario", f"{path}: {exc.strerror}") from None
    check_nesting(data, "scenario", f"{path}: ")
    if not isinstance(data, dict):
        raise ScenarioError("scenario", f"{path}: expected a mapping at the top level")
    for key in ("name", "kind"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ScenarioError(key, f"{path}: missing or not a string")
    params = {k: v for k, v in data.items() if k not in ("name", "kind", "description")}
    return Scenario(name=data["name"], kind=data["kind"],
                    description=str(data.get("description", "")).strip(), path=path,
                    params=params)


def parse_set(items: list[str]) -> list[tuple[str, Any]]:
    """``key=value`` strings into (key, YAML-typed value) pairs."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ScenarioError("--set", f"expected key=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        except RecursionError:
            raise ScenarioError(key, "value nested too deep to read") from None
        check_nesting(value, key)
        out.append((key, value))
    return out


def _leaf_keys(params: dict[str, Any], prefix: str = "",
               empty_sections: bool = False) -> list[str]:
    """Dotted keys of every value; with ``empty_sections``, of every empty mapping too."""
    keys = []
    for k, v in params.items():
        full = f"{prefix}{k}"
        if not str(k).strip():
            raise ScenarioError(f"{prefix}{k!r}", "an empty key")
        if "." in str(k):
            raise ScenarioError(full, "a key may not contain '.': dots separate sections "
                                "(write it as nested mappings)")
        if isinstance(v, dict) and v:
            keys += _leaf_keys(v, full + ".", empty_sections)
        elif not isinstance(v, dict) or empty_sections:
            keys.append(full)
    return keys


def resolve_key(key: str, params: dict[str, Any], schema: dict[str, Param]) -> str:
    """The full dotted key that a ``--set`` key names."""
    known = set(_leaf_keys(params)) | set(schema) | set(COMMON_SCHEMA)
    if key in known or key.startswith("topology."):
        return key
    if key.startswith("phases.") and schema_key(key) in known | set(COMMON_SCHEMA):
        return key                         # a phase's own value for a known key
    matches = sorted(k for k in known if k.rsplit(".", 1)[-1] == key)
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ScenarioError("--set", f"{key!r} is ambiguous ({', '.join(matches)})")
    raise ScenarioError("--set", f"unknown key {key!r} (known: {', '.join(sorted(known))})")


def apply_sets(params: dict[str, Any], sets: list[tuple[str, Any]],
               schema: dict[str, Param]) -> dict[str, Any]:
    """A copy of ``params`` with the overrides applied (topology keys checked when built)."""
    out = copy.deepcopy(params)
    for key, value in sets:
        full = resolve_key(key, out, schema)
        node = out
        parts = full.split(".")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ScenarioError("--set", f"{'.'.join(parts[:-1])} is not a section")
            node = nxt
        node[parts[-1]] = value
    return out


def schema_key(key: str) -> str:
    """The schema entry a value's key is checked against.

    A phase (``phases.<name>.<key>``) overrides keys of the scenario for that phase only,
    so its values obey the same schema as the keys they override.
    """
    parts = key.split(".")
    return ".".join(parts[2:]) if parts[0] == "phases" and len(parts) > 2 else key


def validate(params: dict[str, Any], schema: dict[str, Param]) -> dict[str, Any]:
    """Check every non-topology value against the schema; unknown keys are errors."""
    full_schema = {**COMMON_SCHEMA, **schema}
    if "topology" in params and not isinstance(params["topology"], dict):
        raise ScenarioError("topology", "expected a mapping")
    # Empty mappings too: ``{}`` where a value belongs must not slip past as "no values".
    for key in _leaf_keys(params, empty_sections=True):
        if key.startswith("topology."):
            continue
        node = params
        parts = key.split(".")
        for part in parts[:-1]:
            node = node[part]
        if schema_key(key) not in full_schema:
            _check_owner(params, parts, full_schema)   # a value given as a mapping
            if node[parts[-1]] == {}:
                continue                   # an empty section: a phase with no overrides
            raise ScenarioError(key, f"unknown key (known: {', '.join(sorted(full_schema))})")
        node[parts[-1]] = full_schema[schema_key(key)].check(key, node[parts[-1]])
    return params


def _check_owner(params: dict[str, Any], parts: list[str],
                 full_schema: dict[str, Param]) -> None:
    """A key under one the schema holds a value for (``job.workers.0``): that value was
    written as a mapping, which its own check refuses, naming it."""
    for i in range(len(parts) - 1, 0, -1):
        owner = ".".join(parts[:i])
        if schema_key(owner) in full_schema:
            node: Any = params
            for part in parts[:i]:
                node = node[part]
            full_schema[schema_key(owner)].check(owner, node)


def scale_rates(params: dict[str, Any], ratio: float,
                defaults: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``params`` with every rate and size times ``ratio`` (``defaults``: the
    values the kind and topology use where the scenario gives none, scaled as well).

    Rates and sizes scale together, so every transfer time, queueing delay, utilisation,
    drop point and flow-to-path choice stays what it was; only the packets per second fall.
    That is what a slow machine (a VM without KVM: every packet costs ~10x) cannot afford.
    """
    out = copy.deepcopy(params)
    full = deep_update(copy.deepcopy(defaults), out)
    for key in _leaf_keys(full):
        if not (key.endswith(SCALED_SUFFIXES) or schema_key(key) in SCALED_KEYS):
            continue
        node, parts = full, key.split(".")
        for part in parts[:-1]:
            node = node[part]
        value = node[parts[-1]]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        # Rates are Mbit/s and fps may be fractional (YAML may write 50 for 50.0); sizes
        # and counts stay whole.
        scaled = (value * ratio if key.endswith(("_bw", "_mbps")) or isinstance(value, float)
                  else max(1, round(value * ratio)))
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = scaled
    return out


def deep_update(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s values written in, section by section (a copy of each)."""
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_update(base[k], v)
        else:
            base[k] = copy.deepcopy(v)
    return base


def require(params: dict[str, Any], keys: list[str], kind: str) -> None:
    """Refuse a scenario that lacks a value ``kind`` has no default for, naming the key."""
    for key in keys:
        node: Any = params
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ScenarioError(key, f"missing: the {kind} kind needs it")
            node = node[part]


def field_namer(name: str, over: dict[str, Any]) -> Callable[[str], str]:
    """Names a key of phase ``name`` as the user wrote it (``over``: the phase's overrides):
    the phase's override if it has one, else the scenario's own key. A phased kind's checks
    run on each phase's merged values, and an error must point at the line to change."""
    def field(key: str) -> str:
        node: Any = over
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return key
            node = node[part]
        return f"phases.{name}.{key}"
    return field


def with_defaults(params: dict[str, Any], defaults: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A phased kind's scenario values over its ``defaults``, section by section (phases
    excluded): what every phase starts from."""
    out = {k: v for k, v in copy.deepcopy(params).items() if k != "phases"}
    for section, values in defaults.items():
        out[section] = {**values, **out.get(section, {})}
    return out


def phases_over(base: dict[str, Any], params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{phase name: ``base`` with the phase's overrides}, in the scenario's order; one phase
    ``run`` when the scenario has none. A phase's overrides must be a mapping."""
    phases = params.get("phases") or {"run": {}}
    if not isinstance(phases, dict):
        raise ScenarioError("phases", "expected a mapping of phase name to overrides")
    out = {}
    for name, over in phases.items():
        if not isinstance(over, dict | type(None)):
            raise ScenarioError(f"phases.{name}", "expected a mapping of overrides")
        out[str(name)] = deep_update(copy.deepcopy(base), over or {})
    return out
