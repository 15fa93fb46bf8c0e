#!/usr/bin/env bash
# The provisioner of a full-kernel VM: run by the Vagrantfile (`vagrant up`) and by
# `fabriclab vm build`, so the one script users get is the one the VM lane tests.
#
# The venvs live on the VM's own disk, not in the shared checkout (symlinks, speed), and
# /etc/fabriclab/env tells `make` and lab/setup.sh where. Then the same set-up entry point
# as `make setup` and CI runs. Pip settings (e.g. PIP_NO_INDEX/PIP_FIND_LINKS for a VM
# whose Python packages come from a wheelhouse) pass through from the environment.
set -euo pipefail
# The checkout: the first argument (Vagrant uploads this file to /tmp before it runs it, so
# it passes /vagrant), else the checkout this file lies in.
REPO="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
mkdir -p /etc/fabriclab
printf 'VENV=/opt/fabriclab/venv\nRYU_VENV=/opt/fabriclab/venv-ryu\n' > /etc/fabriclab/env
command -v make >/dev/null || (apt-get update -qq && apt-get install -y -q make)
bash "$REPO/lab/setup.sh"
