"""A policy file resolved by a process running as root is loaded in a jail and asked across a
socket (``lab.machine.jail.load_policy``, ``controllers.policies.remote``): the decisions
are the file's own, and its code has no root, no network and no view of the lab."""

from __future__ import annotations

import os
import random
import socket
import textwrap
import time
from pathlib import Path

import pytest

from controllers import policies
from controllers.policies import FlowKey, load_file, remote
from lab.machine import jail

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root to build")

#: A stateful policy: least-placed port, ties by a 5-tuple hash, so ``placed`` matters.
STATEFUL = '''
from controllers.policies import HashPolicy
from controllers.policies.base import pack_5tuple, seeded_crc


class Fewest(HashPolicy):
    granularity = "flow"
    idle_timeout = 7
    decides_ahead = False

    def __init__(self, seed=0):
        super().__init__(seed)
        self.count = {}

    def choose(self, flow, switch, ports):
        h = seeded_crc(pack_5tuple(flow), self.seed)
        return min(ports, key=lambda p: (self.count.get((switch, p), 0), (h + p) % 7))

    def placed(self, flow, switch, port, rate_bps):
        self.count[(switch, port)] = self.count.get((switch, port), 0) + 1
'''

#: What the file's code can see and do, told by the port it picks: ports[i] for the i-th
#: thing it could do that it must not.
PROBE = '''
import os, socket
from pathlib import Path
from controllers.policies import HashPolicy

REPO = {repo!r}


class Probe(HashPolicy):
    granularity = "flow"

    def choose(self, flow, switch, ports):
        print("a policy that prints cannot garble a reply")
        if os.geteuid() == 0 or os.getuid() == 0:
            return ports[1]
        if Path(REPO, "lab").exists() or Path("/root").exists():
            return ports[2]
        try:
            socket.create_connection(("127.0.0.1", 22), timeout=1).close()
            return ports[3]
        except OSError:
            pass
        try:
            Path("/etc/fabriclab-jail-escape").write_text("x")
            return ports[4]
        except OSError:
            pass
        return ports[0]
'''

FLOW = FlowKey("10.0.0.1", "10.0.0.2", 6, 40001, 5201)


def write(tmp_path: Path, name: str, text: str, mode: int = 0o644) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    path.chmod(mode)
    return path


@pytest.fixture(autouse=True)
def jails_closed():
    yield
    jail.close_all()


def test_the_jailed_policy_decides_as_the_file_does_in_process(tmp_path: Path) -> None:
    # 0600 as a file in root's home is: the jail copies it, nobody could not read it.
    path = write(tmp_path, "fewest.py", STATEFUL, mode=0o600)
    remote_cls = jail.load_policy(str(path))
    local_cls = load_file(str(path))
    assert issubclass(remote_cls, remote.RemotePolicy)
    for attr in remote.CLASS_ATTRS:
        assert getattr(remote_cls, attr) == getattr(local_cls, attr), attr
    assert remote_cls.name == "fewest.Fewest" and remote_cls.idle_timeout == 7
    assert policies.spec_of(remote_cls) == f"{path.resolve()}:Fewest"
    rng = random.Random(3)
    there, here = remote_cls(seed=5), local_cls(seed=5)
    got, want = [], []
    for _ in range(300):
        key = FlowKey(f"10.0.{rng.randrange(4)}.{rng.randrange(1, 9)}", "10.1.0.1", 6,
                      rng.randrange(1024, 65536), 5201)
        switch, ports = rng.choice([("leaf1", [1, 2, 3, 4]), ("spine2", [3, 5])])
        for policy, out in ((there, got), (here, want)):
            port = policy.choose(key, switch, ports)
            policy.placed(key, switch, port, None)
            out.append(port)
    assert got == want
    # One jail per version of the file; the class named or not is one class.
    assert jail.load_policy(f"{path}:Fewest") is remote_cls
    assert not hasattr(remote_cls, "observe_jobs")


