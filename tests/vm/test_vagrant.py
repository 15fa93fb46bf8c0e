"""The README's Vagrant lines, for real, offline: `vagrant up`, the demo over `vagrant ssh`,
`vagrant destroy -f`, with the libvirt provider under TCG on this machine.

The box is the one `make vagrant-box` adds (``lab.machine.vagrantbox``: the VM lane's image
made a Vagrant box); the Vagrantfile is the repository's own, provisioner and all. libvirt's
daemons are started here when none run (no systemd) and stopped by their PIDs after. Nothing
may be left: no domain, no libvirt network, no QEMU, no dnsmasq, no volume this test made.
Each phase's time is printed (docs/vagrant.md has the numbers).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.machine import vagrantbox
from lab.model.result import validate
from tests.vm.conftest import REPO

pytestmark = [pytest.mark.vm_full,
              pytest.mark.skipif(not (shutil.which("vagrant") and shutil.which("libvirtd")
                                      and shutil.which("virsh")),
                                 reason="needs vagrant, vagrant-libvirt and libvirt "
                                        "(make vagrant-setup)")]

VIRSH = ["virsh", "-c", "qemu:///system"]
#: vagrant-libvirt's domain name: the Vagrantfile's folder and the machine's name.
DOMAIN = f"{REPO.name}_default"
#: vagrant-libvirt's management network (NAT, dnsmasq DHCP), made by `up`, gone at `destroy`.
NETWORK = "vagrant-libvirt"
POOL = "default"
BUILTIN_CHAINS = {"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"}
#: The lines of `vagrant up` that start a phase, in order, and the phase's name.
PHASES = (("Uploading base box image", "box upload"),
          ("Creating image (snapshot of base box volume)", "domain created"),
          ("Starting domain", "domain starting"),
          ("Waiting for domain to get an IP address", "waiting for DHCP"),
          ("Waiting for machine to boot", "waiting for ssh"),
          ("Machine booted and ready", "booted"),
          ("Rsyncing folder", "rsync"),
          ("Running provisioner: fabriclab-setup", "provisioning"))


def virsh(*args: str, check: bool = True) -> str:
    r = subprocess.run([*VIRSH, *args], capture_output=True, text=True, check=False)
    if check:
        assert r.returncode == 0, f"virsh {' '.join(args)}: {r.stderr.strip()}"
    return r.stdout


def names(*args: str) -> set[str]:
    return {ln.strip() for ln in virsh(*args).splitlines() if ln.strip()}


def pool_volumes() -> set[str]:
    if POOL not in names("pool-list", "--all", "--name"):
        return set()
    return {ln.split()[0] for ln in virsh("vol-list", POOL).splitlines()[2:] if ln.strip()}


def processes(word: str) -> list[str]:
    """Command lines of this machine's processes that name ``word`` (to look, never to kill)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if word in cmd:
                found.append(f"{proc.name}: {cmd[:200]}")
    return found


def firewall() -> dict[str, list[str]]:
    """The root namespace's iptables rules and chains, per tool and table, as saved."""
    tables: dict[str, list[str]] = {}
    for tool in ("iptables", "ip6tables"):
        r = subprocess.run([f"{tool}-save"], capture_output=True, text=True, check=False)
        table = ""
        for line in r.stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith((":", "-A ")):
                tables.setdefault(f"{tool} {table}", []).append(line.split(" [")[0])
    return tables


def undo_firewall(before: dict[str, list[str]]) -> list[str]:
    """Remove the rules, then the chains, that libvirt's NAT network added and left (it
    keeps its LIBVIRT_* chains after the network is gone); what was there before stays."""
    undone = []
    for key, lines in firewall().items():
        tool, table = key.split()
        old = set(before.get(key, []))
        for line in [ln for ln in lines if ln.startswith("-A ") and ln not in old]:
            spec = line.split()[1:]
            subprocess.run([tool, "-t", table, "-D", *spec], capture_output=True, check=False)
            undone.append(f"{tool} -t {table} -D {' '.join(spec)}")
        for line in [ln for ln in lines if ln.startswith(":") and ln not in old]:
            chain = line[1:].split()[0]
            if chain not in BUILTIN_CHAINS:
                subprocess.run([tool, "-t", table, "-X", chain], capture_output=True,
                               check=False)
                undone.append(f"{tool} -t {table} -X {chain}")
    # The tables themselves, where iptables (nft's) made them for libvirt and they are empty.
    family = {"iptables": "ip", "ip6tables": "ip6"}
    for key, lines in firewall().items():
        tool, table = key.split()
        if key not in before and not [ln for ln in lines if ln.startswith("-A ")]:
            subprocess.run(["nft", "delete", "table", family[tool], table],
                           capture_output=True, check=False)
            undone.append(f"nft delete table {family[tool]} {table}")
    return undone


