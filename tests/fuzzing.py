"""Hypothesis strategies for bad input: ``--set`` items and whole scenario files.

Shared by the in-process property tests (``tests/unit/test_fuzz_input.py``) and the same
inputs typed at the real CLI (``tests/integration/test_fuzz_cli.py``), so both fuzz one
notion of "what a user might give". Keys come from the real schemas (so many inputs get past
the key check and reach the value, topology and kind checks) mixed with unknown and unicode
keys; values are every YAML type, at and beyond every range.
"""

from __future__ import annotations

import copy
import inspect
from collections import Counter
from typing import Any

import yaml
from hypothesis import strategies as st

from lab import kinds
from lab.model import scenario
from lab.model.errors import LabError
from lab.net.topologies import TOPOLOGIES

SCENARIOS = sorted(p.parent.name for p in scenario.scenarios_dir().glob("*/scenario.yaml"))
TOPOLOGY_TYPES = tuple(TOPOLOGIES)


def _topology_keys() -> list[str]:
    names = {"type"}
    for cls in TOPOLOGIES.values():
        names |= set(inspect.signature(cls.build).parameters) - {"self"}
    return sorted(f"topology.{n}" for n in names)


#: Every key a scenario of any kind knows, as the user would write it in --set.
SCHEMA_KEYS: list[str] = sorted(
    {*scenario.COMMON_SCHEMA, *_topology_keys(),
     *(k for name in kinds.KINDS for k in kinds.get(name).schema)})
BARE_KEYS = sorted({k.rsplit(".", 1)[-1] for k in SCHEMA_KEYS})
PHASE_KEYS = [f"phases.{p}.{k}" for p in ("hashed", "placed", "ecn", "tail-drop", "nope")
              for k in ("job.steps", "job.workers", "ecn.k_bytes", "placement.paths",
                        "storage.mode", "duration")]

#: Strings the lab gives meaning to: choices, names of hosts, ports, policies, files.
WORDS = ("tcp", "udp", "leafspine", "fattree", "streaming-edge", "ring", "incast", "step",
         "red", "off", "packed", "scattered", "balanced", "hash", "hash5", "all", "cubic",
         "h1", "h99", "leaf1-eth1", "spine9-eth1", "incident", "all,incident", "",
         "nosuch.py", "x.py:Nope", "~nosuchuser/p.py", "ünïcødé", "😀", "a\nb", " ")
NUMBERS = (0, -1, 1, 2, 3, 5, 7, 8, 16, 17, 40, 64, 65, 128, 129, 256, 500, 1000, 1001,
           2**31, 2**63, -(2**63), 10**30, 0.5, 1e-9, 1e9)

#: Text as a user might type it: any printable unicode, control characters, no surrogates.
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=16)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from(NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(WORDS), text)
#: A YAML value of any type, nested a little: lists and mappings of the above.
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.one_of(text, st.sampled_from(WORDS)), inner, max_size=3),
    max_leaves=6)


def as_yaml(value: Any) -> str:
    """``value`` as the text after ``key=``: flow-style YAML on one line."""
    out = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10**6)
    return out.removesuffix("\n...\n").strip()


known_keys = st.one_of(st.sampled_from(SCHEMA_KEYS), st.sampled_from(BARE_KEYS),
                       st.sampled_from(PHASE_KEYS))
odd_keys = st.one_of(text, st.sampled_from(("", ".", "topology.", "traffic", "a..b", "phases",
                                            "tøpølogy.spines", "traffic.flows.x")))
#: What a user puts after ``key=``: a YAML value (a plausible one half of the time) or text.
set_values = st.one_of(st.sampled_from(NUMBERS).map(as_yaml), st.sampled_from(WORDS),
                       values.map(as_yaml), text)


def _item(kv: tuple[str, str]) -> str:
    return f"{kv[0]}={kv[1]}"


def _real(name: str) -> dict[str, Any]:
    return yaml.safe_load((scenario.scenarios_dir() / name / "scenario.yaml").read_text())


REAL = {name: _real(name) for name in SCENARIOS}


def scenario_keys(name: str) -> list[str]:
    """The keys scenario ``name`` knows: its kind's, its topology's, its phases'."""
    data = REAL[name]
    schema = {**scenario.COMMON_SCHEMA, **kinds.get(data["kind"]).schema}
    cls = TOPOLOGIES.get(data.get("topology", {}).get("type", "leafspine"))
    assert cls is not None
    found = {*schema, "topology.type",
             *(f"topology.{p}" for p in inspect.signature(cls.build).parameters if p != "self")}
    phases = data.get("phases")
    if isinstance(phases, dict):
        found |= {f"phases.{p}.{k}" for p in phases for k in schema}
    return sorted(found)


