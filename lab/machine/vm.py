"""``fabriclab vm``: a full-kernel Debian 12 VM on this machine, without VirtualBox or Vagrant.

Most users run the lab on a full kernel (the Vagrant box, any ordinary Linux): OVS's kernel
datapath, netem, RED, DCTCP. A machine whose kernel lacks them (CI's) can still test those
paths in a VM it boots itself with QEMU. This module is that lane:

* **build** — Debian's packages of the Vagrant box's release, installed natively by
  ``mmdebstrap`` (dpkg in a VM under software emulation is 10x slower), into an ext4 image
  made by ``mkfs.ext4 -d``. Then one boot runs the Vagrantfile's own provisioner
  (``lab/provision.sh``), so the script users get is the one tested. pip in a fresh guest
  cannot reach the package registry, so the Python packages come from a wheelhouse built on
  the host with the host's pip and the same pins. The image is cached under a key made of
  every input (package lists, ``setup.py``, the provisioner and set-up scripts, this
  recipe), and rebuilt only when one changes.
* **boot** — KVM where a probe shows it works, else TCG (no nested virtualisation here).
  A run's guest gets no network device (its traffic stays inside it; nothing listens on
  the host) but, with ``--live``, one that forwards the live view's port from the host's
  loopback (``lab.machine.vmnet``); two virtio-9p shares (``job``: the checkout, the job,
  its log and exit status; ``out``: results) and a serial console written to a file. Every
  boot writes to a throwaway qcow2 overlay, so runs never change the cached image.
* **record** — the boot's folder and QEMU's PID go into a run record before QEMU starts,
  and QEMU carries the run's marker, so ``fabriclab clean`` after a ``kill -9`` leaves no
  QEMU and no temp image.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from lab.machine import environment, hlsjs, qemu, state, vmnet
from lab.model.errors import MachineError

REPO = environment.REPO_ROOT
CACHE_DIR = Path(os.environ.get("FABRICLAB_VM_CACHE", "/var/cache/fabriclab/vm"))
#: The Vagrant box's release (debian/bookworm64): the VM lane tests what `vagrant up` gives.
SUITE = "bookworm"
MIRROR = os.environ.get("FABRICLAB_VM_MIRROR", "http://deb.debian.org/debian")
SECURITY_MIRROR = os.environ.get("FABRICLAB_VM_SECURITY_MIRROR",
                                 "http://deb.debian.org/debian-security")
#: What a bootable guest needs beyond the lab's own packages (lab/packages.txt).
BASE_PACKAGES = ("linux-image-amd64", "initramfs-tools", "systemd-sysv", "udev", "kmod",
                 "make", "tar", "sudo", "openssh-server", "openssh-client", "rsync",
                 # real RoCE to check the lab's transport against: Soft-RoCE (rdma_rxe,
                 # in the guest's kernel only), its verbs provider, perftest's ib_write_bw
                 "rdma-core", "ibverbs-providers", "perftest")
#: Kernel modules loaded at boot: the 9p shares, and the full-kernel paths the lab probes.
GUEST_MODULES = ("9p", "9pnet_virtio", "openvswitch", "sch_netem", "sch_red", "tcp_dctcp",
                 "ip_gre")
#: Files whose content decides the image: a change to any rebuilds it.
IMAGE_INPUTS = ("lab/packages.txt", "setup.py", "lab/provision.sh", "lab/setup.sh",
                "lab/vm_guest.sh", "lab/machine/hlsjs.py")
#: Bumped when the way an image is made changes in a way ``recipe()`` does not show.
RECIPE_VERSION = 4
GUEST_REPO = "/fabriclab"
GUEST_WHEELS = "/opt/fabriclab/wheels"
#: hls.js's tarball at its npm registry path (``lab/machine/hlsjs.py mirror``).
GUEST_NPM = "/opt/fabriclab/npm"
#: The guest cannot reach a registry: its pip takes packages from the wheelhouse only, and
#: set-up fetches hls.js from the image's mirror, through the same integrity check.
GUEST_PACKAGE_ENV = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": GUEST_WHEELS,
                     "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                     "NPM_CONFIG_REGISTRY": f"file://{GUEST_NPM}"}
VCPUS = 2                  # as the Vagrantfile's providers
MEMORY_MB = 4096
#: Free space the image keeps beyond what the packages take: the venvs, logs, a run's work.
IMAGE_HEADROOM_BYTES = 3 * 1024**3
#: Seconds a guest may take from QEMU's start to running its job (TCG: ~30 s seen here).
BOOT_TIMEOUT_S = float(os.environ.get("FABRICLAB_VM_BOOT_TIMEOUT", "300"))
CONSOLE_TAIL_LINES = 15

Progress = Callable[[str], None]


class VmBootError(MachineError):
    """The guest did not boot (or stopped) in time; carries the console's last lines."""

    def __init__(self, message: str, console_tail: list[str]) -> None:
        super().__init__("vm", message + ("" if console_tail else
                                          "; its console printed nothing"))
        self.console_tail = console_tail