@pytest.fixture(scope="module")
def libvirt() -> Iterator[dict[str, set[str]]]:
    """libvirt running (its daemons started here if need be, stopped after by PID); what
    existed before, so the test removes only what it made."""
    forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    rules = firewall()
    kvm = os.stat("/dev/kvm") if os.path.exists("/dev/kvm") else None
    started = vagrantbox.start_daemons()
    print(f"libvirt daemons started here: {started or 'none (already running)'}")
    before = {"domains": names("list", "--all", "--name"),
              "networks": names("net-list", "--all", "--name"),
              "pools": names("pool-list", "--all", "--name"), "volumes": pool_volumes()}
    if DOMAIN in before["domains"] or NETWORK in before["networks"]:
        if started:                   # a skip runs no teardown: stop them now
            vagrantbox.stop_daemons()
        pytest.skip(f"a domain {DOMAIN} or network {NETWORK} exists already (not this test's)")
    yield before
    # What this test's volumes (the uploaded box) and pool it made are removed; then the
    # daemons it started, by PID.
    for vol in pool_volumes() - before["volumes"]:
        virsh("vol-delete", "--pool", POOL, vol, check=False)
    if POOL not in before["pools"] and POOL in names("pool-list", "--all", "--name"):
        virsh("pool-destroy", POOL, check=False)
        virsh("pool-undefine", POOL, check=False)
    if started:
        print("stopped:", vagrantbox.stop_daemons())
        # A NAT network turns forwarding on machine-wide and leaves its chains: undone.
        print("firewall undone:", undo_firewall(rules))
        Path("/proc/sys/net/ipv4/ip_forward").write_text(forwarding)
        assert firewall() == rules
        if kvm is not None:       # the daemons' start gave it to group kvm; given back
            now = os.stat("/dev/kvm")
            assert (now.st_mode, now.st_gid) == (kvm.st_mode, kvm.st_gid)
        left = [f"{name} ({pid})" for name, pid in started.items()
                if vagrantbox.alive(pid, name)]
        assert not left, f"libvirt daemons still running: {left}"


def vagrant_env(dotfile: Path) -> dict[str, str]:
    """Offline: no version check, no box update check; this test's own machine state."""
    return {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1",
            "VAGRANT_BOX_UPDATE_CHECK_DISABLE": "1", "VAGRANT_DEFAULT_PROVIDER": "libvirt",
            "VAGRANT_DOTFILE_PATH": str(dotfile), "VAGRANT_NO_COLOR": "1"}


