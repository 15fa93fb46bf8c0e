"""Start the Ryu-API controller for a run and talk to it over its unix control socket.

The controller is a separate process running under the chosen runtime's interpreter (os-ken
in the lab's venv, or Ryu 4.34 in its own), listening for OpenFlow on 127.0.0.1 only. The
lab hands it the topology in a config file (the controller never guesses it) and then asks it
over JSON lines whether every switch is programmed, and to install per-flow counters.

A policy in a user's file never runs in the controller, which runs as root: the lab loads it
in a jail of its own (``lab.machine.jail.PolicyJail``) and hands the controller that jail's
socket, over which it asks for each decision. The jail outlives a controller restart, as a
decision service would, and is stopped with the run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from controllers.policies import is_file_spec
from lab.machine.environment import REPO_ROOT, runtime_python
from lab.machine.jail import PolicyJail
from lab.machine.state import RUN_ENV, RunRecord
from lab.model.errors import MachineError


def free_tcp_port() -> int:
    """A port on 127.0.0.1 that is free now (the controller binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Controller:
    """One controller process and its control channel."""

    def __init__(self, runtime: str, config: dict[str, object], run_dir: Path,
                 record: RunRecord) -> None:
        self.runtime = runtime
        self.run_dir = run_dir
        self.record = record
        self.port = free_tcp_port()
        self.socket_path = run_dir / "controller.sock"
        self.config = dict(config, control_socket=str(self.socket_path))
        self.config_path = run_dir / "controller.json"
        self.log_path = run_dir / "controller.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.policy_jail: PolicyJail | None = None

    def start(self) -> None:
        policy = str(self.config.get("policy", ""))
        if is_file_spec(policy) and os.geteuid() == 0 and self.policy_jail is None:
            self.policy_jail = PolicyJail(policy, log=self.run_dir / "policy.log",
                                          env={RUN_ENV: self.record.run_id})
            self.record.add_pid(self.policy_jail.pid, "policy-jail")
            self.config["policy_fd"] = self.policy_jail.sock.fileno()
        self.config_path.write_text(json.dumps(self.config, indent=1))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env[RUN_ENV] = self.record.run_id
        cmd = [runtime_python(self.runtime), "-m", "controllers.launch",
               "--runtime", self.runtime, "--config", str(self.config_path),
               "--ofp-port", str(self.port)]
        with open(self.log_path, "ab") as log:
            # Own session: a Ctrl-C in the terminal reaches the lab, which stops us in order.
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=str(REPO_ROOT), start_new_session=True,
                                         pass_fds=[int(self.config["policy_fd"])]
                                         if "policy_fd" in self.config else ())
        self.record.add_pid(self.proc.pid, "controller")
        self._wait_socket()

    def _wait_socket(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise MachineError("controller", f"the {self.runtime} controller exited with "
                                   f"status {self.proc.returncode}; see {self.log_path}:\n"
                                   + self.log_tail())
            if self.socket_path.exists():
                try:
                    self.request({"cmd": "status"})
                    return
                except OSError:
                    pass
            time.sleep(0.05)
        raise MachineError("controller", f"no control socket after {timeout:g} s; see "
                           f"{self.log_path}")

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def request(self, msg: dict[str, object], timeout: float = 30.0) -> dict[str, object]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.socket_path))
            s.sendall(json.dumps(msg).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        reply = json.loads(buf)
        if not reply.get("ok"):
            raise MachineError("controller", f"{msg.get('cmd')}: {reply.get('error')}")
        return reply

    def wait_ready(self, timeout: float = 20.0) -> dict[str, object]:
        """Block until every switch of the topology is connected and programmed."""
        deadline = time.monotonic() + timeout
        status: dict[str, object] = {}
        while time.monotonic() < deadline:
            status = self.request({"cmd": "status"})
            if status.get("ready"):
                return status
            time.sleep(0.05)
        raise MachineError("controller", f"switches not programmed after {timeout:g} s: "
                           f"{status.get('switches')}")

    def kill(self) -> None:
        """SIGKILL, by PID: a controller crash, as a fault to survive (``lab.workloads.faults``)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        """A new controller process on the same OpenFlow port and control socket: the
        switches, fail-secure meanwhile, reconnect to it and it reconciles them."""
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.policy_jail is not None:
            self.policy_jail.close()
            self.policy_jail = None
