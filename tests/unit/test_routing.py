"""ECMP candidates (``controllers.routing``) and the tables built from them (``plan``).

Topologies are written out here as the controller's config dicts, independently of the
lab's topology builders, so a change there cannot make these pass by accident.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from controllers import config, plan, policies, routing
from controllers.plan import Action, FlowEntry, RequestError
from controllers.policies import FlowKey


def _host(n: int, switch: str, port: int) -> dict[str, Any]:
    return {"name": f"h{n}", "ip": f"10.0.0.{n}", "mac": f"00:00:00:00:00:{n:02x}",
            "switch": switch, "port": port}


def leaf_spine(spines: int = 2, leaves: int = 2, hosts_per_leaf: int = 2) -> dict[str, Any]:
    """Leaf ports 1..h to hosts, h+1.. to spines; spine port j to leaf j."""
    sw = [{"name": f"spine{i}", "dpid": 0x100 + i} for i in range(1, spines + 1)]
    sw += [{"name": f"leaf{i}", "dpid": 0x200 + i} for i in range(1, leaves + 1)]
    links = [{"a": f"leaf{lf}", "a_port": hosts_per_leaf + s, "b": f"spine{s}", "b_port": lf}
             for lf in range(1, leaves + 1) for s in range(1, spines + 1)]
    hosts = [_host((lf - 1) * hosts_per_leaf + i, f"leaf{lf}", i)
             for lf in range(1, leaves + 1) for i in range(1, hosts_per_leaf + 1)]
    return {"switches": sw, "hosts": hosts, "links": links}


def fat_tree(k: int = 4) -> dict[str, Any]:
    """Edge: ports 1..k/2 hosts, k/2+1.. aggs. Agg: 1..k/2 edges, k/2+1.. cores.
    Core c (0-based) links to agg c // (k/2) of every pod, on core port pod+1."""
    half = k // 2
    sw, links, hosts = [], [], []
    cores = [f"core{c}" for c in range(half * half)]
    sw += [{"name": c, "dpid": 0x100 + i} for i, c in enumerate(cores)]
    n = 0
    for pod in range(k):
        aggs = [f"agg{pod}_{a}" for a in range(half)]
        edges = [f"edge{pod}_{e}" for e in range(half)]
        sw += [{"name": a, "dpid": 0x200 + pod * half + i} for i, a in enumerate(aggs)]
        sw += [{"name": e, "dpid": 0x300 + pod * half + i} for i, e in enumerate(edges)]
        for ei, e in enumerate(edges):
            for ai, a in enumerate(aggs):
                links.append({"a": e, "a_port": half + 1 + ai, "b": a, "b_port": 1 + ei})
            for hp in range(1, half + 1):
                n += 1
                hosts.append(_host(n, e, hp))
        for ai, a in enumerate(aggs):
            for j in range(half):
                links.append({"a": a, "a_port": half + 1 + j, "b": cores[ai * half + j],
                              "b_port": pod + 1})
    return {"switches": sw, "hosts": hosts, "links": links}


def ring(n: int = 5) -> dict[str, Any]:
    """An odd ring: unlike a tiered fabric it has neighbours at equal distance, which must
    never be candidates."""
    sw = [{"name": f"r{i}", "dpid": i + 1} for i in range(n)]
    links = [{"a": f"r{i}", "a_port": 2, "b": f"r{(i + 1) % n}", "b_port": 3} for i in range(n)]
    return {"switches": sw, "hosts": [_host(i + 1, f"r{i}", 1) for i in range(n)],
            "links": links}


def hop_distances(topo: dict[str, Any]) -> dict[tuple[str, str], int]:
    """All-pairs hop counts over switches and hosts (Floyd-Warshall: independent of BFS)."""
    nodes = [s["name"] for s in topo["switches"]] + [h["name"] for h in topo["hosts"]]
    inf = 10**9
    d = {(a, b): (0 if a == b else inf) for a in nodes for b in nodes}
    edges = [(lk["a"], lk["b"]) for lk in topo["links"]]
    edges += [(h["switch"], h["name"]) for h in topo["hosts"]]
    for a, b in edges:
        d[a, b] = d[b, a] = 1
    for m, a, b in itertools.product(nodes, nodes, nodes):
        if d[a, m] + d[m, b] < d[a, b]:
            d[a, b] = d[a, m] + d[m, b]
    return d


