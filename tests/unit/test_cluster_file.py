"""The cluster file: checked like a scenario, one error naming the field; and what a
cluster run refuses before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lab.model import cluster
from lab.model.errors import LabError

GOOD = """\
head: w1
workers:
  - {name: w1, ssh: local, address: 192.168.77.1, mtu: 9000}
  - {name: w2, ssh: root@192.168.77.2, address: 192.168.77.2, mtu: 9000, cores: 2,
     nic_mbps: 1000}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cluster.yaml"
    p.write_text(text)
    return p


def test_good_file_round_trips(tmp_path: Path) -> None:
    spec = cluster.load(write(tmp_path, GOOD))
    assert spec.head == "w1" and [w.name for w in spec.workers] == ["w1", "w2"]
    assert spec.head_worker.local and not spec.worker("w2").local
    assert spec.worker("w2").nic_mbps == 1000.0 and spec.worker("w2").cores == 2
    again = cluster.load(write(tmp_path, cluster.dump(spec)))
    assert again.workers == spec.workers and again.head == spec.head


@pytest.mark.parametrize(("text", "field", "words"), [
    ("head: w1\nworkers: [", "cluster", "malformed YAML"),
    ("- a\n", "cluster", "mapping"),
    ("head: w1\n", "workers", "missing"),
    ("head: w3\n" + GOOD.split("\n", 1)[1], "head", "not one of the workers"),
    (GOOD.replace("192.168.77.2, mtu", "192.168.77.1, mtu"), "workers[w2].address",
     "also w1's"),
    (GOOD.replace("name: w2", "name: w1"), "workers[w1].name", "also w1's"),
    (GOOD.replace("mtu: 9000, cores", "mtu: 1500, cores"), "workers[w2].mtu",
     "below what a tunnel needs"),
    (GOOD.replace("address: 192.168.77.2", "address: 127.0.0.2"), "workers[w2].address",
     "not loopback"),
    (GOOD.replace("address: 192.168.77.2", "address: nine"), "workers[w2].address",
     "IPv4"),
    (GOOD.replace("ssh: root@192.168.77.2", "ssh: local"), "workers[w2].ssh",
     "only the head"),
    (GOOD.replace("cores: 2", "cores: 0"), "workers[w2].cores", ">= 1"),
    (GOOD.replace("nic_mbps: 1000", "nic_mbps: -1"), "workers[w2].nic_mbps", "> 0"),
    (GOOD.replace("cores: 2", "corez: 2"), "workers[w2].corez", "unknown key"),
    (GOOD + "tunnel: vxlan\n", "tunnel", "known tunnels"),
    (GOOD.replace("name: w2", "name: W2!"), "workers[1].name", "short lower-case"),
])
def test_bad_file_names_the_field(tmp_path: Path, text: str, field: str, words: str) -> None:
    with pytest.raises(LabError) as err:
        cluster.load(write(tmp_path, text))
    assert err.value.field == field, err.value
    assert words in err.value.message


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(LabError) as err:
        cluster.load(tmp_path / "nope.yaml")
    assert err.value.field == "cluster" and "nope.yaml" in err.value.message


def test_cli_refuses_a_bad_cluster_file_before_anything(tmp_path: Path) -> None:
    """`fabriclab run --cluster` with a bad file: exit 2, one line naming the field."""
    bad = write(tmp_path, GOOD.replace("mtu: 9000, cores", "mtu: 1400, cores"))
    out = subprocess.run([sys.executable, "-m", "lab.cli", "run", "ecmp-basic", "--cluster",
                          str(bad), "--duration", "1"], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "workers[w2].mtu" in lines[0], out.stderr


def test_mininet_cluster_cleanup_is_disarmed() -> None:
    """Mininet's cluster edition would run `mn -c` on every server: never."""
    from mininet.examples.cluster import ClusterCleanup

    import lab.net.cluster  # noqa: F401 - disarms it on import
    with pytest.raises(LabError, match="never runs `mn -c`"):
        ClusterCleanup.cleanup()


def test_tunnels_beyond_a_workers_nic_are_warned_before_the_run(tmp_path: Path) -> None:
    """A plan whose tunnels carry more than a worker's stated NIC rate: a warning, like the
    capacity warning; the run is not refused."""

    from lab import run
    given = run.check_input("ecmp-basic", policy="hash5")
    said: list[str] = []
    spec = write(tmp_path, GOOD.replace("nic_mbps: 1000", "nic_mbps: 50"))
    split = run.plan_cluster(spec, given, said.append)
    assert {split.where["leaf1"], split.where["leaf2"]} == {"w1", "w2"}
    (line,) = said
    assert "w2's tunnels carry up to" in line and "50" in line and "warning" in line
    ok: list[str] = []
    run.plan_cluster(write(tmp_path, GOOD), given, ok.append)
    assert ok == []


def test_what_a_cluster_cannot_split_is_refused_naming_the_field(tmp_path: Path) -> None:
    """A synthetic ring splits; gloo's ranks, storage and a streaming scenario are refused
    before anything starts, each naming its field."""
    from lab import run
    good = write(tmp_path, GOOD)
    split = run.plan_cluster(good, run.check_input("allreduce-ecmp"))
    assert set(split.where.values()) == {"w1", "w2"}
    for name, field in (("allreduce-gloo", "job.library"),
                        ("allreduce-shared-link", "storage.mode"),
                        ("streaming-incident", "kind")):
        with pytest.raises(LabError) as exc:
            run.plan_cluster(good, run.check_input(name))
        assert exc.value.field == field and "so far" in exc.value.message, exc.value