def test_a_file_of_the_job_aware_kind_is_told_the_jobs_through_the_jail(tmp_path: Path) -> None:
    source = (Path(policies.__file__).parent / "job_aware.py").read_text()
    path = write(tmp_path, "mine.py", source.replace('name = "job-aware"', 'name = ""'))
    there, here = jail.load_policy(str(path))(seed=2), load_file(str(path))(seed=2)
    jobs = {FlowKey("10.0.0.1", "10.0.1.1", 6, 40000 + i, 5201): f"job{i % 3}"
            for i in range(12)}
    for policy in (there, here):
        policy.observe_jobs(jobs)
    assert [there.choose(k, "leaf1", [1, 2, 3, 4]) for k in jobs] == \
        [here.choose(k, "leaf1", [1, 2, 3, 4]) for k in jobs]


def test_the_file_has_no_root_no_network_and_no_view_of_the_lab(tmp_path: Path) -> None:
    path = write(tmp_path, "probe.py", PROBE.format(repo=str(jail.REPO)))
    policy = jail.load_policy(str(path))(seed=1)
    assert policy.choose(FLOW, "leaf1", [1, 2, 3, 4, 5]) == 1
    assert not Path("/etc/fabriclab-jail-escape").exists()


def test_errors_name_the_file_as_given_and_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.py", '''
        from controllers.policies import HashPolicy

        class Bad(HashPolicy):
            granularity = "flow"

            def choose(self, flow, switch, ports):
                return {}[flow.sport]
        ''')
    policy = jail.load_policy(str(path))(seed=0)
    with pytest.raises(remote.PolicyCallError, match=r"choose: KeyError: 40001 \(bad.py line 8\)"):
        policy.choose(FLOW, "leaf1", [1, 2])
    wrong = write(tmp_path, "wrong.py", '''
        from controllers.policies import HashPolicy

        class Wrong(HashPolicy):
            granularity = "flow"

            def choose(self, flow, switch, ports):
                return 99
        ''')
    with pytest.raises(remote.PolicyCallError, match=r"returned 99 at leaf1, not one of"):
        jail.load_policy(str(wrong))(seed=0).choose(FLOW, "leaf1", [1, 2])
    broken = write(tmp_path, "broken.py", "def f(:\n")
    with pytest.raises(policies.PolicyFileError) as exc:
        jail.load_policy(str(broken))
    assert str(exc.value) == f"policy-file: {broken}:1: syntax error: invalid syntax"
    with pytest.raises(policies.PolicyFileError, match="cannot read it: No such file"):
        jail.load_policy(str(tmp_path / "missing.py"))
    weird = write(tmp_path, "weird.py", '''
        from controllers.policies import HashPolicy

        class Weird(HashPolicy):
            granularity = "per-packet"

            def choose(self, flow, switch, ports):
                return ports[0]
        ''')
    with pytest.raises(policies.PolicyFileError, match="granularity 'per-packet'"):
        jail.load_policy(str(weird))


def test_a_policy_stuck_in_a_loop_fails_its_caller_and_its_jail_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "CALL_TIMEOUT_S", 0.5)
    path = write(tmp_path, "spin.py", '''
        from controllers.policies import HashPolicy

        class Spin(HashPolicy):
            granularity = "flow"

            def choose(self, flow, switch, ports):
                while True:
                    pass
        ''')
    policy = jail.load_policy(str(path))(seed=0)
    (held,) = {j for j, _ in jail._OPEN.values()}
    t0 = time.monotonic()
    with pytest.raises(remote.PolicyCallError, match=r"no answer within 0\.5 s"):
        policy.choose(FLOW, "leaf1", [1, 2])
    assert time.monotonic() - t0 < 5          # its own bound, not the default 5 s
    jail.close_all()
    assert held.proc.poll() is not None
    # The jail's whole session goes: its last members are zombies until init reaps them.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(held.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the jail's session {held.pid} outlived close()")
    assert not held.scratch.exists()


def test_a_successor_on_the_same_socket_skips_its_predecessors_reply() -> None:
    ours, theirs = socket.socketpair()
    channel = remote.Channel(ours)
    theirs.sendall(b'{"id": 1, "ok": true, "value": 9}\n')   # a killed asker's late reply
    rid = channel.next_id + 1
    theirs.sendall(b'{"id": %d, "ok": true, "value": 2}\n' % rid)
    assert channel.call("choose") == 2
    ours.close()
    theirs.close()