def peer_of_port(topo: dict[str, Any]) -> dict[tuple[str, int], str]:
    peers = {}
    for lk in topo["links"]:
        peers[lk["a"], lk["a_port"]] = lk["b"]
        peers[lk["b"], lk["b_port"]] = lk["a"]
    for h in topo["hosts"]:
        peers[h["switch"], h["port"]] = h["name"]
    return peers


def tier(name: str) -> str:
    return name.rstrip("0123456789_")


def candidate_counts(topo: dict[str, Any]) -> dict[tuple[str, str], set[int]]:
    """{(tier, relation): {number of candidates}} over every (switch, host)."""
    routes = routing.ecmp_routes(topo)
    home = {h["name"]: h["switch"] for h in topo["hosts"]}
    pod = {s["name"]: s["name"][len(tier(s["name"]))].rstrip("_") for s in topo["switches"]
           if not s["name"].startswith(("core", "spine"))}
    out: dict[tuple[str, str], set[int]] = {}
    for sw, per_host in routes.items():
        for host, ports in per_host.items():
            if sw == home[host]:
                rel = "local"
            elif sw in pod and pod.get(home[host]) == pod[sw] and tier(sw) == "edge":
                rel = "same-pod"
            elif sw in pod and pod.get(home[host]) == pod[sw]:
                rel = "own-pod"
            else:
                rel = "remote"
            out.setdefault((tier(sw), rel), set()).add(len(ports))
    return out


def test_leaf_spine_candidate_counts_per_tier() -> None:
    topo = leaf_spine(spines=2, leaves=2)
    routes = routing.ecmp_routes(topo)
    assert routes["leaf1"] == {"h1": [1], "h2": [2], "h3": [3, 4], "h4": [3, 4]}
    assert routes["spine1"] == {"h1": [1], "h2": [1], "h3": [2], "h4": [2]}
    assert routes["spine2"] == {"h1": [1], "h2": [1], "h3": [2], "h4": [2]}
    assert routes["leaf2"]["h1"] == [3, 4]


def test_fat_tree_k4_candidate_counts_per_tier() -> None:
    topo = fat_tree(4)
    counts = candidate_counts(topo)
    assert counts == {
        ("edge", "local"): {1},      # the host's own port
        ("edge", "same-pod"): {2},   # another edge of the pod: up via either agg
        ("edge", "remote"): {2},     # another pod: up via either agg
        ("agg", "own-pod"): {1},     # down to the host's edge
        ("agg", "remote"): {2},      # up via either of its cores
        ("core", "remote"): {1},     # one down-port per destination pod
    }
    routes = routing.ecmp_routes(topo)
    assert len(routes) == 20 and all(len(r) == 16 for r in routes.values())


@pytest.mark.parametrize("topo", [leaf_spine(), leaf_spine(4, 3, 1), fat_tree(4), ring(5),
                                  ring(6)],
                         ids=["leaf-spine-2x2", "leaf-spine-4x3", "fat-tree-k4", "ring-5",
                              "ring-6"])
def test_every_candidate_moves_strictly_closer_and_none_is_missed(topo: dict[str, Any]) -> None:
    dist = hop_distances(topo)
    peers = peer_of_port(topo)
    routes = routing.ecmp_routes(topo)
    for sw, per_host in routes.items():
        own_ports = sorted(p for (s, p) in peers if s == sw)
        for host, ports in per_host.items():
            assert ports == sorted(ports) and ports, (sw, host, ports)
            closer = [p for p in own_ports if dist[peers[sw, p], host] < dist[sw, host]]
            assert ports == closer, (sw, host)
            for p in ports:
                assert dist[peers[sw, p], host] == dist[sw, host] - 1


def test_parallel_links_are_separate_candidates_and_islands_unreachable() -> None:
    topo = {"switches": [{"name": "a", "dpid": 1}, {"name": "b", "dpid": 2},
                         {"name": "c", "dpid": 3}],
            "hosts": [_host(1, "a", 1), _host(2, "b", 1), _host(3, "c", 1)],
            "links": [{"a": "a", "a_port": 2, "b": "b", "b_port": 2},
                      {"a": "a", "a_port": 3, "b": "b", "b_port": 3}]}
    routes = routing.ecmp_routes(topo)
    assert routes["a"] == {"h1": [1], "h2": [2, 3]}
    assert routes["c"] == {"h3": [1]}                 # c is an island: nothing else


# -- tables built from the routes -----------------------------------------------------------

