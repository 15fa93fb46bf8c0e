#!/usr/bin/env bash
# Inside a `fabriclab vm` guest: the job runner, started once per boot by fabriclab-job.service
# when the kernel command line carries fabriclab.job=run|shell|cluster. Installed into the image at
# build time as /usr/local/sbin/fabriclab-vm-job.
#
# The host shares two folders over virtio-9p: `job` (this boot's job.sh, the checkout as a
# tar, the environment, and where job.log and rc go back) and `out` (results). Output goes to
# job.log as it is written, so the host streams it; the exit status to rc. Then the guest
# powers off (mode run); in mode shell it leaves the console to the root login.
set -u
mode=$(sed -n 's/.*fabriclab\.job=\([a-z]*\).*/\1/p' /proc/cmdline)
opts=trans=virtio,version=9p2000.L,msize=262144
mkdir -p /mnt/job /mnt/out
mount -t 9p -o "$opts" job /mnt/job || { echo "fabriclab-vm-job: no job share" >&2; exit 1; }
mount -t 9p -o "$opts" out /mnt/out 2>/dev/null || true

run_job() {
    # A fresh copy of the host's checkout, in the place the image's editable install knows;
    # the install's own metadata stays.
    if [ -f /mnt/job/checkout.tar ]; then
        mkdir -p /fabriclab
        find /fabriclab -mindepth 1 -maxdepth 1 ! -name '*.egg-info' -exec rm -rf {} +
        tar -xf /mnt/job/checkout.tar -C /fabriclab
    fi
    # shellcheck disable=SC1091
    [ -f /mnt/job/env ] && set -a && . /mnt/job/env && set +a
    cd /fabriclab || return 1
    [ -f /mnt/job/job.sh ] && bash /mnt/job/job.sh
}

if [ "$mode" = shell ]; then
    run_job > /mnt/job/job.log 2>&1 < /dev/null
    echo "fabriclab vm shell: checkout in /fabriclab, results in /mnt/out; 'poweroff' leaves" \
        > /dev/ttyS0
    exit 0
fi
rc=0
run_job > /mnt/job/job.log 2>&1 < /dev/null || rc=$?
echo "$rc" > /mnt/job/rc.tmp && mv /mnt/job/rc.tmp /mnt/job/rc
sync
# A cluster member stays up after its job (which started sshd): `fabriclab vm cluster down`
# stops its QEMU.
[ "$mode" = cluster ] || systemctl --no-block poweroff
