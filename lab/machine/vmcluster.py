"""``fabriclab vm cluster``: several full-kernel VMs on this machine, as a cluster's workers.

Two guests of the VM lane's image are two machines with their own kernels (GRE, the OVS
kernel module): exactly what a user's two servers are to Mininet's cluster edition. They
are joined by a network only they see, a QEMU socket netdev on 127.0.0.1 (one guest
listens, the other connects; no host bridge, no address outside the guests), with an MTU
of 9000 so a tunnel carries a full 1500-byte emulated packet. Each guest also has a
restricted user-mode NIC (``restrict=on``: no route out) whose only use is ssh from this
machine, forwarded from a port on 127.0.0.1.

``up`` writes one run record for all guests before QEMU starts; while the guests boot the
record's owner is this command (a ``kill -9`` of it leaves them to ``fabriclab clean``),
and once they are up, the first guest's QEMU (``clean`` leaves a running cluster alone;
``down`` stops it). The guests share one ssh key, generated here, so every guest can log
in to every other, as a cluster's head must.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from lab.machine import environment, qemu, state, vm
from lab.model import cluster as cluster_model
from lab.model.errors import MachineError

#: The network between the guests, and the guests' addresses on it (.1, .2, ...).
NET_PREFIX = "192.168.77."
NET_MTU = 9000
#: Each guest: one vCPU and 3 GiB; under TCG two guests already share this machine's cores.
VCPUS = 1
MEMORY_MB = 3072
#: Where a guest's cluster file lies (what ``fabriclab run --cluster`` is given there).
GUEST_CLUSTER_FILE = "/etc/fabriclab/cluster.yaml"
POINTER = state.STATE_DIR / "vm-cluster.json"
_USER_MAC = "52:54:00:fa:00:{:02x}"
_NET_MAC = "52:54:00:fa:01:{:02x}"
_USER_ADDR = "10.0.2.15/24"


@dataclass
class Member:
    """One guest of the cluster, as ``up`` left it."""

    name: str
    address: str
    ssh_port: int
    dir: str

    def ssh(self, key: Path, known: Path, command: str, tty: bool = False) -> list[str]:
        """argv for ``command`` in this guest, from this machine."""
        return ["ssh", "-p", str(self.ssh_port), "-i", str(key), "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=accept-new",
                "-o", "LogLevel=ERROR", *(["-tt"] if tty else ["-T"]), "root@127.0.0.1",
                command]


@dataclass
class VmCluster:
    """A running VM cluster (``vm-cluster.json``)."""

    run_id: str
    dir: str
    members: list[Member]

    @property
    def key(self) -> Path:
        return Path(self.dir) / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return Path(self.dir) / "known_hosts"

    def exec(self, command: str, member: int = 0, tty: bool = False,
             capture: bool = False) -> subprocess.CompletedProcess:
        m = self.members[member]
        return subprocess.run(m.ssh(self.key, self.known_hosts, command, tty), check=False,
                              capture_output=capture, text=True)

    def save(self) -> None:
        POINTER.parent.mkdir(parents=True, exist_ok=True)
        POINTER.write_text(json.dumps({"run_id": self.run_id, "dir": self.dir,
                                       "members": [m.__dict__ for m in self.members]}))

    @classmethod
    def load(cls) -> VmCluster:
        try:
            data = json.loads(POINTER.read_text())
        except (OSError, ValueError):
            raise MachineError("vm cluster", "no VM cluster is up (start one with "
                               "`fabriclab vm cluster up --workers 2`)") from None
        if not (state.records_dir() / f"{data['run_id']}.json").exists():
            POINTER.unlink(missing_ok=True)
            raise MachineError("vm cluster", "the VM cluster is gone (stopped, or cleaned "
                               "after its QEMU died); start one with `fabriclab vm cluster up`")
        return cls(data["run_id"], data["dir"], [Member(**m) for m in data["members"]])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spec(n: int) -> cluster_model.ClusterSpec:
    """The cluster file of ``n`` guests, as the head (the first guest) reads it."""
    workers = tuple(cluster_model.WorkerSpec(
        f"w{i + 1}", "local" if i == 0 else f"root@{NET_PREFIX}{i + 1}", f"{NET_PREFIX}{i + 1}",
        cores=VCPUS, mtu=NET_MTU) for i in range(n))
    return cluster_model.ClusterSpec(Path(GUEST_CLUSTER_FILE), "w1", workers)


def _job(i: int, text: str) -> str:
    """A guest's job: set-up, its two NICs (found by MAC), its name, ssh keys, sshd."""
    user_mac, net_mac = _USER_MAC.format(i + 1), _NET_MAC.format(i + 1)
    addr = f"{NET_PREFIX}{i + 1}"
    nic = "$(ip -o link | awk -v m={} '$0 ~ m {{sub(\":\",\"\",$2); print $2}}')"
    return "\n".join([
        vm.SETUP_STEP,
        f"u={nic.format(user_mac)}; n={nic.format(net_mac)}",
        f"ip addr add {_USER_ADDR} dev $u && ip link set $u up",
        f"ip link set $n mtu {NET_MTU} up && ip addr add {addr}/24 dev $n",
        # sudo (Mininet's cluster edition runs every remote command through it) resolves
        # the machine's own name.
        f"hostname w{i + 1} && echo w{i + 1} > /etc/hostname && "
        f"sed -i 's/fabriclab-vm/w{i + 1}/' /etc/hosts",
        "install -d -m 700 /root/.ssh && install -m 600 /mnt/job/id_ed25519 /root/.ssh/ && "
        "install -m 600 /mnt/job/id_ed25519.pub /root/.ssh/authorized_keys && "
        "cp /mnt/job/id_ed25519.pub /root/.ssh/",
        f"mkdir -p /etc/fabriclab && cat > {GUEST_CLUSTER_FILE} <<'EOF'\n{text}EOF",
        f'printf %s "${environment.VM_ENV}" > {environment.VM_FILE}',        # ssh logins
        # Set-up over ssh (`cluster setup` runs lab/provision.sh there) takes the image's
        # packages too: sshd's PAM reads /etc/environment; the guest reaches no registry.
        "".join(f"echo {k}={v} >> /etc/environment && " for k, v in vm.GUEST_PACKAGE_ENV.items())
        + "true",
        # A unit of its own: what the job leaves running is stopped with the job's unit.
        "mkdir -p /run/sshd && systemd-run --unit=fabriclab-sshd /usr/sbin/sshd -D "
        f"-o ListenAddress=10.0.2.15 -o ListenAddress={addr} "
        "-o PermitRootLogin=prohibit-password -o UseDNS=no",
        f"echo 'fabriclab vm cluster: w{i + 1} up at {addr}'",
    ])