# --- the image -------------------------------------------------------------------------------

def apt_packages() -> list[str]:
    """lab/packages.txt: the one list both set-up and the image use."""
    names = []
    for line in (REPO / "lab" / "packages.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def setup_sh_array(name: str) -> list[str]:
    """A bash array from lab/setup.sh (the Ryu pins live there, once)."""
    text = (REPO / "lab" / "setup.sh").read_text()
    m = re.search(rf"^{name}=\((.*)\)$", text, re.M)
    if not m:
        raise MachineError("vm", f"lab/setup.sh has no {name}=(...) line")
    return shlex.split(m.group(1))


def recipe() -> dict[str, object]:
    return {"suite": SUITE, "mirror": MIRROR, "security": SECURITY_MIRROR,
            "packages": [*BASE_PACKAGES, *apt_packages()], "modules": list(GUEST_MODULES),
            "python": platform.python_version(), "version": RECIPE_VERSION,
            "units": [_JOB_UNIT, _AUTOLOGIN]}


def image_key() -> str:
    """A hash of every input of the image: equal keys, equal images."""
    h = hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode())
    for rel in IMAGE_INPUTS:
        h.update(rel.encode() + b"\0" + (REPO / rel).read_bytes() + b"\0")
    return h.hexdigest()[:16]


@dataclass
class Image:
    """A built, provisioned image: its kernel, initrd and disk, and how it was made."""

    path: Path

    @property
    def kernel(self) -> Path:
        return self.path / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.path / "initrd.img"

    @property
    def disk(self) -> Path:
        return self.path / "disk.raw"

    @property
    def manifest(self) -> dict[str, object]:
        return json.loads((self.path / "manifest.json").read_text())


def cached_image() -> Image | None:
    img = Image(CACHE_DIR / image_key())
    return img if (img.path / "manifest.json").is_file() else None


def _run(cmd: list[str], what: str, **kw: object) -> subprocess.CompletedProcess:
    """Run a build step; on failure one line with the step and the tool's last words."""
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if r.returncode != 0:
        lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
        raise MachineError("vm build", f"{what} failed: {lines[-1] if lines else r.returncode}")
    return r


def _wheelhouse(dest: Path) -> None:
    """Every Python package the provisioner installs, as wheels for the guest's Python.

    Built with the lab's own venv (Debian's Python 3.11, as in the guest) and the Ryu venv
    (whose old setuptools builds Ryu 4.34), from the same requirements and pins set-up uses.
    """
    dest.mkdir(parents=True)
    pip = Path(sys.prefix) / "bin" / "pip"
    _run([str(pip), "wheel", "-q", "--disable-pip-version-check", "-w", str(dest),
          f"{REPO}[dev]", "setuptools", "wheel"], "pip wheel (the lab's packages)")
    for own in dest.glob("fabriclab-*.whl"):      # the guest installs the checkout itself
        own.unlink()
    ryu_py = environment.ryu_python()
    if not Path(ryu_py).exists():
        raise MachineError("vm build", "the Ryu venv is missing (run: make setup)")
    _run([ryu_py, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "-w", str(dest),
          *setup_sh_array("RYU_BUILD_DEPS")], "pip wheel (Ryu's build dependencies)")
    _run([ryu_py, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
          "--no-build-isolation", "-w", str(dest), *setup_sh_array("RYU_PKGS")],
         "pip wheel (Ryu 4.34)")


_JOB_UNIT = """[Unit]
Description=FabricLab VM job (fabriclab vm run/exec/shell)
ConditionKernelCommandLine=fabriclab.job
After=local-fs.target systemd-modules-load.service openvswitch-switch.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/fabriclab-vm-job
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
"""

