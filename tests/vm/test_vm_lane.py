"""The lab on a full kernel, in a QEMU guest built from Debian's packages, with real packets.

One guest session (``guest_session.sh``, one boot) runs every scenario the lane checks; the
tests below read what it wrote. `fabriclab vm run` itself, a ``kill -9`` of the VM and a
guest that does not boot are tested on their own boots.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lab.machine import environment, hlsjs, state, vm
from lab.model.result import validate
from tests.integration.support import (
    check_links_agree_with_flows,
    check_paths_follow_policy,
    run_result,
)
from tests.vm.conftest import CLI, REPO, fabriclab, load

#: Controller-decided policies: the path is a function of the 5-tuple and the seed, so the
#: kernel datapath and the userspace one must put every flow on the same spine.
DECIDED = ("hash5", "hash-l3", "hash5-tier")


#: ``full`` (make test-vm) or ``ci`` (make test-vm-ci, the part that fits in CI beside
#: make test): ci leaves out the tests marked ``vm_full`` and the guest's steps they read.
LANE = os.environ.get("FABRICLAB_VM_LANE", "full")

#: The ecmp-basic policies the guest runs: ``FABRICLAB_VM_POLICIES`` (space-separated).
#: CI's default keeps the lane inside its time; each further policy costs ~2 min under TCG.
#: ``FABRICLAB_VM_POLICIES="hash5 hash-l3 hash5-tier ovs-select" make test-vm`` runs all.
#: make test-vm also runs ovs-select, the switch's own hash on the kernel datapath: a
#: flow's socketless RST can take the other spine there, so its ACK counters show two paths
#: (docs/full-kernel.md); ``flowpaths.link_bytes`` splits them by counts.
POLICIES = os.environ.get("FABRICLAB_VM_POLICIES",
                          "hash5 ovs-select" if LANE == "full" else "hash5").split()


@pytest.fixture(scope="module")
def session(vm_image, tmp_path_factory) -> Path:
    """Everything guest_session.sh wrote, after one boot."""
    out = tmp_path_factory.mktemp("guest")
    r = fabriclab("vm", "exec", "--out", str(out), "--", "bash",
                  "tests/vm/guest_session.sh", "/mnt/out", " ".join(POLICIES), LANE,
                  timeout=3600)
    assert "== kill: done" in r.stdout
    return out


def guest_result(session: Path, name: str) -> dict:
    if name.startswith("ecmp-") and name.removeprefix("ecmp-") not in POLICIES:
        pytest.skip(f"{name.removeprefix('ecmp-')} is not in FABRICLAB_VM_POLICIES")
    if LANE != "full" and not (session / f"{name}.rc").exists():
        pytest.skip(f"{name} runs in the full lane (make test-vm), not in {LANE}'s")
    rc = int((session / f"{name}.rc").read_text())
    log = (session / f"{name}.log").read_text()
    assert rc == 0, log[-3000:]
    return load(session / name / "result.json")


def test_image_is_cached_and_provisioned_by_the_vagrant_provisioner(vm_image):
    assert vm_image["key"] == vm.image_key()
    assert vm_image["kernel"].startswith("6.1.")
    assert "provision_s" in vm_image["timings"]
    # hls.js came from the npm registry on the host, checked, into the image's mirror.
    assert vm_image["hlsjs"].startswith(f"hls.js {hlsjs.VERSION} mirrored"), vm_image["hlsjs"]
    r = fabriclab("vm", "build", timeout=120)
    assert "cached" in r.stdout


def test_doctor_in_the_guest_shows_the_full_kernel(session):
    doc = load(session / "doctor.json")
    assert doc["datapath"] == "kernel"
    assert doc["netem"] and doc["delay"] == "netem"
    assert doc["red"] and doc["ecn"] == "red"
    assert doc["dctcp"] and {"reno", "cubic", "dctcp"} <= set(doc["congestion_controls"])
    assert doc["vm"]["accelerator"] in ("kvm", "tcg")
    assert doc["vm"]["guest_kernel"].startswith("6.1.")
    # Every part of real media on the plain Debian 12 image, hls.js installed by set-up
    # from the image's mirror (no npm there): the browser viewer is ready.
    assert doc["media"] == {"missing": [], "browser_viewer": True}, doc["media"]


@pytest.mark.parametrize("policy", [*DECIDED, "ovs-select"])
def test_ecmp_basic_on_the_kernel_datapath(session, policy):
    r = guest_result(session, f"ecmp-{policy}")
    assert validate(r) == []
    env = r["environment"]
    assert env["datapath"] == "kernel" and env["ecn"] == "red" and env["delay"] == "netem"
    assert env["vm"]["accelerator"] in ("kvm", "tcg") and env["vm"]["vcpus"] == vm.VCPUS
    assert r["metrics"]["pingall_loss_pct"] == 0
    assert len(r["flows"]) == 8
    for f in r["flows"]:
        assert f["path_clean"], f
        assert f["path"][0] == "leaf1" and f["path"][-1] == "leaf2" and len(f["path"]) == 3
        assert f["bytes"] > 0 and f["error"] is None
    # per-link bytes agree with per-flow bytes on the kernel datapath too
    problems = check_links_agree_with_flows(r)
    assert not problems, problems
    if policy in DECIDED:
        check_paths_follow_policy(r, policy)
    check_rate_profile(r)


def check_rate_profile(r: dict) -> None:
    """A guest run carries its machine's rate profile (TCG: every rate and size x
    environment.TCG_RATE_SCALE, or the scenario's own tcg_rate_scale) in its parameters.
    Whether it was fidelity-valid at it is a timing target, measured by bench/vm_lane.py
    (docs/full-kernel.md), not asserted here."""
    tcg = r["environment"]["vm"]["accelerator"] == "tcg"
    profile = r["params"].get("tcg_rate_scale", environment.TCG_RATE_SCALE)
    assert r["params"]["rate_scale"] == (profile if tcg else 1.0)
    print("fidelity:", r["fidelity"]["valid"], r["fidelity"]["cpu_idle_min_pct"],
          r["fidelity"].get("lab_cpu_pct"))


@pytest.mark.parametrize("policy", DECIDED)
def test_the_two_datapaths_agree(session, tmp_path, policy):
    """Same scenario and seed on this machine's userspace datapath: same path per flow,
    same flows per uplink, goodput and imbalance within the stated tolerances."""
    guest = guest_result(session, f"ecmp-{policy}")
    # At the guest's rate profile: the same offered load relative to the same links.
    host = run_result(tmp_path, "--policy", policy, "--seed", "1", "--duration", "5",
                      "--set", f"rate_scale={guest['params']['rate_scale']}")
    assert host["environment"]["datapath"] in ("user", "kernel")
    path = {(f["src"], f["sport"]): f["path"] for f in host["flows"]}
    assert {(f["src"], f["sport"]): f["path"] for f in guest["flows"]} == path
    gm, hm = guest["metrics"], host["metrics"]
    assert gm["flows_per_uplink"] == hm["flows_per_uplink"]
    # Same placement, so the same bottleneck: the link that dropped most is the same one, and
    # the imbalance (bytes per uplink) is within 0.1, the offline-vs-emulated tolerance.
    def worst(r: dict) -> str | None:
        drops = {f"{ln['node']}->{ln['peer']}": ln.get("drops", 0) for ln in r["links"]}
        top = max(drops, key=drops.get) if drops else None
        return top if top is not None and drops[top] > 0 else None
    if worst(guest) and worst(host):
        assert worst(guest) == worst(host)
    assert gm["imbalance"] == pytest.approx(hm["imbalance"], abs=0.1)
    offered = hm["offered_bps"]
    print(f"{policy}: goodput VM {gm['aggregate_goodput_bps'] / 1e6:.1f}, host "
          f"{hm['aggregate_goodput_bps'] / 1e6:.1f} of {offered / 1e6:.1f} Mbit/s; VM fidelity "
          f"{guest['fidelity']['valid']}")
    # Goodput is a timing number: where both runs were fidelity-valid it is within 10 % of
    # the offered load, the spread of one datapath's own repeated runs. Drops may differ in
    # count (kernel vs userspace segmentation, TSO batching) but not in where they happen.
    if guest["fidelity"]["valid"] and host["fidelity"]["valid"]:
        assert abs(gm["aggregate_goodput_bps"] - hm["aggregate_goodput_bps"]) <= 0.10 * offered


#: A socketless RST's frame: the kernel answers a segment that reaches a closed socket with
#: one, hashed from its headers, not the socket's hash (docs/full-kernel.md).
RST_FRAME_BYTES = 54


def test_ovs_select_uses_the_kernel_datapath_hash(session):
    """ovs-select's choice is the datapath's own hash: it may differ from the userspace
    one; the split is recorded (docs/full-kernel.md), and every flow has one clean path, its
    ACKs too but for socketless RSTs on the other spine, which the result notes."""
    r = guest_result(session, "ecmp-ovs-select")
    assert len(r["flows"]) == 8
    notes = " ".join(r["fidelity"]["notes"])
    for f in r["flows"]:
        # The switches counted each flow on one spine only, with bytes on it.
        assert f["path_clean"] and f["bytes"] > 0, f
        path = f["path"]
        assert len(path) == 3 and (path[0], path[-1]) == ("leaf1", "leaf2"), f
        assert path[1] in {"spine1", "spine2"}, f
        # Its ACKs on one spine too; the other counts at most two RSTs (captured: one a
        # flow, in 1-2 flows of 8 a run), and the result says which flows.
        back = f["reverse_hop_bytes"]
        spines = sorted(("spine1", "spine2"), key=lambda s: back.get(s, 0))
        stray = back.get(spines[0], 0)
        assert back["leaf2"] == back["leaf1"] == back[spines[1]] + stray > 0, f
        assert stray % RST_FRAME_BYTES == 0 and stray <= 2 * RST_FRAME_BYTES, f
        assert f["reverse_path_clean"] == (stray == 0), f
        assert (stray > 0) == (f["id"] in notes), (f["id"], notes)
    # and the split per uplink is the flows' own paths, every flow counted once
    per_uplink = r["metrics"]["flows_per_uplink"]
    assert set(per_uplink) == {"leaf1->spine1", "leaf1->spine2"}, per_uplink
    assert per_uplink == {up: sum(f"leaf1->{f['path'][1]}" == up for f in r["flows"])
                          for up in per_uplink}, per_uplink


def test_link_paths_in_the_guest(session):
    """tests/guest (delay = RTT, byte queue under netem, telemetry's queue) ran in the
    guest, every test passed and none skipped: the guest has netem."""
    suite = ET.parse(session / "guest-junit.xml").getroot().find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    print(counts, (session / "guest-tests.log").read_text()[-3000:])
    assert counts["tests"] >= 5 and counts["failures"] == counts["errors"] == 0, counts
    assert counts["skipped"] == 0, counts


@pytest.mark.vm_full
def test_incast_ecn_red_and_dctcp(session):
    """RED programmed by the controller marks on the wire; the dctcp phase (K from DCTCP's
    rule for the rate and the measured RTT) retransmits less than tail-drop."""
    r = guest_result(session, "incast")
    assert r["environment"]["ecn"] == "red"
    ph = r["metrics"]["phases"]
    assert set(ph) == {"tail-drop", "ecn", "dctcp"} and not r["metrics"]["phases_skipped"]
    k = ph["dctcp"]["marking"]["k_rule"]
    print(f"K {k['k_bytes']} B from rate {k['rate_bps']} and RTT {k['rtt_ms']} ms; retransmits"
          f" tail-drop {ph['tail-drop']['retransmits']}, ecn {ph['ecn']['retransmits']}, "
          f"dctcp {ph['dctcp']['retransmits']}; CE on the wire: ecn "
          f"{ph['ecn']['wire']['ecn']['ce']}, dctcp {ph['dctcp']['wire']['ecn']['ce']}")
    assert k["k_bytes"] > k["rate_bps"] / 8 * k["rtt_ms"] / 1000 / 7
    assert ph["dctcp"]["cc"] == "dctcp" and ph["dctcp"]["errors"] == []
    assert ph["ecn"]["ce_marked"] > 0 and ph["dctcp"]["ce_marked"] > 0
    assert ph["tail-drop"].get("ce_marked", 0) == 0
    assert ph["ecn"]["wire"]["ecn"]["ce"] > 0 and ph["dctcp"]["wire"]["ecn"]["ce"] > 0
    assert ph["dctcp"]["retransmits"] < ph["tail-drop"]["retransmits"]
    check_rate_profile(r)


@pytest.mark.vm_full
def test_streaming_incident_two_phases_with_wan_delay(session):
    r = guest_result(session, "streaming")
    assert r["environment"]["datapath"] == "kernel"
    assert set(r["metrics"]["phases"]) == {"before-upgrade", "incident"}
    fid = r["fidelity"]
    assert fid["wan_delay"] == "netem", fid
    assert fid["wan_delay_ms"] == [r["topology"]["params"]["wan_delay_ms"]]
    # Every stream arrived, and the incident is the incident: its elephants stall viewers.
    ph = r["metrics"]["phases"]
    assert all(f["received"] for d in r["phase_details"].values() for f in d["flows"])
    assert ph["before-upgrade"]["stalls"] == 0 and ph["incident"]["stalls"] > 0, ph
    check_rate_profile(r)


@pytest.mark.vm_full
def test_streaming_incident_on_real_media_in_the_guest(session):
    """ffmpeg pushers, nginx-rtmp (media server, origin, CDN) and real viewers on the kernel
    datapath with netem's WAN delay, at the guest's rate profile with fewer streams
    (guest_session.sh). Every stream is published, relayed and watched; the incident puts
    both big streams on one uplink, which drops while its siblings idle. Whether their
    viewers stall is the emulator's to decide under TCG (docs/kinds/streaming.md: its CPU,
    not the network, sets the pace there), so it is asserted only with KVM."""
    r = guest_result(session, "streaming-real")
    assert r["environment"]["datapath"] == "kernel" and r["metrics"]["media"] == "real"
    assert r["fidelity"]["wan_delay"] == "netem"
    ph, details = r["metrics"]["phases"], r["phase_details"]
    assert set(ph) == {"before-upgrade", "incident"}
    origin = next(h["name"] for h in r["topology"]["hosts"] if h.get("role") == "origin")
    for name, d in details.items():
        roles = {f["role"] for f in d["flows"]}
        assert {"ingest", "big", "relay"} <= roles, (name, roles)
        for f in d["flows"]:
            if f["role"] == "relay":       # the origin receives it from the media server
                assert f["dst"] == origin and f["bytes"] > 0, f
                continue
            rtmp = f["players"]["rtmp"]
            assert f["received"] and rtmp["startup_delay_s"] is not None, (name, f["id"])
        seen = {**r, "links": d["links"], "flows": d["flows"]}
        assert check_links_agree_with_flows(seen) == [], name
    inc = ph["incident"]
    hot = inc["hottest_uplink"]
    bigs = [f for f in details["incident"]["flows"] if f["role"] == "big"]
    assert len(bigs) == 2 and all(f["uplinks"] == [hot] for f in bigs), bigs
    assert inc["uplink_drops"][hot] > 0
    others = [u for n, u in inc["uplinks"].items() if n != hot]
    assert max(others) < 0.1, inc["uplinks"]
    print("real media in the guest: stalls before", ph["before-upgrade"]["stalls"],
          "incident", inc["stalls"], inc["stall_s"], "drops", inc["uplink_drops"][hot])
    if r["environment"]["vm"]["accelerator"] == "kvm":
        assert ph["before-upgrade"]["stalls"] == 0 and inc["stalls"] > 0
    check_rate_profile(r)


@pytest.mark.vm_full
def test_the_browser_viewer_plays_on_the_plain_debian_image(session):
    """hls.js, installed by set-up on the plain Debian 12 image (from the image's mirror:
    no npm there), plays a stream in headless Chromium: one stream of one server, 40 s,
    so that Chromium starts and plays under TCG (22 s to its first frame; beside the
    incident's players it did not load its page in 12 s). Its versions come from the page,
    its first frame from hls.js. The run's network numbers are not asserted: under TCG its
    datapath waits (the emulator's CPU), as the real-media incident's does."""
    r = guest_result(session, "browser")
    assert r["metrics"]["media"] == "real"
    browsers = [f["players"]["hlsjs"] for f in r["flows"]
                if (f.get("players") or {}).get("hlsjs") is not None]
    assert len(browsers) == 1, browsers
    b = browsers[0]
    print("browser viewer in the guest:", b["player"], "startup", b["startup_delay_s"],
          "stalls", b["stalls"])
    assert f"hls.js {hlsjs.VERSION} in Chromium" in b["player"], b
    assert b["startup_delay_s"] is not None, b


@pytest.mark.vm_full
def test_allreduce_on_the_kernel_datapath(session):
    """The ring on the kernel datapath: every phase ran without error, every ring hop
    carried bytes on one clean path, and the links' counters agree with the flows'."""
    r = guest_result(session, "allreduce")
    assert r["environment"]["datapath"] == "kernel"
    assert r["metrics"]["phases"]
    for name, m in r["metrics"]["phases"].items():
        assert m["errors"] == [], (name, m["errors"])
        d = r["phase_details"][name]
        ring = [f for f in d["flows"] if f["kind"] == "allreduce"]
        assert ring and all(f["bytes"] > 0 and f["path_clean"] for f in ring), name
        seen = {**r, "links": d["links"], "flows": d["flows"]}
        assert check_links_agree_with_flows(seen) == [], name


@pytest.mark.vm_full
def test_roce_dcqcn_marked_by_red_on_ports_with_classes(session):
    """pfc-hol on the full kernel: the marking is the kernel's RED on the lossless class's
    leaf (the host's CI kernel has only the tc-bpf marker). It marks the incast in the DCQCN
    phase and nothing alone, and the incast's receivers send CNPs. The lossless class's
    drops are a network number: held to 0 where the phase was fidelity-valid."""
    r = guest_result(session, "pfc-red")
    assert r["environment"]["ecn"] == "red"
    ph = r["metrics"]["phases"]
    assert {"alone", "dcqcn"} <= set(ph) and not r["metrics"].get("phases_skipped")
    dcqcn = ph["dcqcn"]
    print(f"dcqcn: CE {dcqcn['ce_marked']}, incast CNPs {dcqcn['groups']['incast']['cnps']}, "
          f"paused {dcqcn['pause_time_s']} s, lossless drops {dcqcn['lossless_drops']}")
    assert dcqcn["ce_marked"] > 0 and dcqcn["groups"]["incast"]["cnps"] > 0
    assert ph["alone"].get("ce_marked", 0) == 0
    for name, valid in r["fidelity"]["phases"].items():
        if valid.get("valid"):
            assert ph[name]["lossless_drops"] == 0, name
    check_rate_profile(r)


def test_kill_9_in_the_guest_then_clean(session):
    k = load(session / "kill.json")
    assert k["before"]["bridges"] and k["before"]["processes"], k
    assert not any(k["after"].values()), k
    assert int((session / "clean.rc").read_text()) == 0
    assert "removed run" in (session / "clean.log").read_text()


def test_vm_run_passes_exit_status_summary_and_progress(vm_image, tmp_path):
    out = tmp_path / "out"
    r = fabriclab("vm", "run", "ecmp-basic", "--policy", "hash5", "--seed", "2",
                  "--duration", "4", "--out", str(out), timeout=1800)
    assert "vm: booting" in r.stdout and "guest ready" in r.stdout
    assert "flows for 4 s" in r.stdout                      # progress from the guest
    assert "datapath=kernel" in r.stdout and "fidelity" in r.stdout   # its summary
    res = load(out / "result.json")
    assert res["environment"]["vm"]["accelerator"] in ("kvm", "tcg")
    assert res["seed"] == 2
    bad = fabriclab("vm", "run", "ecmp-basic", "--set", "topology.spines=0", check=False)
    assert bad.returncode == 2 and "topology.spines" in bad.stderr
    assert "booting" not in bad.stdout


@pytest.mark.vm_full      # a VM boot for one exit status: make test-vm only
def test_a_failing_command_passes_its_exit_status(vm_image):
    r = fabriclab("vm", "exec", "--", "sh", "-c", "echo from-the-guest; exit 7", check=False)
    assert r.returncode == 7 and "from-the-guest" in r.stdout


def test_kill_9_of_the_vm_then_clean(vm_image, tmp_path):
    proc = subprocess.Popen([*CLI, "vm", "exec", "--", "sleep", "600"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "guest ready" in line:
            break
    qemu = [int(p["pid"]) for rec in state.stale_records()[1]
            for p in rec.pids if p["what"] == "qemu"]
    assert qemu
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.exists(f"/proc/{qemu[0]}")          # QEMU outlived its owner
    fabriclab("clean")
    # Gone: not running, and not a zombie waiting for whoever adopted it to reap it.
    assert not state.pid_alive(qemu[0], None)
    assert not any((vm.CACHE_DIR / "boots").iterdir())


def test_a_guest_that_does_not_boot_shows_its_console(vm_image):
    # 12 s under TCG: the kernel and the initramfs have printed, the guest's job has not
    # begun (it is ready after 23-57 s here; 25 s was once met, in 23.3 s).
    env = {**os.environ, "FABRICLAB_VM_BOOT_TIMEOUT": "12"}
    r = subprocess.run([*CLI, "vm", "exec", "--", "true"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    print(r.stdout, r.stderr, file=sys.stderr)
    assert r.returncode == 2
    assert "did not boot within 12 s" in r.stderr
    assert "console:" in r.stderr                      # the last console lines