def set_items_for(name: str) -> st.SearchStrategy[str]:
    """One ``--set`` item for scenario ``name``: mostly one of its own keys with any value;
    sometimes another scenario's key, an unknown or unicode key, raw text, no '='."""
    own = st.sampled_from(scenario_keys(name))
    own = st.one_of(own, own.map(lambda k: k.rsplit(".", 1)[-1]))     # or its bare name
    return st.one_of(st.tuples(own, set_values).map(_item),
                     st.tuples(own, set_values).map(_item),
                     st.tuples(own, set_values).map(_item),
                     st.tuples(known_keys, set_values).map(_item),
                     st.tuples(odd_keys, set_values).map(_item), text)


#: A scenario's name and up to 3 ``--set`` items for it.
named_sets = st.sampled_from(SCENARIOS).flatmap(
    lambda name: st.tuples(st.just(name), st.lists(set_items_for(name), max_size=3)))


def _mutate(base: dict[str, Any], path: list[str], value: Any, delete: bool) -> dict[str, Any]:
    """``base`` with the value at ``path`` replaced (or deleted), sections created."""
    out = copy.deepcopy(base)
    node = out
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if delete:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return out


KEY_PATHS = [k.split(".") for k in SCHEMA_KEYS] + [["name"], ["kind"], ["description"]]

#: A real scenario with a few values replaced, deleted or added: near-valid files.
mutated_scenarios = st.builds(
    lambda base, edits: _apply_edits(REAL[base], edits),
    st.sampled_from(SCENARIOS),
    st.lists(st.tuples(st.one_of(st.sampled_from(KEY_PATHS), st.lists(text, min_size=1,
                                                                       max_size=3)),
                       values, st.booleans()), max_size=3))


def _apply_edits(base: dict[str, Any], edits: list[tuple[list[str], Any, bool]]) -> dict:
    for path, value, delete in edits:
        base = _mutate(base, path, value, delete)
    return base


topologies = st.fixed_dictionaries({}, optional={
    "type": st.one_of(st.sampled_from(TOPOLOGY_TYPES), values),
    **{k.split(".")[1]: st.one_of(st.sampled_from(NUMBERS), values)
       for k in _topology_keys() if k != "topology.type"}})
#: A scenario made from scratch: any of the known sections, any values, unknown keys.
random_scenarios = st.fixed_dictionaries({}, optional={
    "name": st.one_of(text, values), "kind": st.one_of(st.sampled_from(kinds.KINDS), values),
    "description": values, "policy": st.one_of(st.sampled_from(WORDS), values),
    "duration": values, "seed": values, "topology": st.one_of(topologies, values),
    "traffic": values, "job": values, "streams": values, "phases": values,
}).flatmap(lambda d: st.dictionaries(text, values, max_size=2).map(lambda extra: {**extra,
                                                                                   **d}))


def as_file_text(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


#: What goes into the file: a generated scenario as YAML, that YAML cut or spliced with
#: junk (malformed YAML), raw text, or bytes that need not be UTF-8.
scenario_files = st.one_of(
    st.one_of(mutated_scenarios, random_scenarios).map(as_file_text).map(str.encode),
    st.tuples(mutated_scenarios.map(as_file_text), st.integers(0, 400), text).map(
        lambda t: (t[0][:t[1]] + t[2] + t[0][t[1]:]).encode()),
    text.map(str.encode), st.binary(max_size=64))


class Tally:
    """Inputs tried, refused (by field) and valid: what a fuzz run actually exercised."""

    def __init__(self) -> None:
        self.refused: Counter[str] = Counter()
        self.valid = 0

    @property
    def tried(self) -> int:
        return self.valid + sum(self.refused.values())

    def line(self, what: str) -> str:
        top = ", ".join(f"{f!r} {n}" for f, n in self.refused.most_common(8))
        others = sum(self.refused.values()) - sum(n for _, n in self.refused.most_common(8))
        return (f"{what}: {self.tried} inputs tried, {sum(self.refused.values())} refused "
                f"naming {len(self.refused)} fields ({top}"
                + (f", others {others}" if others else "") + f"), {self.valid} valid")


def check_refusal(exc: LabError) -> str:
    """The field a LabError names, after checking it is the clear one-line error promised."""
    text_ = str(exc)
    assert exc.field, f"no field named: {text_!r}"
    assert len(text_.splitlines()) == 1, f"not one line: {text_!r}"
    assert text_.startswith(f"{exc.field}: "), f"does not start with its field: {text_!r}"
    return exc.field
