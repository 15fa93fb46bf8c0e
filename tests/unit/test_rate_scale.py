"""The rate profile: every rate and size scaled together, so that times, utilisations and
paths stay as they were and only the packets per second fall. A TCG guest gets it by
default and says so in its parameters."""

from __future__ import annotations

import json

import pytest

from lab import run
from lab.machine import environment
from lab.model.errors import ScenarioError
from lab.model.scenario import scale_rates


def test_rates_and_sizes_scale_times_and_counts_do_not():
    params = {"duration": 10.0, "seed": 3,
              "topology": {"type": "leafspine", "host_bw": 50, "queue_bytes": 100_000},
              "job": {"size_bytes": 1_048_576, "compute_s": 0.25, "workers": 8},
              "phases": {"shared": {"storage": {"read_mbps": 2.0}}}}
    out = scale_rates(params, 0.25, {"topology": {"fabric_bw": 100.0},
                                     "microburst": {"count": 60, "size": 1000}})
    assert out["topology"] == {"type": "leafspine", "host_bw": 12.5, "queue_bytes": 25_000,
                               "fabric_bw": 25.0}
    assert out["job"] == {"size_bytes": 262_144, "compute_s": 0.25, "workers": 8}
    assert out["phases"]["shared"]["storage"]["read_mbps"] == 0.5
    assert out["microburst"] == {"count": 15}          # packets of a fixed size: a count
    assert out["duration"] == 10.0 and out["seed"] == 3
    assert params["topology"]["host_bw"] == 50          # the input is left as it was
    # a transfer's time over its link is what it was
    assert (out["job"]["size_bytes"] * 8 / (out["topology"]["host_bw"] * 1e6)
            == pytest.approx(params["job"]["size_bytes"] * 8 / (50 * 1e6), rel=1e-9))


def test_check_input_scales_defaults_and_records_the_ratio():
    full = run.check_input("incast-ecn")
    quarter = run.check_input("incast-ecn", sets=["rate_scale=0.25"])
    assert full.params["rate_scale"] == 1.0 and quarter.params["rate_scale"] == 0.25
    assert quarter.params["topology"]["fabric_bw"] == full.params["topology"]["fabric_bw"] / 4
    assert quarter.params["ecn"]["k_bytes"] == full.params["ecn"]["k_bytes"] // 4
    links = {(ln["a"], ln["b"]): ln["bw_mbps"] for ln in quarter.topo_desc["links"]}
    assert links == {(ln["a"], ln["b"]): ln["bw_mbps"] / 4 for ln in full.topo_desc["links"]}


def test_defaults_nobody_wrote_are_scaled_too(tmp_path):
    path = tmp_path / "ft.yaml"
    path.write_text("name: ft\nkind: ecmp\npolicy: hash5\ntopology: {type: fattree, k: 4}\n"
                    "traffic: {flows: 4, proto: tcp, load: 0.5, pairs: 0, cc: cubic}\n")
    full = run.check_input(str(path))
    half = run.check_input(str(path), sets=["rate_scale=0.5"])
    assert sorted(ln["bw_mbps"] / 2 for ln in full.topo_desc["links"]) == \
        sorted(ln["bw_mbps"] for ln in half.topo_desc["links"])


def test_a_tcg_guest_takes_the_profile_unless_told(monkeypatch):
    monkeypatch.setenv(environment.VM_ENV, json.dumps({"accelerator": "tcg", "vcpus": 2}))
    assert run.check_input("ecmp-basic").params["rate_scale"] == environment.TCG_RATE_SCALE
    assert run.check_input("ecmp-basic", sets=["rate_scale=1"]).params["rate_scale"] == 1.0
    monkeypatch.setenv(environment.VM_ENV, json.dumps({"accelerator": "kvm", "vcpus": 2}))
    assert run.check_input("ecmp-basic").params["rate_scale"] == 1.0


def test_a_scenario_may_carry_its_own_tcg_profile(monkeypatch, tmp_path):
    """tcg_rate_scale is the scenario's profile in a TCG guest only; rate_scale still wins."""
    path = tmp_path / "many.yaml"
    path.write_text("name: many\nkind: ecmp\npolicy: hash5\ntcg_rate_scale: 0.1\n"
                    "topology: {type: leafspine, fabric_bw: 100}\n"
                    "traffic: {flows: 4, proto: tcp, load: 0.5, pairs: 0, cc: cubic}\n")
    assert run.check_input(str(path)).params["rate_scale"] == 1.0
    monkeypatch.setenv(environment.VM_ENV, json.dumps({"accelerator": "tcg", "vcpus": 2}))
    tcg = run.check_input(str(path))
    assert tcg.params["rate_scale"] == 0.1
    assert tcg.params["topology"]["fabric_bw"] == 10.0
    assert run.check_input(str(path), sets=["rate_scale=0.5"]).params["rate_scale"] == 0.5
    with pytest.raises(ScenarioError, match="tcg_rate_scale"):
        run.check_input(str(path), sets=["tcg_rate_scale=2"])


@pytest.mark.parametrize("value", ["0", "1.5", "fast"])
def test_a_bad_ratio_is_refused_naming_it(value):
    with pytest.raises(ScenarioError, match="rate_scale"):
        run.check_input("ecmp-basic", sets=[f"rate_scale={value}"])


def test_a_stream_keeps_its_frame_size():
    full = run.check_input("streaming-incident")
    quarter = run.check_input("streaming-incident", sets=["rate_scale=0.25"])
    f, q = full.params["streams"], quarter.params["streams"]
    assert q["fps"] == f["fps"] / 4
    for key in ("ingest_mbps", "normal_mbps", "big_mbps"):
        assert q[key] / q["fps"] == f[key] / f["fps"]
