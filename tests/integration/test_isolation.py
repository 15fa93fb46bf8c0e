"""The lab stays inside itself: packets, listening sockets and files.

A lab that leaks is a lab nobody may run on a shared machine: a lab packet on the machine's
own interfaces reaches a real network (and the lab's 10.0.0.0/8 hosts may collide with real
ones), a controller listening on 0.0.0.0 is a switch-programming API open to the network,
and files written outside the run's folders accumulate where nobody cleans them. Each claim
is checked on a real `fabriclab run ecmp-basic`, from outside the lab:

- packets: tcpdump on every interface the machine had before the run (its own: lo, eth0,
  ...), filtered for the lab hosts' addresses and MACs: zero captured. A canary sent on lo
  proves each capture pipeline counts what it should.
- sockets: during traffic, ``ss`` in the root namespace (the lab's processes, found by their
  run marker, and the Open vSwitch daemons it drives) and in every lab host's namespace.
- files: ``find -newer`` a marker after the run. The machine is shared (CI, colleagues'
  runs), so a new file is blamed on the lab only if the run's own process tree wrote it:
  the run goes under ``strace -f``, which names every file its processes open for writing
  or rename into place.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from controllers import cbuild
from lab.machine import state
from lab.model import scenario
from lab.net.topologies import describe, make_topology
from tests.integration.support import LAB_INTF, LAB_NODE, REPO, RunWatcher, record_of

os.environ.setdefault(state.LOCK_WAIT_ENV, "1800")

DURATION = 3.0
CANARY_PORT = 9                      # discard: nothing answers, nothing is disturbed
#: Open vSwitch's own files: ovsdb-server commits every bridge the lab adds or deletes to
#: its database and both daemons log it. They are OVS's state, written by the daemons
#: (not by the lab's processes) when the lab asks for bridges.
OVS_OWN = ("/etc/openvswitch", "/var/lib/openvswitch", "/var/log/openvswitch")
PSEUDO = ("/proc", "/sys", "/dev")
#: Calls that create or change a file's content or name; all of the run's processes.
STRACE_CALLS = "open,openat,openat2,creat,rename,renameat,renameat2,link,linkat,truncate"
WRITE_FLAGS = re.compile(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND")


# -- what the lab is -----------------------------------------------------------------------
def lab_hosts() -> list[dict]:
    """ecmp-basic's hosts (name, ip, mac), as the lab will build them."""
    sc = scenario.load("ecmp-basic")
    return describe(make_topology(sc.params["topology"]))["hosts"]


def capture_filter(hosts: list[dict]) -> str:
    """Any frame to or from a lab host, by IP (ARP included) or by MAC."""
    return " or ".join([f"host {h['ip']}" for h in hosts]
                       + [f"ether host {h['mac']}" for h in hosts])


def own_interfaces() -> tuple[list[str], list[str]]:
    """(up, down) interfaces of the machine: what exists before the run, minus the lab's
    (switch ports and bridges of a run in progress) and Open vSwitch's datapath device."""
    up, down = [], []
    for name in sorted(os.listdir("/sys/class/net")):
        if LAB_INTF.fullmatch(name) or LAB_NODE.fullmatch(name) or name.startswith("ovs-"):
            continue
        flags = int(Path(f"/sys/class/net/{name}/flags").read_text(), 16)
        (up if flags & 0x1 else down).append(name)
    return up, down


# -- packets ---------------------------------------------------------------------------------
class Capture:
    """tcpdump on one interface into a pcap, started and stopped by its PID."""

    def __init__(self, intf: str, bpf: str, out: Path) -> None:
        self.intf, self.pcap, self.log = intf, out / f"{intf}.pcap", out / f"{intf}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(["tcpdump", "-n", "-U", "-i", intf, "-w",
                                          str(self.pcap), bpf], stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while "listening on" not in self.log.read_text():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, f"tcpdump on {intf} did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=10)

    def count(self, bpf: str) -> list[str]:
        """The captured packets matching ``bpf``, one line each (tcpdump's indented hex
        dump of an unknown ethertype continues a packet, it is not one)."""
        out = subprocess.run(["tcpdump", "-n", "-r", str(self.pcap), bpf],
                             capture_output=True, text=True, check=True)
        return [line for line in out.stdout.splitlines() if line and not line[0].isspace()]