def build(policy_name: str, seed: int = 1) -> tuple[dict[str, Any], dict[str, plan.SwitchPlan]]:
    topo = leaf_spine(2, 2, 2)
    routes = routing.ecmp_routes(topo)
    policy = policies.get(policy_name)(seed=seed)
    return topo, {sw: plan.switch_plan(sw, routes[sw], topo["hosts"], policy) for sw in routes}


def forwarding(p: plan.SwitchPlan) -> list[FlowEntry]:
    return [f for f in p.flows if f.table == plan.TABLE_FORWARD]


@pytest.mark.parametrize("name", ["ovs-select", "hash-l3", "hash5"])
def test_common_pipeline_and_no_flooding(name: str) -> None:
    topo, plans = build(name)
    for sw, p in plans.items():
        table0 = [f for f in p.flows if f.table == plan.TABLE_WATCH]
        assert table0 == [FlowEntry(plan.TABLE_WATCH, plan.PRIO_DEFAULT, (),
                                    Action("goto", plan.TABLE_FORWARD))]
        for f in forwarding(p):
            # Everything in table 1 is IPv4 to a known host: no table-miss, no flood.
            assert f.match_dict()["eth_type"] == plan.ETH_TYPE_IPV4
            assert f.match_dict()["ipv4_dst"] in {h["ip"] for h in topo["hosts"]}
            assert f.action.kind in ("output", "group", "controller")
        # Single-candidate destinations are plain outputs whatever the policy.
        local = [f for f in forwarding(p) if f.action == Action("output", 1)
                 and f.priority == plan.PRIO_DST]
        assert local, sw


def test_switch_granularity_uses_one_select_group_per_port_set() -> None:
    _, plans = build("ovs-select")
    assert plans["leaf1"].groups == (plan.SelectGroup(1, (3, 4)),)
    remote = [f for f in forwarding(plans["leaf1"]) if f.match_dict()["ipv4_dst"]
              in ("10.0.0.3", "10.0.0.4")]
    assert {f.action for f in remote} == {Action("group", 1)}
    assert plans["spine1"].groups == ()
    assert len(forwarding(plans["spine1"])) == 4


def test_pair_granularity_has_an_entry_per_source_and_a_fallback() -> None:
    topo, plans = build("hash-l3", seed=4)
    policy = policies.get("hash-l3")(seed=4)
    fw = forwarding(plans["leaf1"])
    for dst in ("10.0.0.3", "10.0.0.4"):
        pairs = [f for f in fw if f.priority == plan.PRIO_PAIR and
                 f.match_dict()["ipv4_dst"] == dst]
        srcs = sorted(f.match_dict()["ipv4_src"] for f in pairs)
        assert srcs == sorted(h["ip"] for h in topo["hosts"] if h["ip"] != dst)
        for f in pairs:
            want = policy.choose(FlowKey(f.match_dict()["ipv4_src"], dst, 0, 0, 0), "leaf1",
                                 [3, 4])
            assert f.action == Action("output", want)
        fallback = [f for f in fw if f.priority == plan.PRIO_DST and
                    f.match_dict()["ipv4_dst"] == dst]
        assert [f.action for f in fallback] == [Action("output", 3)]
    assert plans["leaf1"].groups == ()


def test_flow_granularity_sends_multi_candidate_tcp_and_udp_to_the_controller() -> None:
    """A per-flow policy decides TCP and UDP flows on their first packet; everything else
    (ICMP) to a multi-candidate destination takes the switch's select group proactively."""
    _, plans = build("hash5")
    fw = forwarding(plans["leaf1"])
    by_dst: dict[tuple, Action] = {}
    for f in fw:
        m = f.match_dict()
        by_dst[(m["ipv4_dst"], m.get("ip_proto"), f.priority)] = f.action
    groups = {g.group_id: g.ports for g in plans["leaf1"].groups}
    assert groups == {1: (3, 4)}
    assert by_dst == {
        ("10.0.0.1", None, plan.PRIO_DST): Action("output", 1),
        ("10.0.0.2", None, plan.PRIO_DST): Action("output", 2),
        **{(dst, proto, plan.PRIO_DST_L4): Action("controller")
           for dst in ("10.0.0.3", "10.0.0.4") for proto in (plan.PROTO_TCP, plan.PROTO_UDP)},
        **{(dst, None, plan.PRIO_DST): Action("group", 1) for dst in ("10.0.0.3", "10.0.0.4")},
    }