def up(n: int, progress: vm.Progress = print) -> VmCluster:
    """Boot ``n`` guests joined by their own network; returns the cluster once every
    guest answers ssh."""
    if n != 2:
        raise MachineError("workers", f"{n}: a VM cluster here has 2 workers (one socket "
                           "netdev joins two guests)")
    if POINTER.exists():
        try:
            VmCluster.load()
            raise MachineError("vm cluster", "a VM cluster is already up; `fabriclab vm "
                               "cluster down` stops it")
        except MachineError as exc:
            if "already up" in exc.message:
                raise
    qemu.require_tools(build=False)
    image = vm.build(progress)
    state.require_root("fabriclab vm cluster", "it boots VMs and records their processes")
    run_id = f"vm-cluster-{int(time.time() * 1000)}-{os.getpid()}"
    record = state.RunRecord.new(run_id)
    top = vm.CACHE_DIR / "boots" / run_id
    record.paths.append(str(top))
    record.save()
    os.environ[state.RUN_ENV] = run_id
    top.mkdir(parents=True, exist_ok=True)
    key = top / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", run_id, "-f",
                    str(key)], check=True)
    text = cluster_model.dump(spec(n))
    link_port = _free_port()
    boots, members = [], []
    try:
        with state.signals_as_exit():
            for i in range(n):
                ssh_port = _free_port()
                side = "listen" if i == 0 else "connect"
                user_mac, net_mac = _USER_MAC.format(i + 1), _NET_MAC.format(i + 1)
                extra = ("-netdev", f"user,id=u0,restrict=on,hostfwd=tcp:127.0.0.1:{ssh_port}"
                         "-:22", "-device", f"virtio-net-pci,netdev=u0,mac={user_mac}",
                         "-netdev", f"socket,id=c0,{side}=127.0.0.1:{link_port}",
                         "-device", f"virtio-net-pci,netdev=c0,mac={net_mac},"
                         f"host_mtu={NET_MTU}")
                boot = vm.Boot(image, record, mode="cluster", name=f"w{i + 1}", vcpus=VCPUS,
                               memory_mb=MEMORY_MB, extra_args=extra)
                boot.prepare(_job(i, text), {})
                for f in (key, key.with_suffix(".pub")):
                    (boot.share / f.name).write_bytes(f.read_bytes())
                boot.start()
                boots.append(boot)
                members.append(Member(f"w{i + 1}", f"{NET_PREFIX}{i + 1}", ssh_port,
                                      str(boot.dir)))
                if i == 0:
                    time.sleep(1.0)            # the listening side first
            progress(f"vm cluster: booting {n} guests ({boots[0].accel}, {VCPUS} vCPU and "
                     f"{MEMORY_MB} MiB each)")
            t = time.monotonic()
            for boot in boots:
                _wait_job(boot)
            for m in members:
                _wait_ssh(m, key, top / "known_hosts")
            progress(f"vm cluster: guests ready in {time.monotonic() - t:.0f} s")
    except BaseException:
        state.remove(record)
        os.environ.pop(state.RUN_ENV, None)
        raise
    os.environ.pop(state.RUN_ENV, None)
    cluster = VmCluster(run_id, str(top), members)
    (top / "cluster.yaml").write_text(text)
    # From now on the first guest's QEMU owns the record: `clean` leaves a live cluster be.
    assert boots[0].proc is not None
    record.owner_pid = boots[0].proc.pid
    record.owner_start = state.proc_start_time(boots[0].proc.pid)
    record.save()
    cluster.save()
    return cluster