class Console:
    """The guest's serial console (its pty under libvirt) copied to a file, for the error
    message when a boot fails; the copier is this test's own process, stopped by PID."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc: subprocess.Popen | None = None

    def attach(self) -> None:
        for _ in range(100):
            pty = virsh("ttyconsole", DOMAIN, check=False).strip()
            if pty.startswith("/dev/"):
                self.proc = subprocess.Popen(["cat", pty], stdout=open(self.path, "wb"),  # noqa: SIM115
                                             stderr=subprocess.DEVNULL)
                return
            time.sleep(0.5)

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no console output)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def vagrant_up(env: dict[str, str], console: Console, timeout_s: float = 3600
               ) -> tuple[int, str, dict[str, float]]:
    """`vagrant up`, its output streamed and stamped: exit status, output, and the seconds
    from its start at which each phase began (``end`` when it returned)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(["vagrant", "up", "--provider", "libvirt"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killer = threading.Timer(timeout_s, proc.kill)
    killer.start()
    lines, marks = [], {}
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "Progress:" not in line:
            sys.stdout.write(f"[{time.monotonic() - t0:7.1f}] {line}")
        for text, phase in PHASES:
            if text in line and phase not in marks:
                marks[phase] = round(time.monotonic() - t0, 1)
                if phase == "domain starting":
                    threading.Thread(target=console.attach, daemon=True).start()
    rc = proc.wait()
    killer.cancel()
    marks["end"] = round(time.monotonic() - t0, 1)
    return rc, "".join(lines), marks


def vagrant(env: dict[str, str], *args: str, timeout_s: float = 3600, show: bool = True
            ) -> subprocess.CompletedProcess:
    """A vagrant command in the checkout; its output printed unless ``show`` is False."""
    t = time.monotonic()
    r = subprocess.run(["vagrant", *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=timeout_s)
    print(f"$ vagrant {' '.join(args)[:200]}   ({time.monotonic() - t:.1f} s, "
          f"exit {r.returncode})")
    if show:
        print(r.stdout[-6000:])
    print(r.stderr[-3000:], file=sys.stderr)
    return r


def test_vagrant_up_demo_destroy_offline(libvirt, tmp_path):
    """`make vagrant-box`, then the README's lines; a valid result; nothing left after."""
    r = subprocess.run([sys.executable, "-m", "lab.machine.vagrantbox", "add"], cwd=REPO,
                       capture_output=True, text=True, timeout=7200)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stderr[-3000:]

    env = vagrant_env(tmp_path / "dotvagrant")
    console = Console(tmp_path / "console.log")
    timings: dict[str, float] = {}
    try:
        rc, out, marks = vagrant_up(env, console)
        print("vagrant up phases (s from start):", marks)
        assert rc == 0, f"vagrant up exited {rc}:\n{out[-4000:]}\nconsole:\n{console.tail()}"
        assert "Running provisioner: fabriclab-setup" in out
        assert "[setup] ready:" in out, out[-4000:]
        timings["vagrant_up_s"] = marks["end"]
        timings["boot_s"] = round(marks["booted"] - marks["domain starting"], 1)
        timings["provision_s"] = round(marks["end"] - marks["provisioning"], 1)
        if "box upload" in marks:
            timings["box_upload_s"] = round(marks["domain created"] - marks["box upload"], 1)

        t = time.monotonic()
        demo = vagrant(env, "ssh", "-c", "cd /vagrant && sudo make demo")
        timings["demo_s"] = round(time.monotonic() - t, 1)
        assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-2000:]
        # The demo prints a summary per policy, each ending with its result's path.
        paths = re.findall(r"^\s*result\s+(results/\S+/result\.json)\s*$", demo.stdout, re.M)
        assert paths, demo.stdout[-4000:]
        got = vagrant(env, "ssh", "-c", "cd /vagrant && python3 -c 'import json, sys; "
                      "print(json.dumps([json.load(open(p)) for p in sys.argv[1:]]))' "
                      + " ".join(paths), show=False)
        assert got.returncode == 0, got.stderr
        results = json.loads(got.stdout)
        for path, result in zip(paths, results, strict=True):
            assert validate(result) == [], (path, validate(result))
            envr = result["environment"]
            # The guest's full kernel, as `fabriclab vm`'s: OVS kernel datapath, netem, RED.
            assert envr["datapath"] == "kernel" and envr["delay"] == "netem", envr
            assert envr["ecn"] == "red", envr
            assert len(result["flows"]) == 8 and all(f["bytes"] > 0 for f in result["flows"])
            if re.search(r"Domain type:\s+qemu", out):
                assert envr["vm"]["accelerator"] == "tcg", envr
            # Fidelity under TCG is a timing figure (docs/vagrant.md), printed, not asserted.
            print(f"{path}: {result['params'].get('policy')} fidelity "
                  f"{result['fidelity']['valid']}, goodput "
                  f"{result['metrics']['aggregate_goodput_bps'] / 1e6:.1f} Mbit/s")
    finally:
        t = time.monotonic()
        destroy = vagrant(env, "destroy", "-f", timeout_s=600)
        timings["destroy_s"] = round(time.monotonic() - t, 1)
        console.stop()
        print("vagrant timings:", json.dumps(timings))
    assert destroy.returncode == 0, destroy.stderr

    # Nothing left: no domain, no network (nor its bridge's dnsmasq), no QEMU.
    assert DOMAIN not in names("list", "--all", "--name")
    assert names("net-list", "--all", "--name") == libvirt["networks"]
    assert not processes(f"guest={DOMAIN}"), processes(f"guest={DOMAIN}")
    assert not processes(f"/var/lib/libvirt/dnsmasq/{NETWORK}.conf")