_AUTOLOGIN = """[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --keep-baud 115200,38400,9600 %I $TERM
"""


def _stage_hook(tmp: Path) -> str:
    """mmdebstrap hook: the wheelhouse, hls.js's mirror and the checkout into the image."""
    return (f'mkdir -p "$1{GUEST_WHEELS}" "$1{GUEST_NPM}" "$1{GUEST_REPO}" && '
            f'cp -a {shlex.quote(str(tmp / "wheels"))}/. "$1{GUEST_WHEELS}/" && '
            f'cp -a {shlex.quote(str(tmp / "npm"))}/. "$1{GUEST_NPM}/" && '
            f'tar -xf {shlex.quote(str(tmp / "checkout.tar"))} -C "$1{GUEST_REPO}"')


def _python_hook() -> str:
    """mmdebstrap hook: the provisioner's Python step, natively in the image's tree.

    Installing the venvs under TCG took 10 minutes of the first boot; natively it takes
    about one. Only set-up's Python step runs here (``FABRICLAB_SETUP_ONLY=python``): the
    machine-wide steps would reach the host's kernel and Open vSwitch from a chroot. The
    whole provisioner then runs in the booted guest and finds the environments in place.
    """
    env = " ".join(f"{k}={v}" for k, v in GUEST_PACKAGE_ENV.items())
    return (f'chroot "$1" env {env} PIP_NO_CACHE_DIR=1 FABRICLAB_SETUP_ONLY=python '
            f'bash {GUEST_REPO}/lab/provision.sh {GUEST_REPO}')


def _customise(root: Path) -> None:
    """Make the package tree a bootable guest that runs the lab's job at boot."""
    (root / "etc/fstab").write_text("/dev/vda / ext4 defaults,errors=remount-ro 0 1\n")
    (root / "etc/hostname").write_text("fabriclab-vm\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n127.0.1.1 fabriclab-vm\n")
    (root / "etc/modules-load.d/fabriclab.conf").write_text("\n".join(GUEST_MODULES) + "\n")
    getty = root / "etc/systemd/system/serial-getty@ttyS0.service.d"
    getty.mkdir(parents=True, exist_ok=True)
    (getty / "autologin.conf").write_text(_AUTOLOGIN)
    job = root / "usr/local/sbin/fabriclab-vm-job"
    shutil.copy(REPO / "lab" / "vm_guest.sh", job)
    job.chmod(0o755)
    (root / "etc/systemd/system/fabriclab-job.service").write_text(_JOB_UNIT)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "fabriclab-job.service").unlink(missing_ok=True)
    (wants / "fabriclab-job.service").symlink_to("/etc/systemd/system/fabriclab-job.service")
    (root / "etc/profile.d/fabriclab-vm.sh").write_text(
        "".join(f"export {k}={v}\n" for k, v in GUEST_PACKAGE_ENV.items()))
    # Timers that would wake up during a measurement, in a guest that never sees a network;
    # FRR runs only inside the lab's routers (set-up disables the service too).
    # sshd is started by a cluster member's job only, on the cluster's addresses
    # (``lab.machine.vmcluster``), not by every boot on every address.
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "man-db.timer",
                 "e2scrub_all.timer", "fstrim.timer", "frr.service", "ssh.service",
                 "ssh.socket"):
        link = root / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")