def _wait_job(boot: vm.Boot) -> None:
    """Until the guest's job has finished; its failure carries the job's log."""
    boot.wait_started(vm.BOOT_TIMEOUT_S)
    deadline = time.monotonic() + vm.BOOT_TIMEOUT_S
    rc_file = boot.share / "rc"
    assert boot.proc is not None
    while not rc_file.exists():
        if boot.proc.poll() is not None or time.monotonic() > deadline:
            raise vm.VmBootError("a cluster guest stopped or hung in its set-up",
                                 boot.console_tail())
        time.sleep(0.5)
    if rc_file.read_text().strip() != "0":
        log = (boot.share / "job.log").read_text(errors="replace").splitlines()[-15:]
        raise vm.VmBootError("a cluster guest's set-up failed", log)


def _wait_ssh(member: Member, key: Path, known: Path) -> None:
    """Until the guest's sshd answers a login. The job ends when sshd's unit has started,
    not when it listens: until then QEMU's port forward accepts and drops the connection
    (ssh's 'kex_exchange_identification: Connection reset'), so a caller's first command
    would fail."""
    deadline = time.monotonic() + vm.BOOT_TIMEOUT_S
    while True:
        try:
            out = subprocess.run(member.ssh(key, known, "true"), capture_output=True,
                                 text=True, timeout=60, check=False)
            if out.returncode == 0:
                return
            why = out.stderr.splitlines()[-5:]
        except subprocess.TimeoutExpired:
            why = ["ssh: no answer in 60 s"]
        if time.monotonic() > deadline:
            raise vm.VmBootError(f"guest {member.name} does not answer ssh", why)
        time.sleep(1.0)


def down() -> dict[str, int]:
    """Stop every guest (by PID) and remove their folders and the record."""
    cluster = VmCluster.load()
    record = state.RunRecord.load(state.records_dir() / f"{cluster.run_id}.json")
    left = state.remove(record)
    POINTER.unlink(missing_ok=True)
    return left


def exec_line(args: list[str]) -> str:
    """A command given as words, as one shell line for the guest."""
    return " ".join(shlex.quote(a) for a in args)
