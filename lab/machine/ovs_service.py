"""Start Open vSwitch the way this kernel allows, and say which datapath the lab will use.

Standalone on purpose (standard library only): ``lab/setup.sh`` runs it with Debian's Python
before the lab's venv exists. Open vSwitch is shared machine infrastructure, like a system
service: the lab starts it when it is not running and never stops it, and it never touches
bridges it did not create.

Without the openvswitch kernel module the switches run in the userspace datapath
(``datapath_type=netdev``); that datapath needs ``userspace-tso-enable`` or TCP stalls.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
#: Send buffer ovs-vswitchd's shared AF_PACKET socket needs (see ``ensure_send_buffer``).
SEND_BUFFER_BYTES = 4 * 1024 * 1024
WMEM_DEFAULT = "/proc/sys/net/core/wmem_default"
RUN_DIR = "/var/run/openvswitch"
DB_SOCK = f"{RUN_DIR}/db.sock"


def run_ok(cmd: list[str], timeout: float = 5.0) -> bool:
    """True when ``cmd`` exits 0 within ``timeout`` (its output is discarded)."""
    try:
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def kernel_module_present() -> bool:
    """True when the openvswitch kernel datapath is built in, loaded or loadable."""
    if os.path.isdir("/sys/module/openvswitch"):
        return True
    if os.path.exists("/proc/modules") and run_ok(["modprobe", "-q", "openvswitch"]):
        return os.path.isdir("/sys/module/openvswitch")
    return False


def datapath() -> str:
    """``kernel`` where the module works, else ``user`` (userspace datapath with TSO)."""
    return "kernel" if kernel_module_present() else "user"


def db_running() -> bool:
    return run_ok(["ovs-vsctl", "--timeout=2", "show"])


def vswitchd_running() -> bool:
    return run_ok(["ovs-appctl", "--timeout=2", "-t", "ovs-vswitchd", "version"])


def running() -> bool:
    return db_running() and vswitchd_running()


def ensure() -> str:
    """Make ovsdb-server and ovs-vswitchd run; return the datapath the lab will use."""
    dp = datapath()
    if running():
        if dp == "user":
            _ensure_tso()
        return dp
    if not os.path.exists(OVS_CTL):
        raise SystemExit("Open vSwitch is not installed (run: make setup)")
    if dp == "kernel":
        subprocess.run([OVS_CTL, "--system-id=random", "start"], check=True)
    else:
        if not db_running():
            subprocess.run([OVS_CTL, "--no-ovs-vswitchd", "--system-id=random", "start"],
                           check=True)
        _ensure_tso()
        if not vswitchd_running():
            if ensure_send_buffer():
                print(f"[setup] net.core.wmem_default raised to {SEND_BUFFER_BYTES} so that "
                      "ovs-vswitchd's shared send socket drops no packet uncounted")
            subprocess.run(["ovs-vswitchd", f"unix:{DB_SOCK}", "--pidfile", "--detach",
                            "--log-file"], check=True)
    for _ in range(50):
        if running():
            return dp
        time.sleep(0.1)
    raise SystemExit("Open vSwitch did not come up (see /var/log/openvswitch/)")


def ensure_send_buffer() -> bool:
    """Make sockets created from now on get a send buffer of at least 4 MiB.

    On the userspace datapath ovs-vswitchd sends on every port through one AF_PACKET socket
    (created at its first send, with ``net.core.wmem_default`` as its buffer). Packets
    waiting in the ports' egress queues are charged to that buffer; when it is full a send
    fails and OVS drops the rest of the batch without counting it anywhere. Measured with
    the default 208 KiB: up to 1-2 % of a port's bytes vanished, even on idle ports next to a
    congested one; with 4 MiB every lost byte was a counted queue drop. This raises a
    machine-wide default, which is why only set-up does it, before starting vswitchd.
    Returns True when it changed the setting.
    """
    try:
        with open(WMEM_DEFAULT) as f:
            current = int(f.read())
    except (OSError, ValueError):
        return False
    if current >= SEND_BUFFER_BYTES:
        return False
    with open(WMEM_DEFAULT, "w") as f:
        f.write(str(SEND_BUFFER_BYTES))
    return True


def vswitchd_send_buffer() -> int | None:
    """The send buffer of ovs-vswitchd's AF_PACKET socket, or None before its first send."""
    try:
        out = subprocess.run(["ss", "-0", "-m", "-p"], capture_output=True, text=True,
                             timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        if '"ovs-vswitchd"' in line and "skmem:(" in line:
            for field in line.split("skmem:(", 1)[1].rstrip(")").split(","):
                if field.startswith("tb"):
                    return int(field[2:])
    return None


def _ensure_tso() -> None:
    subprocess.run(["ovs-vsctl", "--no-wait", "set", "Open_vSwitch", ".",
                    "other_config:userspace-tso-enable=true"], check=True)


def main(argv: list[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else "status"
    if cmd == "ensure":
        dp = ensure()
        print(f"[setup] Open vSwitch running, datapath={dp}")
        return 0
    if cmd == "status":
        print(f"running={running()} datapath={datapath()}")
        return 0 if running() else 1
    print(f"usage: {argv[0]} ensure|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
