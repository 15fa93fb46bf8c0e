"""The Vagrant VM is provisioned by the same set-up entry point as `make setup` and CI."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_provisioner_runs_the_setup_entry_point():
    text = (REPO / "Vagrantfile").read_text()
    assert 'config.vm.box = "debian/bookworm64"' in text
    assert re.search(r"cpus = [2-9]", text) and re.search(r"memory = (\d{4,})", text)
    assert 'path: "lab/provision.sh", args: ["/vagrant"]' in text
    provision = (REPO / "lab" / "provision.sh").read_text()
    assert re.search(r'^bash "\$REPO/lab/setup.sh"$', provision, re.M)
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^setup:\n\tbash lab/setup.sh$", makefile, re.M)
    assert re.search(r"^make test$", (REPO / ".ci" / "run").read_text(), re.M)


def test_readme_commands_match_the_makefile():
    readme = (REPO / "README.md").read_text()
    # As root, with no sudo needed (a Debian 12 installed without it has none).
    assert re.search(r"^make demo +#", readme, re.M) and re.search(r"^make test +#", readme, re.M)
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^demo: setup$", makefile, re.M)
    assert re.search(r"^test: setup", makefile, re.M)


def test_the_tests_set_up_installs_vagrant():
    """`make test` and `make unit` install Vagrant first (make test-tools), so the check
    below runs wherever the suite is run the documented way, not in CI alone."""
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test: setup test-tools\b", makefile, re.M)
    assert re.search(r"^unit: setup test-tools\b", makefile, re.M)
    recipe = re.search(r"^test-tools:\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe and "apt-get install" in recipe.group(1) and "vagrant" in recipe.group(1)


@pytest.mark.skipif(not shutil.which("vagrant"), reason="vagrant is not installed (make test "
                    "and make unit install it: make test-tools)")
def test_vagrant_validate():
    r = subprocess.run(["vagrant", "validate", "--ignore-provider"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validated successfully" in r.stdout
