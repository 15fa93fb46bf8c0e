"""A Vagrant box for libvirt made from the VM lane's image, for ``vagrant up`` offline.

A user with internet gets the Vagrantfile's public box (debian/bookworm64). A machine without
it (and the test that runs the README's Vagrant lines) has no box at all, yet it has the VM
lane's image (``lab.machine.vm``): Debian 12, the lab's packages, the Python environments and
the wheelhouse they came from. This module turns that image into a libvirt box and adds it
under the Vagrantfile's box name:

* **build** — a copy of the image's disk, changed the way every Vagrant box is: the
  ``vagrant`` user with Vagrant's insecure key and password-less sudo, sshd on (the lane masks
  it), DHCP on the first NIC (``eth0``: the box boots with ``net.ifnames=0``), fresh ssh host
  keys and machine id. pip is pointed at the image's wheelhouse (``/etc/pip.conf``), so the
  Vagrantfile's provisioner installs the checkout at ``/vagrant`` offline; the lane's copy of
  the checkout, its job runner and its root autologin are removed. The image has no boot
  loader, so the box ships the kernel and initrd and its own Vagrantfile points libvirt's
  direct kernel boot at them (vagrant-libvirt's box format v1: ``metadata.json``,
  ``Vagrantfile``, ``box.img``). Cached per image key under ``/var/cache/fabriclab/vagrant``.
* **add** — ``vagrant box add`` under the Vagrantfile's box name (version 0, provider
  libvirt); skipped when the box added is already this one. A public box of the same name
  has a real version, so Vagrant prefers it wherever it is present.
* **daemons** — libvirt's ``virtlogd`` and ``libvirtd`` on a machine without systemd:
  started if not running, with their PIDs recorded, and stopped by those PIDs only.

Run as ``python -m lab.machine.vagrantbox build|add|daemons|daemons-stop`` (``make
vagrant-box`` runs ``add``).
"""

from __future__ import annotations

import contextlib
import glob
import grp
import json
import math
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from lab.machine import state, vm
from lab.model.errors import MachineError

BOX_DIR = Path(os.environ.get("FABRICLAB_VAGRANT_CACHE", "/var/cache/fabriclab/vagrant"))
#: Bumped when the way a box is made from the image changes.
BOX_VERSION = 1
#: The kernel command line of the box: the lane's, plus the classic interface names, so the
#: first NIC is ``eth0`` as in Debian's own Vagrant boxes.
CMD_LINE = "root=/dev/vda rw console=ttyS0,115200 net.ifnames=0 biosdevname=0"
#: Where Vagrant's own insecure public key lies (Debian's package; HashiCorp's).
INSECURE_KEYS = ("/usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub",
                 "/opt/vagrant/embedded/gems/gems/vagrant-*/keys/vagrant.pub",
                 "/opt/vagrant/embedded/gems/*/gems/vagrant-*/keys/vagrant.pub")
#: Where the daemons this module started are written down, so only they are stopped.
DAEMONS_FILE = state.STATE_DIR / "libvirt-daemons.json"

Progress = Callable[[str], None]

_BOX_VAGRANTFILE = f"""\
# A FabricLab box made from the VM lane's image (python -m lab.machine.vagrantbox build).
# The image has no boot loader: libvirt boots the kernel and initrd shipped in this box.
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |lv|
    lv.kernel = File.expand_path("../vmlinuz", __FILE__)
    lv.initrd = File.expand_path("../initrd.img", __FILE__)
    lv.cmd_line = "{CMD_LINE}"
  end
end
"""

_INTERFACES = """\
# The box's network: DHCP on the first NIC (Vagrant's management network).
source /etc/network/interfaces.d/*

auto lo
iface lo inet loopback

allow-hotplug eth0
iface eth0 inet dhcp
"""

_PIP_CONF = f"""\
# Python packages come from the wheelhouse the image was built with: the provisioner
# installs the checkout at /vagrant without reaching a package registry.
[global]
no-index = true
find-links = {vm.GUEST_WHEELS}
disable-pip-version-check = true
"""


