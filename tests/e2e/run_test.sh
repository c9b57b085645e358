#!/usr/bin/env bash
# End to end: `weft run` on a small config while things go wrong, checked through its report.
#   - a worker is killed with kill -9 mid-run: its jobs complete elsewhere and the run finishes;
#   - a worker started by hand mid-run catches up to the current version and takes jobs, then
#     drains on SIGTERM and exits cleanly;
#   - a blob in a relay's cache is corrupted: the relay detects it and fetches it again;
#   - the orchestrator is killed with kill -9 and restarted: the run continues and every
#     acknowledged trajectory is delivered or counted;
#   - weft sim, on the same shape with what the run measured, agrees with it within the tolerances
#     of tests/sim/crosscheck.sh.
# Usage: run_test.sh WEFT WORKDIR
set -uo pipefail
weft=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
work=$(pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../test_lib.sh"

# Fixed ports below the ephemeral range (32768 and up), where only listeners bind.
# Its own slice of ports, so that tests run in parallel (ctest -j2) never pick the same ones.
base=$((24800 + RANDOM % 2200))
cat > run.yaml <<YAML
run: {id: e2e, dir: $work/run, time_limit: 150s}
store: {listen: 127.0.0.1:$base}
orchestrator:
  listen: 127.0.0.1:$((base + 1))
  max_staleness: 4
  lease: 10s
  cluster_timeout: 3s
  max_in_flight: 128
  tick: 50ms
  max_wait: 2s
  compact_after: 64KiB
  tokens: {worker: w, trainer: t, admin: a}
regions:
  - {name: near, relay: 127.0.0.1:$((base + 2)), bandwidth: 50MB, latency: 2ms, workers: 2}
  - {name: far, relay: 127.0.0.1:$((base + 3)), bandwidth: 5MB, latency: 30ms, workers: 2}
worker: {capacity: 2, heartbeat: 300ms}
model: {d_model: 64, layers: 2, heads: 4, d_ff: 256}
task: {digits: 1}
trainer:
  threads: 1
  warmup: {steps: 30, batch: 16}
  steps: 150
  prompts_per_step: 8
  samples_per_prompt: 4
  eval_problems: 50
  keyframe_interval: 1000
  keyframe_budget: 1000    # no keyframe after v0: a worker joining later reads v0 from the relay cache
  delta_mode: context      # context-coded deltas: workers that fall behind squash them on their copy
  stall_after: 60s
  min_step_time: 100ms     # so that the run lasts long enough for what the test does to it
YAML

"$weft" run run.yaml > run.out 2>&1 &
run_pid=$!
# The step the trainer has reached (0 before the RL phase).
step() { jq -r '(.steps | length) // 0' run/trainer.json 2>/dev/null || echo 0; }
wait_step() {
  local target=$1
  for _ in $(seq 1 600); do
    [ "$(step)" -ge "$target" ] && return 0
    kill -0 $run_pid 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# This run's worker only (another run on the machine may have a worker of the same name).
worker_pid() { pgrep -f -- "--config $work/run.yaml --cluster $1 --region" | head -1; }

if wait_step 5; then ok; else fail "the run never reached step 5: $(tail -5 run.out)"; fi
# 1. kill -9 a worker; it is lost after cluster_timeout and its leases go to others.
victim=$(worker_pid near-1)
kill -9 "$victim" && ok || fail "no process for worker near-1"
killed_at=$SECONDS
# 2. A worker added by hand in the far region.
"$weft" worker --config run.yaml --cluster extra-1 --region far > extra-1.out 2>&1 &
extra1=$!
wait_step 20 || fail "the run stopped before step 20: $(tail -5 run.out)"
while [ $((SECONDS - killed_at)) -lt 4 ]; do sleep 0.2; done  # past cluster_timeout
# 3. Corrupt every blob in the near relay's cache, then add a worker there: its first pull reads
#    the keyframe of version 0 from that cache.
corrupted=0
for blob in $(find run/relays/near -type f -size +1k); do
  printf '\xff\xff\xff\xff' | dd of="$blob" bs=1 seek=100 conv=notrunc 2>/dev/null && corrupted=$((corrupted + 1))
done
[ "$corrupted" -gt 0 ] && ok || fail "no blob found in the near relay's cache"
"$weft" worker --config run.yaml --cluster extra-2 --region near > extra-2.out 2>&1 &
extra2=$!
wait_step 40 || fail "the run stopped before step 40: $(tail -5 run.out)"
# 4. kill -9 the orchestrator; weft run restarts it from its journal.
orchestrator=$(pgrep -f -- "orchestrator --config $work/run/orchestrator.yaml" | head -1)
kill -9 "$orchestrator" && ok || fail "no orchestrator process"
wait_step 80 || fail "the run stopped before step 80 after the orchestrator restart: $(tail -5 run.out)"
# 5. SIGTERM the hand-started workers: they drain and leave cleanly.
kill -TERM $extra1 $extra2
wait $extra1 && ok || fail "extra-1 did not exit cleanly on SIGTERM: $(tail -3 extra-1.out)"
wait $extra2 && ok || fail "extra-2 did not exit cleanly on SIGTERM: $(tail -3 extra-2.out)"
grep -q "worker extra-1 stopped" extra-1.out && ok || fail "extra-1 printed no summary: $(tail -3 extra-1.out)"

wait $run_pid && ok || fail "weft run failed: $(tail -20 run.out)"
report=run/report.json
check() {  # check 'jq expression' 'what it means'
  if [ "$(jq -r "$1" $report 2>/dev/null)" = true ]; then ok; else fail "$2 ($1)"; fi
}
check '.completed' "the run completed"
check '.steps == 150' "every step ran"
check '.digest_mismatches == 0' "no digest mismatches"
check '.staleness_violations == 0' "no staleness violations"
check '.restarts.orchestrator == 1' "the orchestrator was restarted once"
check '.orchestrator.jobs.given_up == 0' "no job was given up"
check '[.orchestrator.clusters[] | select(.id == "near-1") | .state] == ["gone"]' "the killed worker is gone"
check '.orchestrator.clusters_lost >= 1' "the killed worker was declared lost"
check '.orchestrator.jobs | .added == .done + .queued + .leased' "every job is done, queued or leased (none lost)"
check '[.orchestrator.clusters[] | select(.id == "extra-1") | .completed > 0 and .sync.first_version > 0] == [true]' \
  "extra-1 joined at a later version and completed jobs"
check '[.orchestrator.clusters[] | select(.id == "extra-2") | .completed > 0] == [true]' "extra-2 completed jobs"
check '.relays.near.corrupted >= 1' "the near relay found its corrupted blobs and fetched them again"
# Nothing acknowledged was lost: every accepted trajectory was delivered, dropped as stale (counted)
# or is still waiting, across the orchestrator's restart.
check '.orchestrator.trajectories | .accepted == .delivered_fresh + .delivered_stale + .dropped_stale + .buffered' \
  "every accepted trajectory is accounted for"
check '.orchestrator.jobs.done == .orchestrator.trajectories.accepted' "accepted submissions equal completed jobs"
grep -q "orchestrator killed by signal 9; restarting it" run.out && ok || fail "weft run did not report the restart: $(tail -5 run.out)"
grep -q "worker-near-1 killed by signal 9" run.out && ok || fail "weft run did not report the killed worker"
grep -q "corrupted" run/logs/relay-near.log && ok || fail "the relay did not log the corrupted copy"

# The simulator on the same shape agrees with this run within its tolerances (versions, staleness,
# WAN bytes per region; tests/sim/crosscheck.sh).
cat > sim-base.yaml <<YAML
name: e2e
duration: 10m
orchestrator: {max_staleness: 4, lease: 10s, cluster_timeout: 3s, max_in_flight: 128, tick: 50ms}
clusters: {heartbeat: 300ms}
regions:
  - {name: near, bandwidth: 50MB, latency: 2ms, clusters: 2, capacity: 2}
  - {name: far, bandwidth: 5MB, latency: 30ms, clusters: 2, capacity: 2}
YAML
if bash "$(dirname "${BASH_SOURCE[0]}")/../../tests/sim/crosscheck.sh" "$weft" $report sim-base.yaml 4 sim > crosscheck.out 2>&1; then
  ok
else
  fail "weft sim disagrees with the run: $(cat crosscheck.out)"
fi
cat crosscheck.out

if [ "$failed" -gt 0 ]; then
  echo "--- weft run's output"; grep -v '^\[' run.out | tail -30
  echo "--- the report"; jq 'del(.per_step)' $report 2>/dev/null | head -150
fi
echo "e2e: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