def _dir_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def build(progress: Progress = print, force: bool = False) -> Image:
    """The provisioned image for this checkout: from the cache, or built now."""
    qemu.require_tools(build=True)
    state.require_root("fabriclab vm", "it builds images and records its processes")
    key = image_key()
    final = CACHE_DIR / key
    if not force and cached_image() is not None:
        progress(f"vm image {key}: cached ({final})")
        return Image(final)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    run_id = f"vm-build-{int(time.time() * 1000)}-{os.getpid()}"
    tmp = CACHE_DIR / f"{key}.building-{os.getpid()}"
    record = state.RunRecord.new(run_id)
    record.paths.append(str(tmp))
    record.save()
    os.environ[state.RUN_ENV] = run_id
    timings: dict[str, float] = {}
    try:
        with state.signals_as_exit():
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            t = time.monotonic()
            progress("vm build: wheelhouse of the lab's Python packages (host pip)")
            _wheelhouse(tmp / "wheels")
            hls = hlsjs.mirror_or_why(tmp / "npm")
            checkout_tar(tmp / "checkout.tar")
            timings["wheelhouse_s"] = round(time.monotonic() - t, 1)
            t = time.monotonic()
            root = tmp / "root"
            progress(f"vm build: Debian {SUITE} with the lab's packages and Python "
                     f"environments (mmdebstrap, {MIRROR})")
            _run(["mmdebstrap", "--variant=important", "--include=" + ",".join(
                [*BASE_PACKAGES, *apt_packages()]),
                "--customize-hook=" + _stage_hook(tmp),
                "--customize-hook=" + _python_hook(),
                SUITE, str(root),
                f"deb {MIRROR} {SUITE} main", f"deb {MIRROR} {SUITE}-updates main",
                f"deb {SECURITY_MIRROR} {SUITE}-security main"],
                f"mmdebstrap from {MIRROR}")
            timings["packages_s"] = round(time.monotonic() - t, 1)
            _customise(root)
            shutil.rmtree(tmp / "wheels")
            kernels = sorted((root / "boot").glob("vmlinuz-*"))
            initrds = sorted((root / "boot").glob("initrd.img-*"))
            if not kernels or not initrds:
                raise MachineError("vm build", "the image has no kernel or initrd in /boot")
            shutil.copy(kernels[-1], tmp / "vmlinuz")
            shutil.copy(initrds[-1], tmp / "initrd.img")
            t = time.monotonic()
            size = _dir_bytes(root) + IMAGE_HEADROOM_BYTES
            _run(["mkfs.ext4", "-q", "-F", "-L", "fabriclab", "-d", str(root),
                  str(tmp / "disk.raw"), f"{size // 1024}k"], "mkfs.ext4")
            shutil.rmtree(root)
            timings["disk_s"] = round(time.monotonic() - t, 1)
            t = time.monotonic()
            progress("vm build: first boot runs the provisioner (lab/provision.sh)")
            img = Image(tmp)
            rc = Boot(img, record, mode="run", writable_base=True).run_job(
                f"bash {GUEST_REPO}/lab/provision.sh {GUEST_REPO}", progress)
            if rc != 0:
                raise MachineError("vm build", f"the provisioner exited {rc} in the guest")
            timings["provision_s"] = round(time.monotonic() - t, 1)
            (tmp / "manifest.json").write_text(json.dumps({
                "key": key, "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "recipe": recipe(), "timings": timings, "hlsjs": hls,
                "kernel": kernels[-1].name.removeprefix("vmlinuz-"),
                "disk_bytes": _dir_bytes(tmp / "disk.raw")}, indent=1))
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        record.path.unlink(missing_ok=True)
        os.environ.pop(state.RUN_ENV, None)
    for old in CACHE_DIR.iterdir():        # one image at a time: each is a few GB
        if old.is_dir() and old.name != key and old.name != "boots" \
                and ".building-" not in old.name:
            shutil.rmtree(old, ignore_errors=True)
    progress(f"vm image {key}: built in {sum(timings.values()):.0f} s {timings} ({final})")
    return Image(final)


# --- one boot --------------------------------------------------------------------------------

