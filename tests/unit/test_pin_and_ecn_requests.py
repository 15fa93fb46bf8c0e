"""The controller's ``pin`` and ``ecn`` requests and config: checked before a switch or port
is touched, each error naming its field."""

from __future__ import annotations

import pytest

from controllers import config, plan
from controllers.policies import FlowKey

PORTS = {"leaf1": {1, 2, 5, 6}, "spine1": {1, 2}}
FLOW = {"proto": 6, "src": "10.0.0.1", "dst": "10.0.0.5", "sport": 20001, "dport": 7101}


def test_pin_entry_is_an_exact_match_above_every_policy_entry():
    pin = plan.parse_pin({**FLOW, "switch": "leaf1", "port": 5}, PORTS)
    assert pin == plan.Pin("leaf1", FlowKey("10.0.0.1", "10.0.0.5", 6, 20001, 7101), 5)
    entry = plan.pin_entry(pin)
    assert entry.table == plan.TABLE_FORWARD and entry.action == plan.Action("output", 5)
    assert entry.priority > max(plan.PRIO_FLOW, plan.PRIO_PAIR, plan.PRIO_DST)
    assert dict(entry.match)["tcp_src"] == 20001 and dict(entry.match)["tcp_dst"] == 7101


@pytest.mark.parametrize("change, field", [
    ({"switch": "leaf9"}, "flows[0].switch"),
    ({"port": 3}, "flows[0].port"),            # leaf1 has no port 3
    ({"port": "5"}, "flows[0].port"),
    ({"src": "10.0.0"}, "flows[0].src"),
    ({"sport": 70000}, "flows[0].sport"),
])
def test_bad_pin_names_the_field(change, field):
    with pytest.raises(plan.RequestError) as err:
        plan.parse_pin({**FLOW, "switch": "leaf1", "port": 5, **change}, PORTS)
    assert str(err.value).startswith(field), str(err.value)


BASE = {"policy": "hash5", "control_socket": "/tmp/x.sock",
        "switches": [{"name": "leaf1", "dpid": 1}], "hosts": [], "links": []}


def test_config_carries_port_queues_and_ecn_mechanism():
    cfg = config.parse({**BASE, "ports": [{"switch": "leaf1", "port": 1, "intf": "leaf1-eth1",
                                           "rate_bps": 50_000_000, "limit_bytes": 100_000}],
                        "ecn": {"mechanism": "tc-bpf", "build_dir": "/run/fabriclab/bpf"}})
    assert cfg.ports[0].intf == "leaf1-eth1" and cfg.ports[0].rate_bps == 50_000_000
    assert cfg.ecn_mechanism == "tc-bpf"
    assert config.parse(BASE).ecn_mechanism == "none"       # older configs still load


@pytest.mark.parametrize("extra, field", [
    ({"ecn": {"mechanism": "nftables"}}, "ecn.mechanism"),
    ({"ports": [{"switch": "leaf9", "port": 1, "intf": "x", "rate_bps": 1,
                 "limit_bytes": 1}]}, "ports[0].switch"),
    ({"ports": [{"switch": "leaf1", "port": 1, "intf": "x", "rate_bps": 0,
                 "limit_bytes": 1}]}, "ports[0].rate_bps"),
])
def test_bad_config_names_the_field(extra, field):
    with pytest.raises(config.ConfigError) as err:
        config.parse({**BASE, **extra})
    assert str(err.value).startswith(field), str(err.value)
