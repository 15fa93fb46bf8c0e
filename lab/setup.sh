#!/usr/bin/env bash
# FabricLab set-up: the one entry point used by `make setup`, `make demo`, `make test`,
# CI and the Vagrant provisioner. Idempotent: every step checks before it acts.
#
# Why a shell script: it has to run before any Python dependency exists, on a bare
# Debian 12 machine (CI, a kernel without modules) and in a full-kernel VM (Vagrant).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Site settings (the Vagrant provisioner keeps the venvs off the synced folder this way).
# shellcheck disable=SC1091
[ -r /etc/fabriclab/env ] && . /etc/fabriclab/env
VENV="${VENV:-$REPO/.venv}"
RYU_VENV="${RYU_VENV:-$REPO/.venv-ryu}"
SYS_PY=/usr/bin/python3          # Debian's Python: Mininet from apt is built for it
# The package list is shared with `fabriclab vm build`: lab/packages.txt, one name a line.
mapfile -t APT_PKGS < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$REPO/lab/packages.txt")
# --vm-host: also what `fabriclab vm` needs on this machine to build and boot the VM.
if [ "${1:-}" = --vm-host ]; then
    APT_PKGS+=(qemu-system-x86 qemu-utils mmdebstrap e2fsprogs)
fi

say() { printf '[setup] %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "setup: must run as root (a root shell, or: sudo make setup)" >&2
    exit 2
fi

# FABRICLAB_SETUP_ONLY=python: only the Python environments and the command (steps 4-5).
# `fabriclab vm build` runs that natively in the image's file tree (a chroot, where the
# machine-wide steps would touch the host's kernel and Open vSwitch); the provisioner then
# runs whole in the booted guest and finds the environments in place.
if [ "${FABRICLAB_SETUP_ONLY:-}" != python ]; then
# --- 1. Debian packages --------------------------------------------------------------------
missing=()
for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing: ${missing[*]}"
    our_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        # Keep packages from starting services: OVS's init script would try to load a kernel
        # module this kernel may not have, and FRR's would start daemons in the root
        # namespace. The lab starts OVS itself and runs FRR only inside its routers.
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        our_policy=1
    fi
    apt-get update -qq
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}"; then
        # Seen on the CI image: the security suite's newer kernel-tool packages (bpftool,
        # linux-libc-dev) "cannot be authenticated". The release's own suite can.
        codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
        say "retrying from the $codename suite"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            -t "$codename" "${missing[@]}"
    fi
    [ -n "$our_policy" ] && rm -f /usr/sbin/policy-rc.d
else
    say "Debian packages present"
fi

# A system FRR service (where systemd enables it) would run routing daemons in the root
# namespace; the lab's routers run their own.
# The same for nginx: its packaged site would listen on port 80 in the root namespace; the
# lab's media servers are its own, one per host, on the hosts' fabric addresses.
for svc in frr nginx; do
    if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled "$svc" >/dev/null 2>&1; then
        systemctl disable --now "$svc" || true
    fi
done

# --- 2. TCP congestion controls usable inside namespaces -----------------------------------
allowed=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)
avail=$(cat /proc/sys/net/ipv4/tcp_available_congestion_control)
want="$allowed"
for cc in $avail; do
    case " $want " in *" $cc "*) ;; *) want="$want $cc" ;; esac
done
if [ "$want" != "$allowed" ]; then
    say "allowing congestion controls in namespaces: $want"
    sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$want"
fi

# --- 3. Open vSwitch, as this kernel allows ------------------------------------------------
"$SYS_PY" "$REPO/lab/machine/ovs_service.py" ensure

# --- 3b. hls.js for the browser viewer of real media (pinned, sha512-checked; off the repo) --
# From the npm registry without npm, which a plain Debian 12 does not have:
# lab/machine/hlsjs.py (the same layout `npm install --prefix` leaves).
HLSJS_DIR="${HLSJS_DIR:-/var/cache/fabriclab/hlsjs}"
if line=$("$SYS_PY" "$REPO/lab/machine/hlsjs.py" ensure "$HLSJS_DIR"); then
    say "$line"
else
    say "hls.js not installed (the streaming runs skip the browser viewer)"
fi
fi

# --- 4. Python environments ----------------------------------------------------------------
# Main venv: Debian's Python with its site packages (Mininet), os-ken as the controller runtime.
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$SYS_PY" -m venv --system-site-packages "$VENV"
fi
stamp="$VENV/.fabriclab-deps"
deps_hash=$(sha256sum "$REPO/setup.py" | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$deps_hash" ] \
        || ! "$VENV/bin/python" -c 'import lab, controllers' 2>/dev/null; then
    say "installing FabricLab and its Python dependencies into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -e "$REPO[dev]"
    echo "$deps_hash" > "$stamp"
else
    say "Python dependencies present in $VENV"
fi

# Second venv: Ryu 4.34, which needs old setuptools and an eventlet that runs on 3.11.
# (`fabriclab vm build` reads these two lines to put the same pins into the VM's wheelhouse.)
RYU_BUILD_DEPS=('setuptools<68' wheel pbr)
RYU_PKGS=(ryu==4.34 eventlet==0.33.3 dnspython==2.2.1)
if [ "${FABRICLAB_SKIP_RYU:-0}" != 1 ]; then
    if [ ! -x "$RYU_VENV/bin/python" ] || ! "$RYU_VENV/bin/python" -c 'import ryu' 2>/dev/null; then
        say "creating $RYU_VENV with Ryu 4.34"
        "$SYS_PY" -m venv "$RYU_VENV"
        "$RYU_VENV/bin/pip" install -q --disable-pip-version-check "${RYU_BUILD_DEPS[@]}"
        "$RYU_VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation \
            "${RYU_PKGS[@]}"
    else
        say "Ryu 4.34 present in $RYU_VENV"
    fi
fi

# The lab finds the Ryu interpreter through this file, wherever the venvs live.
echo "$RYU_VENV/bin/python" > "$VENV/fabriclab-ryu-python"

# --- 5. `fabriclab` on PATH for root and every user -----------------------------------------
ln -sfn "$VENV/bin/fabriclab" /usr/local/bin/fabriclab
say "ready: $(command -v fabriclab)"