def checkout_tar(dest: Path) -> None:
    """The current checkout as the user has it (tracked and untracked, not ignored files)."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-co",
                              "--exclude-standard"], capture_output=True, check=False)
    except OSError:                     # no git here (a worker's copied checkout)
        out = subprocess.CompletedProcess([], 1, b"", b"")
    if out.returncode == 0:
        names = [n for n in out.stdout.decode().split("\0") if n]
    else:                               # not a git checkout: everything but venvs and output
        skip = {".git", ".venv", ".venv-ryu", "results", "__pycache__"}
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(REPO).parts)]
    with tarfile.open(dest, "w") as tar:
        for name in names:
            if (REPO / name).is_file():
                tar.add(REPO / name, arcname=name, recursive=False)


class Boot:
    """One QEMU boot of an image, recorded, with a throwaway overlay unless told otherwise."""

    def __init__(self, image: Image, record: state.RunRecord, mode: str = "run",
                 out_dir: Path | None = None, writable_base: bool = False,
                 name: str = "", vcpus: int = VCPUS, memory_mb: int = MEMORY_MB,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.image = image
        self.record = record
        self.mode = mode
        #: A guest of several under one record (a cluster's members) has its own folder.
        self.dir = CACHE_DIR / "boots" / record.run_id / name if name else \
            CACHE_DIR / "boots" / record.run_id
        self.vcpus = vcpus
        self.memory_mb = memory_mb
        #: More QEMU arguments: a cluster member's network devices, or a device
        #: forwarding one port (``lab.machine.vmnet``).
        self.extra_args = extra_args
        self.share = self.dir / "job"
        self.out_dir = out_dir
        self.writable_base = writable_base
        self.proc: subprocess.Popen | None = None
        self.accel = "tcg"

    @property
    def console(self) -> Path:
        return self.dir / "console.log"

    def console_tail(self) -> list[str]:
        try:
            text = self.console.read_text(errors="replace")
        except OSError:
            return []
        return [ln.rstrip("\r") for ln in text.splitlines()[-CONSOLE_TAIL_LINES:]]

    def facts(self) -> dict[str, object]:
        """What a result made in this guest records as ``environment.vm``."""
        return {"accelerator": self.accel, "vcpus": self.vcpus, "memory_mb": self.memory_mb,
                "qemu": qemu.qemu_version(), "image": self.image.path.name}

    def prepare(self, job: str, env: dict[str, str]) -> None:
        self.record.paths.append(str(self.dir))
        self.record.save()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.share.mkdir(parents=True)
        checkout_tar(self.share / "checkout.tar")
        (self.share / "job.sh").write_text("set -e\n" + job + "\n")
        self.accel = qemu.accelerator(self.image.kernel)
        env = {**GUEST_PACKAGE_ENV, environment.VM_ENV: json.dumps(self.facts()), **env}
        (self.share / "env").write_text("".join(f"{k}={shlex.quote(v)}\n"
                                                for k, v in env.items()))

    def command(self) -> list[str]:
        if self.writable_base:
            disk = f"file={self.image.disk},if=virtio,format=raw"
        else:
            overlay = self.dir / "overlay.qcow2"
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                            str(self.image.disk), str(overlay)], check=True)
            disk = f"file={overlay},if=virtio,format=qcow2"
        accel = ["-accel", "kvm", "-cpu", "host"] if self.accel == "kvm" else \
            ["-accel", "tcg,thread=multi", "-cpu", "max"]
        cmd = ["qemu-system-x86_64", "-name", f"fabriclab-{self.record.run_id}", *accel,
               "-smp", str(self.vcpus), "-m", str(self.memory_mb),
               "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
               "-append", f"console=ttyS0,115200 root=/dev/vda rw panic=-1 loglevel=4 "
                          f"fabriclab.job={self.mode}",
               "-drive", disk, "-nic", "none", "-display", "none", "-no-reboot",
               "-virtfs", f"local,path={self.share},mount_tag=job,security_model=none,id=job"]
        if self.out_dir is not None:
            cmd += ["-virtfs", f"local,path={self.out_dir},mount_tag=out,"
                               f"security_model=none,id=out"]
        cmd += list(self.extra_args)
        if self.mode == "shell":
            cmd += ["-serial", "mon:stdio"]
        else:
            cmd += ["-serial", f"file:{self.console}", "-monitor", "none"]
        return cmd

    def start(self) -> None:
        cmd = self.command()
        # stdin/stdout stay the user's only for an interactive shell.
        quiet = self.mode != "shell"
        # A cluster member outlives the command that booted it (and its terminal).
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL if quiet else None,
            stdout=subprocess.DEVNULL if quiet else None,
            stderr=open(self.dir / "qemu.err", "wb") if quiet else None,  # noqa: SIM115
            start_new_session=self.mode == "cluster")
        self.record.add_pid(self.proc.pid, "qemu")

    def stop(self) -> None:
        """QEMU gone (by PID), the boot's folder gone, the record's entries gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def wait_started(self, timeout_s: float) -> None:
        """Until the guest's job has begun (its log exists); else the console's last lines."""
        deadline = time.monotonic() + timeout_s
        log = self.share / "job.log"
        assert self.proc is not None
        while not log.exists():
            if self.proc.poll() is not None:
                raise VmBootError(f"the guest stopped before its job began (QEMU exit "
                                  f"{self.proc.returncode}{self._qemu_err()})",
                                  self.console_tail())
            if time.monotonic() > deadline:
                raise VmBootError(f"the guest did not boot within {timeout_s:.0f} s "
                                  f"({self.accel})", self.console_tail())
            time.sleep(0.25)

    def _qemu_err(self) -> str:
        try:
            err = (self.dir / "qemu.err").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f": {err[-1]}" if err else ""

    def stream(self, sink: Callable[[str], None]) -> int:
        """Copy the job's log to ``sink`` as it grows; the job's exit status at the end."""
        assert self.proc is not None
        pos = 0
        log = self.share / "job.log"
        while True:
            done = self.proc.poll() is not None
            with open(log, "rb") as f:
                f.seek(pos)
                chunk = f.read()
            if chunk:
                pos += len(chunk)
                sink(chunk.decode(errors="replace"))
            if done:
                break
            time.sleep(0.2)
        rc_file = self.share / "rc"
        if not rc_file.exists():
            raise VmBootError("the guest stopped before its job finished", self.console_tail())
        return int(rc_file.read_text().strip() or 1)

    def run_job(self, job: str, progress: Progress, env: dict[str, str] | None = None,
                sink: Callable[[str], None] | None = None) -> int:
        """Boot, run ``job`` (shell) in the checkout, power off; its exit status."""
        self.prepare(job, env or {})
        try:
            self.start()
            progress(f"vm: booting ({self.accel}, {self.vcpus} vCPUs, {self.memory_mb} MiB)")
            t = time.monotonic()
            self.wait_started(BOOT_TIMEOUT_S)
            progress(f"vm: guest ready in {time.monotonic() - t:.1f} s")
            return self.stream(sink or _write_out)
        finally:
            self.stop()