def box_name() -> str:
    """The Vagrantfile's ``config.vm.box``: the box is added under it."""
    text = (vm.REPO / "Vagrantfile").read_text()
    m = re.search(r'^\s*config\.vm\.box\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        raise MachineError("vagrant box", "the Vagrantfile sets no config.vm.box")
    return m.group(1)


def box_key(image: vm.Image) -> str:
    """The image the box comes from and the way it was made: equal keys, equal boxes."""
    return f"{image.path.name}-{BOX_VERSION}"


def box_file(image: vm.Image) -> Path:
    return BOX_DIR / f"fabriclab-{box_key(image)}.box"


def insecure_public_key() -> str:
    """Vagrant's insecure public key, from the Vagrant installed here (it logs in with its
    private half the first time, then puts a key of its own in place)."""
    for pattern in INSECURE_KEYS:
        for path in sorted(glob.glob(pattern)):
            return Path(path).read_text().strip()
    raise MachineError("vagrant box", "Vagrant's insecure key (keys/vagrant.pub) not found: "
                       "is vagrant installed? (make vagrant-setup)")


def _run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
        raise MachineError("vagrant box", f"{what} failed: {lines[-1] if lines else r.returncode}")
    return r


def customise(root: Path, public_key: str) -> None:
    """Make the lane's guest tree a Vagrant box's (see the module's docstring)."""
    etc = root / "etc"
    # Vagrant's user: its insecure key, sudo without a password (Vagrant's box conventions).
    if "\nvagrant:" not in "\n" + (etc / "passwd").read_text():
        _run(["chroot", str(root), "useradd", "-m", "-s", "/bin/bash", "-U", "vagrant"],
             "useradd vagrant")
    _run(["chroot", str(root), "sh", "-c", "echo vagrant:vagrant | chpasswd"],
         "the vagrant user's password")
    (etc / "sudoers.d/vagrant").write_text("vagrant ALL=(ALL) NOPASSWD: ALL\n")
    (etc / "sudoers.d/vagrant").chmod(0o440)
    ssh = root / "home/vagrant/.ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text(public_key + "\n")
    (ssh / "authorized_keys").chmod(0o600)
    _run(["chroot", str(root), "chown", "-R", "vagrant:vagrant", "/home/vagrant/.ssh"],
         "chown ~vagrant/.ssh")
    # sshd on (the lane masks it: its guests are reached over 9p), without reverse DNS
    # lookups that stall a login on a network with no DNS; host keys of this box's own.
    for unit in ("ssh.service", "ssh.socket"):
        (etc / "systemd/system" / unit).unlink(missing_ok=True)
    (etc / "ssh/sshd_config.d/vagrant.conf").write_text("UseDNS no\n")
    for key in (etc / "ssh").glob("ssh_host_*"):
        key.unlink()
    _run(["chroot", str(root), "ssh-keygen", "-A"], "ssh-keygen -A")
    # DHCP on the first NIC; an empty machine id, made at first boot, so no two boxes share
    # one (nor a DHCP client id derived from it).
    (etc / "network/interfaces").write_text(_INTERFACES)
    (etc / "machine-id").write_text("")
    (etc / "hostname").write_text("fabriclab\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n127.0.1.1 fabriclab\n")
    # pip offline from the wheelhouse; the venv reinstalls the checkout from /vagrant at the
    # first provisioning (set-up reinstalls when its stamp is gone), not from the lane's copy.
    (etc / "pip.conf").write_text(_PIP_CONF)
    (root / "etc/profile.d/fabriclab-vm.sh").unlink(missing_ok=True)
    # The lane's copy of the checkout goes, and its editable install with it (as pip would
    # uninstall it), so no run in the box can import a stale copy.
    venv = root / "opt/fabriclab/venv"
    (venv / ".fabriclab-deps").unlink(missing_ok=True)
    for site in venv.glob("lib/python3*/site-packages"):
        (site / "fabriclab.egg-link").unlink(missing_ok=True)
        pth = site / "easy-install.pth"
        if pth.is_file():
            pth.write_text("".join(ln for ln in pth.read_text().splitlines(keepends=True)
                                   if ln.strip() != vm.GUEST_REPO))
    shutil.rmtree(root / vm.GUEST_REPO.lstrip("/"), ignore_errors=True)
    # The lane's job runner and root autologin on the serial console have no place in a box.
    for path in ("etc/systemd/system/multi-user.target.wants/fabriclab-job.service",
                 "etc/systemd/system/fabriclab-job.service",
                 "usr/local/sbin/fabriclab-vm-job",
                 "etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf"):
        (root / path).unlink(missing_ok=True)


@contextlib.contextmanager
def _mounted(disk: Path, where: Path) -> Iterator[Path]:
    """The ext4 disk image loop-mounted read-write at ``where``, unmounted on every exit."""
    where.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-o", "loop", str(disk), str(where)], f"mount -o loop {disk}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def build(progress: Progress = print) -> Path:
    """The box file for the lane's image (built by ``fabriclab vm build`` if need be)."""
    state.require_root("python -m lab.machine.vagrantbox", "it loop-mounts the VM image")
    image = vm.build(progress)
    dest = box_file(image)
    if dest.is_file():
        progress(f"vagrant box {box_key(image)}: cached ({dest})")
        return dest
    for tool, pkg in (("qemu-img", "qemu-utils"), ("mount", "mount"), ("tar", "tar")):
        if not shutil.which(tool):
            raise MachineError("vagrant box", f"{tool} not found (apt-get install {pkg})")
    key = insecure_public_key()
    work = BOX_DIR / f"{box_key(image)}.building-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.monotonic()
    try:
        raw = work / "disk.raw"
        progress(f"vagrant box: copying the image's disk ({image.path})")
        _run(["cp", "--sparse=always", str(image.disk), str(raw)], "copying disk.raw")
        with _mounted(raw, work / "root") as root:
            customise(root, key)
        progress("vagrant box: disk to qcow2")
        _run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(work / "box.img")],
             "qemu-img convert")
        raw.unlink()
        (work / "root").rmdir()
        shutil.copy(image.kernel, work / "vmlinuz")
        shutil.copy(image.initrd, work / "initrd.img")
        size_gb = math.ceil(image.disk.stat().st_size / 1024**3)
        (work / "metadata.json").write_text(json.dumps(
            {"provider": "libvirt", "format": "qcow2", "virtual_size": size_gb,
             "fabriclab_box": box_key(image)}))
        (work / "Vagrantfile").write_text(_BOX_VAGRANTFILE)
        progress("vagrant box: packing")
        partial = dest.with_name(dest.name + ".partial")
        _run(["tar", "-cf", str(partial), "-C", str(work), "metadata.json", "Vagrantfile",
              "box.img", "vmlinuz", "initrd.img"], "tar")
        os.replace(partial, dest)
    finally:
        with contextlib.suppress(OSError):
            subprocess.run(["umount", str(work / "root")], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
    for old in BOX_DIR.glob("fabriclab-*.box"):   # one box at a time: each is a few GB
        if old != dest:
            old.unlink()
    progress(f"vagrant box {box_key(image)}: built in {time.monotonic() - t0:.0f} s ({dest})")
    return dest


def added_box_dir(name: str) -> Path:
    """Where ``vagrant box add`` puts version 0 of ``name`` for libvirt."""
    home = Path(os.environ.get("VAGRANT_HOME", Path.home() / ".vagrant.d"))
    return home / "boxes" / name.replace("/", "-VAGRANTSLASH-") / "0" / "libvirt"


def add(progress: Progress = print) -> str:
    """Build (or reuse) the box and add it under the Vagrantfile's box name; the name."""
    if not shutil.which("vagrant"):
        raise MachineError("vagrant box", "vagrant not found (make vagrant-setup)")
    path = build(progress)
    name = box_name()
    meta = added_box_dir(name) / "metadata.json"
    want = path.name.removeprefix("fabriclab-").removesuffix(".box")
    try:
        have = json.loads(meta.read_text()).get("fabriclab_box")
    except (OSError, ValueError):
        have = None
    if have == want:
        progress(f"vagrant box {name} (libvirt): {want} already added")
    else:
        t = time.monotonic()
        _run(["vagrant", "box", "add", "--force", "--name", name, str(path)],
             f"vagrant box add {name}")
        progress(f"vagrant box {name} (libvirt): {want} added in {time.monotonic() - t:.0f} s")
    for line in let_qemu_reach(added_box_dir(name) / "vmlinuz"):
        progress(line)
    return name


def qemu_user() -> str:
    """The user libvirt runs QEMU as (qemu.conf's ``user``, else Debian's default)."""
    try:
        text = Path("/etc/libvirt/qemu.conf").read_text()
    except OSError:
        text = ""
    m = re.search(r'^\s*user\s*=\s*"([^"]+)"', text, re.M)
    return m.group(1) if m else "libvirt-qemu"


def let_qemu_reach(path: Path) -> list[str]:
    """QEMU (not root under libvirt) opens the box's kernel and initrd itself: give its user
    search permission on each folder above them that denies it (a POSIX ACL entry, as
    virt-manager offers), and say which. Nothing else changes."""
    user = qemu_user()
    if user.startswith("+0") or user == "root":
        return []
    try:
        pwd.getpwnam(user)
    except KeyError:
        return []
    done = []
    for folder in reversed(path.parents):
        if subprocess.run(["runuser", "-u", user, "--", "test", "-x", str(folder)],
                          check=False).returncode == 0:
            continue
        if not shutil.which("setfacl"):
            raise MachineError("vagrant box", f"{user} (libvirt's QEMU) cannot reach {path}: "
                               f"install acl (make vagrant-setup) or move VAGRANT_HOME")
        _run(["setfacl", "-m", f"u:{user}:x", str(folder)], f"setfacl on {folder}")
        done.append(f"vagrant box: {user} (libvirt's QEMU) may now search {folder} "
                    f"(setfacl -m u:{user}:x)")
    return done


# --- libvirt's daemons on a machine without systemd -------------------------------------------

#: Each daemon, the pid file it writes when it runs as root, and how to start it.
DAEMONS = (("virtlogd", Path("/run/virtlogd.pid"), ["virtlogd", "-d"]),
           ("libvirtd", Path("/run/libvirtd.pid"), ["libvirtd", "-d"]))


def alive(pid: int, name: str) -> bool:
    """Whether ``pid`` is still ``name`` (a recycled PID is not)."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return comm == name[:15]


def _pid_from(pidfile: Path, name: str) -> int | None:
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive(pid, name) else None


KVM_DEV = Path("/dev/kvm")


def kvm_device_for_libvirt() -> dict[str, int] | None:
    """Give /dev/kvm the group and mode Debian's udev rule gives it (``kvm``, 0660) where
    no udev ran (it is the kernel's root-only 0600 then); the old owner and mode, to put
    back, or None when nothing changed.

    libvirt probes QEMU as root, finds KVM, then checks /dev/kvm as its QEMU user (in group
    ``kvm``), finds it closed, calls its probe outdated and probes again: 4 s on every
    libvirt call, 108 s of one ``vagrant up``. Domains here are of type ``qemu`` (TCG)
    either way; only the probe's answer becomes consistent.
    """
    try:
        st = KVM_DEV.stat()
        kvm_gid = grp.getgrnam("kvm").gr_gid
    except (OSError, KeyError):
        return None
    if st.st_gid == kvm_gid or st.st_mode & 0o060:
        return None
    os.chown(KVM_DEV, -1, kvm_gid)
    os.chmod(KVM_DEV, 0o660)
    return {"kvm_gid": st.st_gid, "kvm_mode": st.st_mode & 0o7777}


def start_daemons(timeout_s: float = 30) -> dict[str, int]:
    """virtlogd and libvirtd running; the PIDs of those started here (written down)."""
    started: dict[str, int] = {}
    kvm_before = kvm_device_for_libvirt() if _pid_from(DAEMONS[1][1], "libvirtd") is None \
        else None
    for name, pidfile, cmd in DAEMONS:
        if _pid_from(pidfile, name) is not None:
            continue
        if not shutil.which(cmd[0]):
            raise MachineError("libvirt", f"{cmd[0]} not found (make vagrant-setup)")
        _run(cmd, cmd[0])
        deadline = time.monotonic() + timeout_s
        while (pid := _pid_from(pidfile, name)) is None:
            if time.monotonic() > deadline:
                raise MachineError("libvirt", f"{name} wrote no PID to {pidfile}")
            time.sleep(0.2)
        started[name] = pid
    if started or kvm_before:
        DAEMONS_FILE.parent.mkdir(parents=True, exist_ok=True)
        DAEMONS_FILE.write_text(json.dumps({**_recorded(), **started, **(kvm_before or {})}))
    deadline = time.monotonic() + timeout_s
    while subprocess.run(["virsh", "-c", "qemu:///system", "version"], capture_output=True,
                         check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise MachineError("libvirt", "libvirtd does not answer virsh")
        time.sleep(0.5)
    return started


def _recorded() -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads(DAEMONS_FILE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def stop_daemons(timeout_s: float = 30) -> list[str]:
    """Stop the daemons this module started (by their recorded PIDs), libvirtd first."""
    stopped = []
    recorded = _recorded()
    for name in ("libvirtd", "virtlogd"):
        pid = recorded.get(name)
        if pid is None or not alive(pid, name):
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while alive(pid, name):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.2)
        stopped.append(f"{name} ({pid})")
    if "kvm_mode" in recorded:            # /dev/kvm as it was before start_daemons
        with contextlib.suppress(OSError):
            os.chown(KVM_DEV, -1, recorded["kvm_gid"])
            os.chmod(KVM_DEV, recorded["kvm_mode"])
    DAEMONS_FILE.unlink(missing_ok=True)
    return stopped


def main(argv: list[str]) -> int:
    what = argv[0] if argv else ""
    try:
        if what == "build":
            print(build())
        elif what == "add":
            add()
        elif what == "daemons":
            started = start_daemons()
            print("libvirt: " + (", ".join(f"{k} ({v})" for k, v in started.items())
                                 + " started" if started else "running"))
        elif what == "daemons-stop":
            print("libvirt: stopped " + (", ".join(stop_daemons()) or "nothing"))
        else:
            print("usage: python -m lab.machine.vagrantbox build|add|daemons|daemons-stop",
                  file=sys.stderr)
            return 2
    except MachineError as exc:
        print(f"vagrant box: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
