"""Gateways: frames addressed to a router's MAC are forwarded to it, whatever their IP."""

import pytest

from controllers import config, plan, policies, routing


def topo(gateway=True):
    return {
        "switches": [{"name": n, "dpid": i} for i, n in enumerate(
            ["leaf1", "leaf2", "spine1", "spine2"], start=1)],
        "hosts": [{"name": "h1", "ip": "10.0.0.1", "mac": "00:00:00:00:00:01",
                   "switch": "leaf1", "port": 1},
                  {"name": "border1", "ip": "10.0.0.9", "mac": "00:00:00:00:00:09",
                   "switch": "leaf2", "port": 1, "gateway": gateway}],
        "links": [{"a": "leaf1", "a_port": 3, "b": "spine1", "b_port": 1},
                  {"a": "leaf1", "a_port": 4, "b": "spine2", "b_port": 1},
                  {"a": "leaf2", "a_port": 3, "b": "spine1", "b_port": 2},
                  {"a": "leaf2", "a_port": 4, "b": "spine2", "b_port": 2}],
    }


def gateway_entries(policy_name, switch="leaf1"):
    t = topo()
    routes = routing.ecmp_routes(t)
    p = plan.switch_plan(switch, routes[switch], t["hosts"], policies.get(policy_name)(seed=1))
    return p, [f for f in p.flows if f.priority == plan.PRIO_GATEWAY]


@pytest.mark.parametrize("policy, kind", [("ovs-select", "group"), ("hash5", "controller"),
                                          ("hash-l3", "controller")])
def test_gateway_mac_entry_by_granularity(policy, kind):
    p, entries = gateway_entries(policy)
    assert len(entries) == 1
    (entry,) = entries
    assert entry.match_dict() == {"eth_type": 0x0800, "eth_dst": "00:00:00:00:00:09"}
    assert entry.action.kind == kind
    if kind == "group":
        assert [g.ports for g in p.groups if g.group_id == entry.action.arg] == [(3, 4)]
    # the host routes of the gateway's own address are still there, above it
    assert any(f.match_dict().get("ipv4_dst") == "10.0.0.9" and f.priority > entry.priority
               for f in p.flows)


def test_single_path_gateway_entry_outputs_directly():
    _, (entry,) = gateway_entries("hash5", switch="leaf2")
    assert entry.action.kind == "output" and entry.action.arg == 1


def test_no_gateway_no_gateway_entry():
    t = topo(gateway=False)
    routes = routing.ecmp_routes(t)
    p = plan.switch_plan("leaf1", routes["leaf1"], t["hosts"], policies.get("hash5")(seed=1))
    assert not [f for f in p.flows if f.priority == plan.PRIO_GATEWAY]


def test_reactive_pair_entry_matches_gateway_and_addresses():
    e = plan.reactive_pair_entry("10.0.0.1", "203.0.113.7", "00:00:00:00:00:09", 4)
    assert e.match_dict() == {"eth_type": 0x0800, "eth_dst": "00:00:00:00:00:09",
                              "ipv4_src": "10.0.0.1", "ipv4_dst": "203.0.113.7"}
    assert e.priority == plan.PRIO_PAIR and e.idle_timeout > 0


@pytest.mark.parametrize("field, value, words", [
    ("gateway", "yes", "hosts[1].gateway: expected true or false"),
    ("mac", "00:00:00:00:09", "hosts[1].mac"),
])
def test_bad_gateway_config(field, value, words):
    raw = dict(topo(), policy="hash5", seed=1, control_socket="/tmp/x.sock")
    raw["hosts"][1][field] = value
    with pytest.raises(config.ConfigError) as exc:
        config.parse(raw)
    assert str(exc.value).startswith(words)
