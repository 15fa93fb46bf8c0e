"""Policies in users' own files: loaded by path, every unusable file one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from controllers import config, policies
from controllers.policies import FlowKey, HashPolicy

GOOD = '''
from controllers.policies import HashPolicy

class RoundRobinish(HashPolicy):
    granularity = "flow"

    def choose(self, flow, switch, ports):
        return ports[flow.sport % len(ports)]
'''


def write(tmp_path: Path, text: str, name: str = "mypolicy.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_file_policy_loads_and_decides(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    cls = policies.resolve(str(path))
    assert issubclass(cls, HashPolicy) and cls.name == "mypolicy.RoundRobinish"
    assert cls().choose(FlowKey("10.0.0.1", "10.0.0.2", 6, 41, 80), "leaf1", [1, 2]) == 2
    assert policies.resolve(f"{path}:RoundRobinish") is cls
    assert policies.spec_of(cls) == f"{path.resolve()}:RoundRobinish"
    assert policies.spec_of(policies.get("hash5")) == "hash5"


def test_the_controller_config_accepts_a_policy_file(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    raw = {"policy": f"{path}:RoundRobinish", "seed": 1, "control_socket": "/tmp/x.sock",
           "switches": [{"name": "s1", "dpid": 1}], "hosts": [], "links": []}
    assert config.parse(raw).policy == f"{path}:RoundRobinish"


@pytest.mark.parametrize(("text", "expect"), [
    ("class P(HashPolicy:\n    pass\n", "mypolicy.py:1: syntax error"),
    ("from controllers.policies import HashPolicy\nclass P(HashPolicy):\n"
     "    granularity = 'flow'\n    def decide(self, flow, switch, ports):\n        return 1\n",
     "class P has no decision method: define choose(self, flow, switch, ports)"),
    ("x = 1\n", "defines no subclass of controllers.policies.HashPolicy"),
    ("import no_such_module_here\n", "importing it raised ModuleNotFoundError"),
    ("from controllers.policies import HashPolicy\nclass P(HashPolicy):\n"
     "    granularity = 'packet'\n    def choose(self, flow, switch, ports):\n"
     "        return ports[0]\n", "granularity 'packet' is not one of"),
    (GOOD + "\nclass Other(RoundRobinish):\n    pass\n", "defines several policies "
     "(Other, RoundRobinish); name one as"),
])
def test_unusable_files_give_one_clear_error(tmp_path: Path, text: str, expect: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(policies.PolicyFileError) as exc:
        policies.resolve(str(path))
    msg = str(exc.value)
    assert msg.startswith(f"policy-file: {path}")
    assert expect in msg


def test_missing_file_and_missing_class(tmp_path: Path) -> None:
    with pytest.raises(policies.PolicyFileError, match="cannot read it"):
        policies.resolve(str(tmp_path / "absent.py"))
    path = write(tmp_path, GOOD)
    with pytest.raises(policies.PolicyFileError, match="defines no class 'Nope'"):
        policies.resolve(f"{path}:Nope")


def test_the_lab_names_the_field_for_a_bad_policy_file(tmp_path: Path) -> None:
    from lab.model.errors import ScenarioError
    from lab.model.policies import policy_names
    path = write(tmp_path, "def broken(:\n")
    with pytest.raises(ScenarioError) as exc:
        policy_names(str(path))
    assert str(exc.value).startswith("policy-file:")
    assert "syntax error" in str(exc.value)