def test_plans_are_deterministic() -> None:
    assert build("hash-l3", 9)[1] == build("hash-l3", 9)[1]
    assert build("ovs-select")[1] == build("ovs-select")[1]


def test_reactive_and_watch_entries_match_exactly_one_5tuple() -> None:
    tcp = FlowKey("10.0.0.1", "10.0.0.3", 6, 40001, 5201)
    e = plan.reactive_entry(tcp, 4)
    assert (e.table, e.priority, e.idle_timeout) == (plan.TABLE_FORWARD, plan.PRIO_FLOW, 30)
    assert e.match_dict() == {"eth_type": 0x800, "ip_proto": 6, "ipv4_src": "10.0.0.1",
                              "ipv4_dst": "10.0.0.3", "tcp_src": 40001, "tcp_dst": 5201}
    udp = plan.watch_entry(plan.Watch(77, FlowKey("10.0.0.1", "10.0.0.3", 17, 1, 2)))
    assert (udp.table, udp.priority, udp.cookie) == (plan.TABLE_WATCH, plan.PRIO_WATCH, 77)
    assert udp.action == Action("goto", plan.TABLE_FORWARD)
    assert udp.match_dict()["udp_src"] == 1 and "tcp_src" not in udp.match_dict()
    icmp = plan.flow_match(FlowKey("10.0.0.1", "10.0.0.3", 1, 0, 0))
    assert dict(icmp) == {"eth_type": 0x800, "ip_proto": 1, "ipv4_src": "10.0.0.1",
                          "ipv4_dst": "10.0.0.3"}
    assert plan.PRIO_WATCH > plan.PRIO_FLOW > plan.PRIO_PAIR > plan.PRIO_DST > plan.PRIO_DEFAULT


def test_parse_watch() -> None:
    w = plan.parse_watch({"cookie": 5, "proto": 6, "src": "10.0.0.1", "dst": "10.0.0.5",
                          "sport": 40001, "dport": 5201})
    assert w == plan.Watch(5, FlowKey("10.0.0.1", "10.0.0.5", 6, 40001, 5201))
    icmp = plan.parse_watch({"cookie": 6, "proto": 1, "src": "10.0.0.1", "dst": "10.0.0.5",
                             "sport": 3, "dport": 4})
    assert icmp.key.sport == icmp.key.dport == 0
    bad = [({"cookie": 0}, "cookie"), ({"cookie": True}, "cookie"), ({"proto": 256}, "proto"),
           ({"src": "10.0.0"}, "src"), ({"dst": None}, "dst"), ({"sport": 70000}, "sport")]
    base = {"cookie": 5, "proto": 6, "src": "10.0.0.1", "dst": "10.0.0.5", "sport": 1,
            "dport": 2}
    for change, field in bad:
        with pytest.raises(RequestError, match=rf"flows\[3\]\.{field}:"):
            plan.parse_watch({**base, **change}, "flows[3]")


# -- the config file ---------------------------------------------------------------------------

def cfg_dict(**over: Any) -> dict[str, Any]:
    return {"policy": "hash5", "seed": 1, "control_socket": "/tmp/x.sock",
            **leaf_spine(2, 2, 1), **over}


def test_config_round_trips_into_the_routing_input() -> None:
    cfg = config.parse(cfg_dict())
    assert cfg.switch_by_dpid()[0x201] == "leaf1"
    assert routing.ecmp_routes(cfg.topology())["leaf1"]["h2"] == [2, 3]


@pytest.mark.parametrize("change, message", [
    ({"policy": "foo"}, "policy: unknown policy 'foo' (known: "
     + ", ".join(policies.available()) + ")"),
    ({"seed": "1"}, "seed: expected an integer"),
    ({"switches": [{"name": "leaf1", "dpid": 1}, {"name": "leaf1", "dpid": 2}]},
     "switches: duplicate switch name"),
    ({"links": [{"a": "leaf1", "a_port": 1, "b": "nope", "b_port": 1}]},
     "links[0].a_port: port 1 of leaf1 is used twice"),
    ({"links": [{"a": "leaf1", "a_port": 9, "b": "nope", "b_port": 1}]},
     "links[0].b_port: unknown switch 'nope'"),
])
def test_config_errors_name_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(config.ConfigError) as exc:
        config.parse(cfg_dict(**change))
    assert str(exc.value).startswith(message)
