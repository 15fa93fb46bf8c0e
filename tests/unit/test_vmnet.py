"""The host's half of `fabriclab vm run --live`: QEMU forwards one port of this machine's
loopback, and only that, into a guest network that reaches nothing (the guest's half:
tests/integration/test_vm_forward.py)."""

from __future__ import annotations

import socket

from lab.machine import vmnet

PORT = 8765


def test_qemu_forwards_only_from_this_machines_loopback_into_a_restricted_network():
    args = " ".join(vmnet.qemu_args(40001, PORT))
    assert "hostfwd=tcp:127.0.0.1:40001-10.0.2.15:8765" in args
    assert "restrict=on" in args and f"mac={vmnet.MAC}" in args


def test_the_host_port_is_the_preferred_one_when_free_else_another():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        other = vmnet.host_port(taken)
        assert other != taken and other > 0
    assert vmnet.host_port(taken) == taken
