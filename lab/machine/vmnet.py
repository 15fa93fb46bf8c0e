"""A port of this machine's loopback forwarded to a port on the guest's loopback.

A guest of ``fabriclab vm`` has no network (``lab.machine.vm``); a page it serves on its own
127.0.0.1 (``fabriclab run --live``) is out of the host's reach. For that one port it gets
one network device: QEMU's user network with ``restrict=on`` (the guest reaches nothing
through it, neither the host nor anything beyond) and a single ``hostfwd`` rule bound to the
host's 127.0.0.1, so only this machine's own users reach the page, as on the host.

QEMU delivers a forwarded connection to the guest's address on that network; inside the
guest an nftables rule sends it on to the guest's loopback, where the page listens, and
``route_localnet`` lets the kernel route a packet from the device to 127.0.0.1 (else it
drops it as martian). The page's own check of the Host header still passes: the browser on
the host asks for ``127.0.0.1:PORT``.
"""

from __future__ import annotations

import errno
import socket

#: The guest's address on QEMU's user network (QEMU's default for the first guest).
GUEST_ADDR = "10.0.2.15"
#: QEMU's own address on that network (its gateway).
GATEWAY = "10.0.2.2"
#: The device's MAC: how the guest finds it among the interfaces the lab will create.
MAC = "52:54:00:fb:00:01"


def host_port(prefer: int) -> int:
    """``prefer`` on this machine's 127.0.0.1 when it is free (a tab left open finds the
    next run there), else a free one the kernel picks."""
    for port in (prefer, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                continue
            return s.getsockname()[1]
    raise OSError("no free port on 127.0.0.1")


def qemu_args(host: int, guest: int) -> tuple[str, ...]:
    """The device and its one forwarding rule: host 127.0.0.1:``host`` to the guest's
    ``guest`` port."""
    return ("-netdev", f"user,id=fwd,restrict=on,hostfwd=tcp:127.0.0.1:{host}-{GUEST_ADDR}:"
                       f"{guest}",
            "-device", f"virtio-net-pci,netdev=fwd,mac={MAC}")


def guest_step(guest: int) -> str:
    """Shell run in the guest before the job: the device up with its address, and
    connections to ``guest`` on it sent on to the guest's loopback."""
    return f"""\
fwd_dev=$(grep -l '^{MAC}$' /sys/class/net/*/address | head -n1 | cut -d/ -f5)
[ -n "$fwd_dev" ] || {{ echo "vm: the forwarding device is missing in the guest" >&2; exit 3; }}
ip link set "$fwd_dev" up && ip addr add {GUEST_ADDR}/24 dev "$fwd_dev"
sysctl -qw "net.ipv4.conf.$fwd_dev.route_localnet=1"
nft -f - <<EOF
table ip fabriclab_fwd {{
    chain prerouting {{
        type nat hook prerouting priority dstnat;
        iifname "$fwd_dev" tcp dport {guest} dnat to 127.0.0.1:{guest}
    }}
}}
EOF
# QEMU learns the guest's MAC from the guest's first frame: send one.
ping -c1 -W2 {GATEWAY} >/dev/null 2>&1 || true"""
