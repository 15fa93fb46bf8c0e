"""`fabriclab diagnose` names the link that dropped, checked against its queue's counter."""

from __future__ import annotations

from lab.analysis import diagnose
from tests.integration.support import fabriclab, run_result


def test_diagnose_names_the_congested_uplink(tmp_path):
    # hash-l3, seed 1: all four host pairs hash onto one uplink (8 flows, 180 Mbit/s offered
    # into 100 Mbit/s).
    r = run_result(tmp_path, "--policy", "hash-l3", "--seed", "1", "--duration", "3")
    report = diagnose.diagnose(r)
    by_drops = max(r["links"], key=lambda ln: ln["drops"])
    hot = f"{by_drops['node']}->{by_drops['peer']}"
    assert by_drops["drops"] > 0
    assert report["congested_link"] == hot
    top = report["ranked"][0]
    assert top["link"] == hot and top["lost_at_port"] > 0 and set(top["flows"]) == {
        f["id"] for f in r["flows"]}
    # the flows' losses are located on that uplink (a little may be lost inside the
    # emulator's datapath elsewhere; the report shows that separately)
    print(diagnose.render(report))
    total = sum(x["lost_bytes"] for x in report["ranked"])
    assert top["lost_bytes"] >= 0.8 * total, report["ranked"]
    out = fabriclab("diagnose", str(tmp_path / "out")).stdout
    assert f"congested link: {hot}" in out


def test_diagnose_bad_path_is_one_clear_error(tmp_path):
    r = fabriclab("diagnose", str(tmp_path / "nothing"), check=False)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("fabriclab: error: result:")
    assert len(r.stderr.strip().splitlines()) == 1
