#!/usr/bin/env bash
# Runs INSIDE the VM guest (fabriclab vm exec), once per test session: every full-kernel
# scenario the lane checks, one after another on one boot (a boot costs ~30 s under TCG).
# Each step writes its result folder, log and exit status under $OUT; the host's tests read
# them. A failing step does not stop the others.
set -u
OUT=${1:-/mnt/out}
POLICIES=${2:-hash5 hash-l3 hash5-tier ovs-select}   # ecmp-basic's, space-separated
# full: every scenario below; ci: the part CI has time for (doctor, the link tests,
# ecmp-basic, the kill), the rest is in bench/vm_lane.py and make test-vm.
LANE=${3:-full}
# The real-media incident's TCG profile: one media server, two big streams at twice the rate
# (the same overload of the hot uplink as four at the scenario's rate, half the programs).
# Phases of 14 s: under TCG an RTMP viewer's first frame came 5.9-7.5 s after it joined, or
# not within an 8 s phase. No browser viewer there: Chromium takes most of a vCPU, which
# its players cannot spare.
STREAMING_REAL_SETS="--set topology.servers=1 --set before.servers=1 --set after.servers=1
    --set after.big_streams=2 --set after.normal_streams=0 --set streams.big_mbps=12
    --set streams.browser=never --duration 14"
# The browser viewer (hls.js in Chromium) on one stream of one server, for long enough that
# Chromium starts and plays under TCG (it took 22 s).
BROWSER_SETS="--set streams.media=real --set streams.browser=always --set phases=before-upgrade
    --set topology.servers=1 --set before.servers=1 --set after.servers=1
    --set before.big_streams=1 --duration 40"
PY=$(. /etc/fabriclab/env && echo "$VENV")/bin/python
step() {   # step NAME CMD...: run, log, keep the exit status
    local name=$1; shift
    local t0=$SECONDS
    echo "== $name: $*"
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$rc" > "$OUT/$name.rc"
    echo "== $name: exit $rc in $((SECONDS - t0)) s"
}
step doctor sh -c "fabriclab doctor --json > $OUT/doctor.json"
step guest-tests "$PY" -m pytest -q -p no:cacheprovider tests/guest \
    --junitxml="$OUT/guest-junit.xml"
for p in $POLICIES; do
    step "ecmp-$p" fabriclab run ecmp-basic --policy "$p" --seed 1 --duration 5 \
        --out "$OUT/ecmp-$p"
done
if [ "$LANE" = full ]; then
    step incast fabriclab run incast-ecn --out "$OUT/incast"
    step streaming fabriclab run streaming-incident --set phases=before-upgrade,incident \
        --out "$OUT/streaming"
    # Real media (ffmpeg, nginx-rtmp, real viewers) on the full kernel, with fewer streams:
    # under TCG every process's start and every frame cost the emulator's CPU, not the
    # network's (docs/kinds/streaming.md, "Real media in the VM").
    step streaming-real fabriclab run streaming-incident --set streams.media=real \
        --set phases=before-upgrade,incident $STREAMING_REAL_SETS --out "$OUT/streaming-real"
    step browser fabriclab run streaming-incident $BROWSER_SETS --out "$OUT/browser"
    step allreduce fabriclab run allreduce-ecmp --out "$OUT/allreduce"
    # DCQCN's marking by the kernel's RED, on the lossless class's leaf of ports with classes.
    # The TCG profile (an eighth) shrinks queues and thresholds but not frames: PFC's
    # headroom (whole frames per feeder) and RED's Kmin (one avpkt) need larger sizes there.
    step pfc-red fabriclab run pfc-hol --set classes.lossless_bytes=280000 \
        --set pfc.xoff_bytes=40000 --set pfc.xon_bytes=20000 --set ecn.kmin_bytes=12000 \
        --set ecn.kmax_bytes=32000 --out "$OUT/pfc-red"
fi

# kill -9 in the middle of a run's traffic, then `fabriclab clean`: nothing may be left.
echo "== kill: a run killed in its traffic phase"
fabriclab run ecmp-basic --policy hash5 --duration 60 --out "$OUT/killed" \
    > "$OUT/killed.log" 2>&1 &
victim=$!
for _ in $(seq 240); do
    grep -q "flows for" "$OUT/killed.log" 2>/dev/null && break
    sleep 0.5
done
sleep 2
before=$("$PY" -c 'import json; from tests.integration.support import lab_leftovers; print(json.dumps(lab_leftovers()))')
kill -9 "$victim"
wait "$victim" 2>/dev/null
fabriclab clean > "$OUT/clean.log" 2>&1
echo $? > "$OUT/clean.rc"
after=$("$PY" -c 'import json; from tests.integration.support import lab_leftovers; print(json.dumps(lab_leftovers()))')
printf '{"before": %s, "after": %s}\n' "$before" "$after" > "$OUT/kill.json"
echo "== kill: done"
