"""`fabriclab vm` without booting: the image's inputs, the accelerator choice, bad input."""

from __future__ import annotations

import subprocess
import sys
import tarfile

import pytest

from lab.machine import qemu, vm

REPO = vm.REPO


def test_set_up_and_the_image_read_one_package_list():
    listed = subprocess.run(
        ["bash", "-c", "REPO=.; mapfile -t A < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "
                       "lab/packages.txt); printf '%s\\n' \"${A[@]}\""],
        cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert listed == vm.apt_packages()
    assert {"mininet", "openvswitch-switch", "iperf3", "frr"} <= set(listed)
    assert "mapfile -t APT_PKGS" in (REPO / "lab" / "setup.sh").read_text()


def test_the_ryu_pins_come_from_set_up():
    assert vm.setup_sh_array("RYU_PKGS") == ["ryu==4.34", "eventlet==0.33.3",
                                             "dnspython==2.2.1"]
    assert vm.setup_sh_array("RYU_BUILD_DEPS") == ["setuptools<68", "wheel", "pbr"]


def test_image_key_changes_with_each_input(monkeypatch, tmp_path):
    key = vm.image_key()
    assert key == vm.image_key() and len(key) == 16
    for rel in vm.IMAGE_INPUTS:
        copy = tmp_path / "repo"
        if copy.exists():
            import shutil
            shutil.rmtree(copy)
        for other in vm.IMAGE_INPUTS:
            (copy / other).parent.mkdir(parents=True, exist_ok=True)
            (copy / other).write_bytes((REPO / other).read_bytes())
        monkeypatch.setattr(vm, "REPO", copy)
        assert vm.image_key() == key
        (copy / rel).write_bytes((copy / rel).read_bytes() + b"\n# changed\n")
        assert vm.image_key() != key, rel
        monkeypatch.setattr(vm, "REPO", REPO)


def test_no_hardware_virtualisation_means_tcg_without_a_probe(monkeypatch):
    monkeypatch.delenv("FABRICLAB_VM_ACCEL", raising=False)
    monkeypatch.setattr(qemu, "cpu_flags", lambda: {"fpu", "sse2"})
    # The kernel path is never touched: no probe runs without vmx/svm.
    assert qemu.accelerator(REPO / "does-not-exist") == "tcg"
    monkeypatch.setenv("FABRICLAB_VM_ACCEL", "kvm")
    assert qemu.accelerator() == "kvm"


def test_missing_tools_are_named_in_one_line(monkeypatch):
    monkeypatch.setattr(qemu.shutil, "which", lambda tool: None if tool == "mmdebstrap"
                        else "/usr/bin/" + tool)
    with pytest.raises(vm.MachineError) as exc:
        qemu.require_tools(build=True)
    assert str(exc.value) == "vm: mmdebstrap not found (apt-get install mmdebstrap)"
    qemu.require_tools(build=False)          # booting needs no mmdebstrap


def test_the_checkout_goes_in_without_venvs_or_results(tmp_path):
    dest = tmp_path / "c.tar"
    vm.checkout_tar(dest)
    with tarfile.open(dest) as tar:
        names = set(tar.getnames())
    assert {"setup.py", "lab/machine/vm.py", "lab/provision.sh",
            "tests/vm/guest_session.sh"} <= names
    assert not any(n.startswith((".venv", "results/", ".git/")) for n in names)


@pytest.mark.parametrize("args,field", [
    (["vm", "run", "nosuch"], "scenario"),
    (["vm", "run", "ecmp-basic", "--set", "topology.spines=0"], "topology.spines"),
    (["vm", "run", "ecmp-basic", "--policy", "nosuch"], "policy"),
    (["vm", "exec"], "vm exec"),
])
def test_bad_input_is_refused_before_anything_boots(args, field):
    r = subprocess.run([sys.executable, "-m", "lab.cli", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fabriclab: error: {field}"), r.stderr
    assert "booting" not in r.stdout