def send_canary() -> None:
    """One UDP datagram on lo that the captures must see (proves they count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"fabriclab isolation canary", ("127.0.0.1", CANARY_PORT))


# -- sockets ---------------------------------------------------------------------------------
def ss(*args: str, netns_of: int | None = None) -> list[str]:
    """``ss -H ARGS`` in the root namespace or in the network namespace of ``netns_of``."""
    cmd = ["ss", "-H", *args]
    if netns_of is not None:
        cmd = ["nsenter", "-t", str(netns_of), "-n", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()


def socket_pids(line: str) -> set[int]:
    return {int(p) for p in re.findall(r"pid=(\d+)", line)}


def local_address(line: str) -> str:
    """The local address (or a unix socket's path) of an ``ss -H -l`` line: netid, state,
    recv-q, send-q, then local."""
    return line.split()[4]


def netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def daemon_pids() -> set[int]:
    """ovs-vswitchd and ovsdb-server: the lab configures them, so their ports count too."""
    pids = set()
    for name in ("ovs-vswitchd", "ovsdb-server"):
        with contextlib.suppress(OSError, ValueError):
            pids.add(int(Path(f"/var/run/openvswitch/{name}.pid").read_text()))
    return pids


def check_root_sockets(lab_pids: set[int]) -> tuple[list[str], list[str]]:
    """(lab listeners in the root namespace, problems): TCP/UDP on 127.0.0.1 only, unix
    sockets of the lab's own processes inside the state folder."""
    checked, problems = [], []
    for line in ss("-lntup"):
        if socket_pids(line) & lab_pids:
            checked.append(line)
            if not local_address(line).startswith("127.0.0.1:"):
                problems.append(f"root namespace: lab listener not on 127.0.0.1: {line}")
    mine = lab_pids - daemon_pids()
    for line in ss("-lxp"):
        if socket_pids(line) & lab_pids:
            checked.append(line)
            path = local_address(line)
            if socket_pids(line) & mine and not path.startswith(str(state.STATE_DIR) + "/"):
                problems.append(f"root namespace: lab unix socket outside {state.STATE_DIR}: "
                                f"{line}")
    return checked, problems


def check_host_sockets(shells: dict[str, int], ips: dict[str, str]
                       ) -> tuple[list[str], list[str]]:
    """(listeners in the lab hosts' namespaces, problems): each bound to its host's address."""
    checked, problems = [], []
    for host, pid in sorted(shells.items()):
        for line in ss("-lntup", netns_of=pid):
            checked.append(f"{host}: {line}")
            addr = local_address(line).rsplit(":", 1)[0]
            if addr != ips[host]:
                problems.append(f"{host}: listener not on {ips[host]}: {line}")
        for line in ss("-lxp", netns_of=pid):
            checked.append(f"{host}: {line}")
            problems.append(f"{host}: unix listener in a lab host: {line}")
    return checked, problems


# -- files -----------------------------------------------------------------------------------
def new_files(marker: Path, skip: Iterable[str]) -> list[str]:
    """Regular files on the root file system modified after ``marker``, outside ``skip``."""
    prune: list[str] = []
    for path in skip:
        prune += ["-path", path, "-o"]
    cmd = ["find", "/", "-xdev", "(", *prune, "-path", f"{REPO}/*__pycache__", ")", "-prune",
           "-o", "-type", "f", "-newer", str(marker), "-print"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    return sorted(out.stdout.splitlines())


def traced_writes(trace_prefix: Path) -> set[str]:
    """Every path the run's processes opened for writing, created or renamed into place
    (``strace -ff -y`` files: one per process, so no call is split across lines)."""
    written: set[str] = set()
    for path in trace_prefix.parent.glob(trace_prefix.name + ".*"):
        for line in path.read_text(errors="replace").splitlines():
            call = line.split("(", 1)[0]
            if call in ("open", "openat", "openat2", "creat"):
                m = re.search(r"= \d+<(.*)>$", line)
                if m and (call == "creat" or WRITE_FLAGS.search(line)):
                    written.add(m.group(1))
            elif call.startswith(("rename", "link")) or call == "truncate":
                written.add(target_path(call, line))
    return written


def target_path(call: str, line: str) -> str:
    """The file a rename/link/truncate call wrote: its last path argument, made absolute
    with the directory strace printed for its dirfd where there is one."""
    dirs = re.findall(r"(?:AT_FDCWD|\d+)<([^>]*)>", line)
    names = re.findall(r'"((?:[^"\\]|\\.)*)"', line)
    name = names[-1] if names else ""
    if call == "truncate":
        name = names[0] if names else ""
    if name.startswith("/") or not dirs:
        return name
    return os.path.join(dirs[-1], name)


def under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


# -- the test --------------------------------------------------------------------------------
def strace_prefix(trace: Path) -> list[str]:
    """Run under strace: every process of the run, one file each, file-writing calls only
    (seccomp-bpf stops the tracee on those calls alone, so traffic is not slowed)."""
    return ["strace", "-f", "-ff", "-qq", "-y", "--seccomp-bpf", "-e", "signal=none",
            "-e", f"trace={STRACE_CALLS}", "-o", str(trace)]


def sockets_during_traffic(run: RunWatcher, ips: dict[str, str]
                           ) -> tuple[list[str], list[str], list[str]]:
    """(root-namespace lines, host-namespace lines, problems), looked at while traffic runs.

    The run's processes are those with its marker plus the CLI itself (strace's child);
    hosts' namespaces are entered through their Mininet shells, named in the run record.
    """
    cli = [int(c) for c in Path(f"/proc/{run.proc.pid}/task/{run.proc.pid}/children")
           .read_text().split()]
    assert len(cli) == 1, cli
    rec = record_of(cli[0])
    assert rec is not None, "no run record for the run"
    shells = {str(p["what"]).split(" ", 1)[1]: int(p["pid"])  # type: ignore[arg-type]
              for p in rec.pids if str(p["what"]).split(" ", 1)[-1] in ips}
    assert sorted(shells) == sorted(ips), rec.pids
    root_ns = netns(os.getpid())
    assert all(netns(p) != root_ns for p in shells.values())
    lab_pids = set(state.marked_pids(rec.run_id)) | {cli[0]} | daemon_pids()
    root, root_problems = check_root_sockets({p for p in lab_pids if netns(p) == root_ns})
    hosts, host_problems = check_host_sockets(shells, ips)
    return root, hosts, root_problems + host_problems


def files_of_run(marker: Path, trace: Path, out: Path, pytest_tmp: str
                 ) -> tuple[list[str], list[str], list[str], set[str]]:
    """(new files outside the skipped folders, those the run wrote, the run's writes outside
    its folders, all the run's writes)."""
    # the lab's own places: its state, the run's folder, and the programs it builds (a
    # cache named by their sources' digests)
    own = [str(state.STATE_DIR), str(out), str(cbuild.BUILD_DIR)]
    found = new_files(marker, [*PSEUDO, *own, pytest_tmp, *OVS_OWN])
    written = traced_writes(trace)
    allowed = [*PSEUDO, *own]
    outside = sorted(p for p in written if not under(p, allowed)
                     and not (under(p, [str(REPO)]) and "/__pycache__/" in p))
    by_run = [f for f in found if f in written or any(
        not w.startswith("/") and f.endswith("/" + w) for w in written)]
    return found, by_run, outside, written


@pytest.mark.skipif(not shutil.which("tcpdump") or not shutil.which("strace"),
                    reason="needs tcpdump and strace")
def test_lab_packets_sockets_and_files_stay_inside(tmp_path, tmp_path_factory):
    hosts = lab_hosts()
    ips = {h["name"]: h["ip"] for h in hosts}
    lab_bpf = capture_filter(hosts)
    canary_bpf = f"udp and dst port {CANARY_PORT} and host 127.0.0.1"
    up, down = own_interfaces()
    assert "lo" in up
    for d in ("captures", "trace"):
        (tmp_path / d).mkdir()
    out, trace, marker = tmp_path / "run", tmp_path / "trace" / "strace", tmp_path / "marker"
    marker.touch()
    time.sleep(0.01)      # a file written in the marker's own clock tick would not be newer

    captures = [Capture(i, f"({lab_bpf}) or ({canary_bpf})", tmp_path / "captures")
                for i in up]
    send_canary()
    run = RunWatcher("ecmp-basic", "--policy", "hash5", "--duration", f"{DURATION:g}",
                     "--out", str(out), prefix=strace_prefix(trace))
    try:
        run.wait_for("flows for")
        root_checked, host_checked, socket_problems = sockets_during_traffic(run, ips)
    finally:
        rc = run.finish(timeout=300)
        for c in captures:
            c.stop()
    assert rc == 0, run.output()

    leaked = {c.intf: c.count(lab_bpf) for c in captures}
    canaries = {c.intf: len(c.count(canary_bpf)) for c in captures}
    still_down = [i for i in down
                  if not int(Path(f"/sys/class/net/{i}/flags").read_text(), 16) & 1]
    found, found_by_run, outside, written = files_of_run(
        marker, trace, out, str(tmp_path_factory.getbasetemp().parent))

    print(f"\ninterfaces captured: {', '.join(up)} (down, not capturable: {down or 'none'}; "
          f"still down after the run: {still_down == down})")
    print(f"lab packets seen: { {i: len(v) for i, v in leaked.items()} }; canary on lo: "
          f"{canaries.get('lo')}")
    print(f"listening sockets checked: {len(root_checked)} in the root namespace, "
          f"{len(host_checked)} in {len(ips)} host namespaces")
    for line in root_checked + host_checked:
        print(f"  {' '.join(line.split()[:6])}")
    print(f"files: {len(written)} written by the run's processes (strace), {len(outside)} "
          f"outside its run and state folders; find -newer: {len(found)} new files outside "
          f"the skipped folders, {len(found_by_run)} of them the run's, "
          f"{len(found) - len(found_by_run)} by other processes on this machine")
    for f in found[:10]:
        print(f"  {'RUN' if f in found_by_run else 'other'}: {f}")

    assert canaries.get("lo", 0) >= 1, "the capture on lo missed the canary: it counts nothing"
    assert not any(leaked.values()), f"lab packets on the machine's interfaces: {leaked}"
    assert still_down == down, f"the run brought up {sorted(set(down) - set(still_down))}"
    assert not socket_problems, socket_problems
    assert any("iperf3" in line for line in host_checked), \
        f"no iperf3 server seen listening: the check looked at nothing: {host_checked}"
    assert any("127.0.0.1:" in line for line in root_checked), \
        f"the controller's OpenFlow listener was not seen: {root_checked}"
    assert not outside, f"the run wrote outside its folders: {outside}"
    assert not found_by_run, f"new files of the run outside its folders: {found_by_run}"
    assert (out / "result.json").exists()
