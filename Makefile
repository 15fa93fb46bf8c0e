# FabricLab: `make demo` sets everything up (if missing) and runs the main scenario;
# `make test` sets up and runs the whole test suite; `make test-vm` runs the full-kernel lane
# in a QEMU VM (CI runs make test, then make test-vm-ci: the part of the lane that fits). Run as root.
-include /etc/fabriclab/env
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
export VENV

.PHONY: setup vm-setup vagrant-setup vagrant-box libvirt-start libvirt-stop test-tools demo test test-vm test-vm-ci test-cluster test-cluster-ci unit lint docs architecture bench clean

setup:
	bash lab/setup.sh

# What the tests need beyond the lab: Vagrant, to validate the Vagrantfile (no box is
# downloaded). Here rather than in lab/setup.sh, which also provisions the VM image and the
# Vagrant box, where Vagrant has no use.
test-tools:
	command -v vagrant >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends vagrant; }

# The full-kernel lane: QEMU and mmdebstrap on this machine, then a Debian 12 VM built from
# Debian's packages and provisioned by lab/provision.sh (the Vagrantfile's provisioner).
vm-setup: setup
	bash lab/setup.sh --vm-host

# Vagrant with libvirt on this machine: vagrant-libvirt, libvirt's daemons and QEMU driver,
# dnsmasq for its NAT network, rsync for the synced folder, acl to let libvirt's QEMU user
# reach the box's kernel (lab/machine/vagrantbox.py). For `make vagrant-box` and the
# Vagrant test in test-vm (tests/vm/test_vagrant.py); not for CI's part of the lane.
VAGRANT_PKGS := vagrant vagrant-libvirt libvirt-daemon-system libvirt-daemon-driver-qemu \
	libvirt-clients dnsmasq-base rsync acl
vagrant-setup:
	@missing=$$(for p in $(VAGRANT_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
		| grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends $$missing; fi

# A libvirt box of the Vagrantfile's box name, made from `fabriclab vm`'s image, for
# `vagrant up` without internet (docs/vagrant.md).
vagrant-box: vm-setup vagrant-setup
	$(PY) -m lab.machine.vagrantbox add

# libvirt's daemons where nothing starts them (no systemd): started if not running, and
# stopped by the PIDs written down when they were started here, never by name.
libvirt-start: vagrant-setup
	$(PY) -m lab.machine.vagrantbox daemons
libvirt-stop:
	$(PY) -m lab.machine.vagrantbox daemons-stop

test-vm: vm-setup vagrant-setup
	$(PY) -m pytest -m vm tests/vm

# The part of the lane that fits in CI beside `make test`: the image, the provisioner, doctor,
# the link tests, ecmp-basic on both datapaths, `fabriclab vm run`, kill -9 and clean. The
# scenarios left out (incast-ecn, streaming-incident, allreduce-ecmp) run in test-vm and
# bench/vm_lane.py.
test-vm-ci: vm-setup
	FABRICLAB_VM_LANE=ci $(PY) -m pytest -m "vm and not vm_full" tests/vm

demo: setup
	$(VENV)/bin/fabriclab run ecmp-basic

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

# ARCHITECTURE.md's picture of the layers, drawn from the code's imports (import-linter's
# drawgraph, rendered by Graphviz).
architecture: setup
	command -v dot >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q graphviz
	$(VENV)/bin/import-linter drawgraph lab --show-cycle-breakers > docs/architecture.dot
	dot -Tsvg docs/architecture.dot -o docs/architecture.svg

# The documentation site (mkdocs.yml, docs/) into site/, strict: a broken link or anchor, or a
# page missing from the nav, fails; the command reference and result.json's keys are generated
# from the code as it builds. Part of `make test`, so CI builds it too. Not --quiet: MkDocs
# counts strict mode's warnings from its log, and --quiet silences them into a pass.
docs: setup
	$(VENV)/bin/mkdocs build --strict

test: setup test-tools lint docs
	$(PY) -m pytest --durations=25

unit: setup test-tools
	$(PY) -m pytest tests/unit

bench: setup
	$(PY) bench/run_all.py

clean:
	$(VENV)/bin/fabriclab clean

# One fabric over two QEMU VMs (Mininet's cluster edition): `fabriclab vm cluster up`, then
# every cluster test on the head. CI runs the part marked `cluster and not cluster_full`.
test-cluster: vm-setup
	$(PY) -m pytest -m cluster tests/cluster

test-cluster-ci: vm-setup
	$(PY) -m pytest -m "cluster and not cluster_full" tests/cluster
