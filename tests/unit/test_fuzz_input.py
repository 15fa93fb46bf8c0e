"""Bad input, fuzzed: every generated ``--set`` and scenario file is refused with one clear
line naming its field, or is valid. Never a traceback.

In-process and without root: ``lab.run.check_input`` is every check ``fabriclab run`` makes
before it looks at the machine, so a crash here is a traceback a user would see. The inputs
are derandomized (CI must reproduce a failure) and their number keeps this file well under
a minute on 2 cores; each test prints what it tried (pytest -s shows it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab import run
from lab.model.errors import LabError
from tests.fuzzing import (
    NUMBERS,
    WORDS,
    Tally,
    check_refusal,
    named_sets,
    scenario_files,
    text,
)

#: Per test, what the fuzzing tried: printed at the end, kept for a look in a debugger.
TALLIES: dict[str, Tally] = {}
FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """None (the scenario's own value) three times in four, else ``strategy``."""
    return st.one_of(st.none(), st.none(), st.none(), strategy)


def outcome(tally: Tally, name: str, **overrides: object) -> None:
    """Validate like ``fabriclab run``; count the refusal's field or the valid input.

    Any exception but a LabError fails the test: that is a traceback on the user's screen.
    """
    try:
        run.check_input(name, **overrides)
    except LabError as exc:
        tally.refused[check_refusal(exc)] += 1
    else:
        tally.valid += 1


def test_fuzzed_set_values_on_every_scenario():
    tally = TALLIES["--set"] = Tally()

    @settings(FUZZ, max_examples=1500)
    @given(named=named_sets,
           policy=maybe(st.sampled_from(WORDS) | text),
           duration=maybe(st.floats() | st.sampled_from(NUMBERS).map(float)),
           seed=maybe(st.integers() | st.sampled_from([n for n in NUMBERS
                                                       if isinstance(n, int)])))
    def check(named, policy, duration, seed):
        name, sets = named
        outcome(tally, name, sets=sets, policy=policy, duration=duration, seed=seed)

    check()
    print(tally.line("fuzzed --set"))
    assert tally.valid and tally.refused       # both sides of the property were exercised


def test_fuzzed_scenario_files(tmp_path: Path):
    tally = TALLIES["files"] = Tally()
    path = tmp_path / "fuzzed.yaml"

    @settings(FUZZ, max_examples=1500)
    @given(content=scenario_files)
    def check(content):
        path.write_bytes(content)
        outcome(tally, str(path))

    check()
    print(tally.line("fuzzed scenario files"))
    assert tally.valid and tally.refused


#: Inputs that crashed (or slipped through) before the fuzzing found them, and the field
#: each must now be refused naming. Scenario files are given by their text.
TRAFFIC = "traffic: {flows: 2, proto: tcp, load: 0.5}\n"
FOUND = [
    ("ecmp-basic", ["duration=.nan"], "duration"),                 # NaN passed every range
    ("ecmp-basic", ["traffic.load=.nan"], "traffic.load"),
    ("ecmp-basic", ["policy=x\0.py"], "policy-file"),               # ValueError: NUL byte
    ("ecmp-basic", ["policy=~nosuchuser/p.py"], "policy-file"),     # RuntimeError: no home
    ("ecmp-basic", ["topology.leaves=1"], "topology.leaves"),       # flows h1->h1: no fabric
    ("ecmp-basic", ["traffic.flows=&a {b: *a}"], "traffic.flows"),  # RecursionError
    ("ecmp-basic", ["traffic.flows=" + "[" * 3000 + "]" * 3000], "traffic.flows"),
    ("ecmp-basic", ["topology.a\nb=1"], "topology.a\\nb"),          # a two-line error
    ("ecmp-basic", ["spines=64", "leaves=64", "hosts_per_leaf=8"], "topology.hosts_per_leaf"),
    ("ecmp-polarisation", ["topology.k=12"], "topology.k"),         # 180 switches, 432 hosts
    ("allreduce-ecmp", ["buckets={}"], "job.buckets"),              # {} skipped the schema
    ("allreduce-ecmp", ["job.workers={0: {}}"], "job.workers"),     # TypeError: a mapping
    ("allreduce-shared-link", ["storage.hosts=[[1]]"], "storage.hosts"),   # unhashable
    ("incast-ecn", ["ecn.ports=[{a: 1}]"], "ecn.ports"),
    ("streaming-incident", ["phases=,"], "phases"),                 # no phase: StopIteration
    ("a" * 300, [], "scenario"),                                    # OSError: name too long
    ("name: x\nkind: ecmp\n", None, "traffic.flows"),               # KeyError: 'traffic'
    ("name: x\nkind: streaming\ntopology: {type: streaming-edge}\n", None, "streams.proto"),
    ("name: x\nkind: ecmp\ntopology: {type: streaming-edge}\n" + TRAFFIC, None,
     "topology.type"),                                              # IndexError
    ('name: x\nkind: ecmp\n"traffic.flows": 3\n', None, "traffic.flows"),  # KeyError
    ("name: x\nkind: ecmp\ntopology: {1: 2, a: 3}\n" + TRAFFIC, None, "topology.1"),
    ("name: x\nkind: ecmp\n'': 1\n" + TRAFFIC, None, "''"),        # a refusal with no field
    ("name: x\nkind: ecmp\ntraffic: &a {x: *a}\n", None, "scenario"),       # RecursionError
    ("name: x\nkind: ecmp\ntraffic: " + "[" * 3000 + "]" * 3000, None, "scenario"),
    (b"name: \xff\nkind: ecmp\n", None, "scenario"),                # UnicodeDecodeError
    ("name: x\0\nkind: ecmp\n", None, "scenario"),                  # a two-line YAML error
]


@pytest.mark.parametrize("given_, sets, field", FOUND,
                         ids=[f"{i}-{f}" for i, (_, _, f) in enumerate(FOUND)])
def test_inputs_the_fuzzing_found_name_their_field(given_, sets, field, tmp_path: Path):
    if sets is None:                          # a scenario file's text
        path = tmp_path / "found.yaml"
        path.write_bytes(given_ if isinstance(given_, bytes) else given_.encode())
        given_, sets = str(path), []
    with pytest.raises(LabError) as exc:
        run.check_input(given_, sets=sets)
    assert check_refusal(exc.value) == field