def _write_out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@contextlib.contextmanager
def recorded(label: str) -> Iterator[state.RunRecord]:
    """A run record (and the run's marker) for one VM boot; gone on any normal exit."""
    state.require_root("fabriclab vm", "it builds images and records its processes")
    run_id = f"vm-{label}-{int(time.time() * 1000)}-{os.getpid()}"
    record = state.RunRecord.new(run_id)
    os.environ[state.RUN_ENV] = run_id     # QEMU inherits it: `clean` finds it by it too
    try:
        with state.signals_as_exit():
            yield record
    finally:
        record.path.unlink(missing_ok=True)
        os.environ.pop(state.RUN_ENV, None)


#: Runs in the guest before every job: the set-up entry point again (idempotent: it starts
#: Open vSwitch on the kernel datapath and allows the congestion controls), quietly unless
#: it fails.
SETUP_STEP = ("bash lab/setup.sh > /tmp/fabriclab-setup.log 2>&1 || "
          "{ cat /tmp/fabriclab-setup.log; exit 3; }")


def execute(job: str, out_dir: Path | None, progress: Progress = print,
            sink: Callable[[str], None] | None = None,
            forward: tuple[int, int] | None = None) -> int:
    """Build or reuse the image, boot it, run ``job`` after set-up; the job's exit status.

    ``forward`` (host port, guest port): this machine's 127.0.0.1:host reaches the guest's
    127.0.0.1:guest while the job runs (``lab.machine.vmnet``); without it the guest has no
    network device at all.
    """
    qemu.require_tools(build=False)
    image = build(progress)
    steps = [SETUP_STEP]
    extra: tuple[str, ...] = ()
    if forward is not None:
        extra = vmnet.qemu_args(*forward)
        steps.append(vmnet.guest_step(forward[1]))
    with recorded("run") as record:
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
        boot = Boot(image, record, mode="run", out_dir=out_dir, extra_args=extra)
        return boot.run_job("\n".join([*steps, job]), progress, sink=sink)


def shell(out_dir: Path) -> int:
    """An interactive root shell on the guest's serial console (for a class)."""
    qemu.require_tools(build=False)
    image = build()
    with recorded("shell") as record:
        out_dir.mkdir(parents=True, exist_ok=True)
        boot = Boot(image, record, mode="shell", out_dir=out_dir)
        boot.prepare(SETUP_STEP, {})
        try:
            print("fabriclab vm shell: Ctrl-A X quits QEMU; 'poweroff' in the guest leaves",
                  flush=True)
            boot.start()
            assert boot.proc is not None
            return boot.proc.wait()
        finally:
            boot.stop()
