#!/usr/bin/env bash
# End to end: a region partitioned from the orchestrator and its relay while a run goes on.
#
# Real processes of the weft binary on loopback: the store server, the orchestrator, a relay per
# region, two workers in region "near" (direct), two in region "far", and the example trainer. The
# far workers reach the orchestrator and their relay only through fault proxies
# (weft_fault_proxy). Once both far workers have completed jobs, the far region is black-holed
# (connections stay open, nothing goes through) for twice the orchestrator's cluster_timeout,
# then every connection to it is reset for a while, then it heals. Checked:
#   - the partition is real: both far clusters are declared lost while it lasts, the near ones are
#     not, and the run goes on without the far region;
#   - after it heals, each far worker is answered 404 as a lost cluster and registers again (a
#     second register event in the journal), is granted leases and has submissions accepted again,
#     and serves the latest version once the trainer is done;
#   - the run finishes (every step, no staleness violation, no digest mismatch);
#   - nothing acknowledged is lost or delivered twice: the submissions the workers were answered
#     "accepted" or "duplicate" for add up to the orchestrator's accepted count; the journal holds
#     exactly that many accepted submissions, each for a different job; every accepted group was
#     delivered to the trainer, dropped as stale (counted) or is still buffered; the trainer
#     received exactly the groups delivered; every job added is done, queued or leased;
#   - workers drain and exit cleanly on SIGTERM, and so do the proxies.
# Usage: partition_test.sh WEFT WEFT_FAULT_PROXY WORKDIR
set -uo pipefail
weft=$(realpath -- "$1") proxy=$(realpath -- "$2") work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$here/../test_lib.sh"
pids=()
trap 'for p in "${pids[@]}"; do kill -9 $p 2>/dev/null; done' EXIT
started=$SECONDS

# Fixed ports below the ephemeral range (32768 and up), where only listeners bind; the proxies take
# ephemeral ports and print them.
# Its own slice of ports, so that tests run in parallel (ctest -j2) never pick the same ones.
base=$((22400 + RANDOM % 2200))
store_port=$base orchestrator_port=$((base + 1)) near_relay=$((base + 2)) far_relay=$((base + 3))
cluster_timeout_s=3
steps=100
cat > run.yaml <<YAML
run: {id: partition, dir: $work/run, time_limit: 150s}
store: {listen: 127.0.0.1:$store_port}
orchestrator:
  listen: 127.0.0.1:$orchestrator_port
  max_staleness: 4
  stale_policy: drop
  lease: 10s
  cluster_timeout: ${cluster_timeout_s}s
  max_in_flight: 128
  tick: 50ms
  max_wait: 2s
  threads: 4
  tokens: {worker: w, trainer: t, admin: a}
regions:
  - {name: near, relay: 127.0.0.1:$near_relay, workers: 2}
  - {name: far, relay: 127.0.0.1:$far_relay, workers: 2}
worker: {capacity: 2, heartbeat: 200ms}
model: {d_model: 32, layers: 1, heads: 2, d_ff: 64}
task: {digits: 1}
trainer:
  threads: 1
  warmup: {steps: 20, batch: 16}
  steps: $steps
  prompts_per_step: 8
  samples_per_prompt: 4
  eval_problems: 20
  stall_after: 60s
  min_step_time: 200ms     # at most 5 steps a second: the run lasts well past the partition
YAML
{
  echo "orchestrator:"
  sed -n '/^orchestrator:/,/^regions:/p' run.yaml | sed '1d;$d'
  echo "  journal: $work/orchestrator.journal"
} > orchestrator.yaml
mkdir -p store

# start NAME COMMAND...: a process writing NAME.log, remembered for the cleanup.
start() {
  local name=$1; shift
  "$@" > $name.log 2>&1 &
  pids+=($!)
  eval "${name//-/_}_pid=$!"
}
# wait_log NAME PATTERN: waits (10 s at most) for PATTERN in NAME.log.
wait_log() {
  for _ in $(seq 200); do grep -q -- "$2" $1.log && return 0; sleep 0.05; done
  fail "$1 did not print '$2': $(tail -3 $1.log)"; return 1
}
# control PROXY COMMAND: switches a proxy's mode through its control port.
control() {
  local port answer
  port=$(sed -n 's/.* control [0-9.]*:\([0-9]*\) .*/\1/p' $1.log)
  exec 3<>/dev/tcp/127.0.0.1/$port && echo "$2" >&3 && read -r answer <&3
  exec 3<&-
  [[ $answer == ok* ]] && ok || fail "proxy $1 refused '$2': $answer"
}
proxy_port() { sed -n 's/^fault proxy: listen [0-9.]*:\([0-9]*\) .*/\1/p' $1.log; }
status() {
  curl -s -m 5 -H 'Authorization: Bearer a' http://127.0.0.1:$orchestrator_port/v1/status > status.json &&
    jq -e . status.json > /dev/null 2>&1
}
# field JQ: from the last status taken.
field() { jq -r "$1" status.json; }
# wait_until SECONDS JQ: takes the status until JQ holds (true), SECONDS at most.
wait_until() {
  local deadline=$((SECONDS + $1))
  while [ $SECONDS -lt $deadline ]; do
    status && [ "$(field "$2")" = true ] && return 0
    sleep 0.1
  done
  return 1
}
step() { jq -r '(.steps | length) // 0' trainer.json 2>/dev/null || echo 0; }
far='[.clusters[] | select(.region == "far")]'
near='[.clusters[] | select(.region == "near")]'

# --- Start everything --------------------------------------------------------------------------
start store "$weft" store serve --store store --listen 127.0.0.1:$store_port --threads 4
start orchestrator "$weft" orchestrator --config orchestrator.yaml
for region in near far; do
  port_var=${region}_relay
  start relay-$region "$weft" relay --upstream http://127.0.0.1:$store_port --cache relays/$region \
    --listen 127.0.0.1:${!port_var} --threads 8
done
wait_log store "on http://" && wait_log orchestrator "on http://" && wait_log relay-near "http://" &&
  wait_log relay-far "http://" || exit 1
start proxy-orchestrator "$proxy" --upstream 127.0.0.1:$orchestrator_port
start proxy-relay "$proxy" --upstream 127.0.0.1:$far_relay
wait_log proxy-orchestrator "^fault proxy: listen" && wait_log proxy-relay "^fault proxy: listen" || exit 1
for i in 1 2; do
  start worker-near-$i "$weft" worker --config run.yaml --cluster near-$i --region near
  start worker-far-$i "$weft" worker --config run.yaml --cluster far-$i --region far \
    --orchestrator http://127.0.0.1:$(proxy_port proxy-orchestrator) \
    --store http://127.0.0.1:$(proxy_port proxy-relay)
done
start trainer "$weft" train --config run.yaml --store store --progress trainer.json

# --- 1. Both regions at work ---------------------------------------------------------------------
# The far region's link has some latency of its own, so that leases, submissions and their answers
# are on the way when the partition starts.
control proxy-orchestrator "delay 150"
control proxy-relay "delay 50"
if wait_until 60 "($far | length == 2 and all(.completed > 0)) and ($near | all(.completed > 0))"; then ok
else fail "the far workers never completed jobs: $(jq -c "$far" status.json 2>/dev/null) $(tail -2 worker-far-1.log)"; fi
# ... a few versions in, preferably (5 s at most) at a moment when the far region holds leases.
while [ "$(step)" -lt 3 ] && kill -0 $trainer_pid 2>/dev/null; do sleep 0.1; done
wait_until 5 "$far | map(.leases) | add > 0" || echo "(the far region holds no lease as the partition starts)"

# --- 2. Partition: black hole for twice cluster_timeout, then resets -----------------------------
step_at_partition=$(step)
partitioned_at=$SECONDS
control proxy-orchestrator blackhole
control proxy-relay blackhole
if wait_until $((cluster_timeout_s * 3)) "$far | all(.state == \"gone\")"; then ok
else fail "the far clusters were not declared lost within $((cluster_timeout_s * 3)) s: $(jq -c "$far" status.json)"; fi
lost_at_partition=$(field .clusters_lost)
[ "$(field "$near | all(.state != \"gone\")")" = true ] && ok || fail "a near cluster was lost: $(jq -c "$near" status.json)"
while [ $((SECONDS - partitioned_at)) -lt $((2 * cluster_timeout_s)) ]; do sleep 0.1; done
control proxy-orchestrator reset
control proxy-relay reset
sleep 2
status && [ "$(field "$far | all(.state == \"gone\")")" = true ] && ok ||
  fail "a far cluster came back while its region was partitioned: $(jq -c "$far" status.json)"
[ "$(field .clusters_lost)" -ge 2 ] && ok || fail "clusters_lost is $(field .clusters_lost), expected 2 or more"
[ "$(step)" -gt "$step_at_partition" ] && ok ||
  fail "the run did not go on without the far region (step $(step), $step_at_partition at the partition)"

# --- 3. Heal: the far workers register again, take jobs and catch up ------------------------------
completed_at_heal=$(field "$far | map(.completed) | add")
control proxy-orchestrator "delay 150"
control proxy-relay "delay 50"
healed_at=$SECONDS
if wait_until 20 "$far | length == 2 and all(.state == \"ready\")"; then ok
else fail "the far clusters are not ready 20 s after the partition healed: $(jq -c "$far" status.json)"; fi
echo "partitioned $((healed_at - partitioned_at)) s from step $step_at_partition; ready again $((SECONDS - healed_at)) s after healing, at step $(step)"

# --- 4. The run finishes -----------------------------------------------------------------------
for _ in $(seq 1200); do kill -0 $trainer_pid 2>/dev/null || break; sleep 0.1; done
wait $trainer_pid && ok || fail "the trainer failed: $(tail -5 trainer.log)"
jq -e ".phase == \"done\" and (.steps | length) == $steps and .staleness_violations == 0" trainer.json > /dev/null &&
  ok || fail "the trainer did not finish every step within the bound: $(jq -c 'del(.steps)' trainer.json)"
# Every worker catches up to the last version (the partitioned ones too).
status
latest=$(field .latest_version)
[ "$latest" = "$steps" ] && ok || fail "the latest version is $latest, expected $steps"
if wait_until 20 ".latest_version as \$v | [.clusters[] | .ready_version == \$v] | length == 4 and all"; then ok
else fail "not every worker serves version $latest: $(jq -c '[.clusters[] | {id, ready_version, state}]' status.json)"; fi
[ "$(field "$far | map(.completed) | add")" -gt "$completed_at_heal" ] && ok ||
  fail "the far workers completed no job after the partition healed"

# --- 5. Workers drain; the final account -----------------------------------------------------------
for w in near-1 near-2 far-1 far-2; do
  pid_var=worker_${w//-/_}_pid
  kill -TERM ${!pid_var}
done
for w in near-1 near-2 far-1 far-2; do
  pid_var=worker_${w//-/_}_pid
  wait ${!pid_var} && ok || fail "worker $w did not exit cleanly on SIGTERM: $(tail -3 worker-$w.log)"
done
status || fail "no status from the orchestrator"
check() {  # check 'jq expression on the status' 'what it means'
  if [ "$(jq -r "$1" status.json 2>/dev/null)" = true ]; then ok; else fail "$2 ($1)"; fi
}
t='.trajectories'
check "$t | .accepted == .delivered_fresh + .delivered_stale + .dropped_stale + .buffered" \
  "every accepted trajectory was delivered, dropped as stale or is buffered"
check "$t.outstanding == 0" "the trainer acknowledged every batch"
check '.jobs | .added == .done + .queued + .leased + .given_up and .given_up == 0' \
  "every job added is done, queued or leased, none given up"
check ".jobs.done == $t.accepted" "each accepted trajectory completed one job"
check '[.clusters[] | .sync.digest_mismatches] | all(. == 0)' "no digest mismatch"
check "[.clusters[] | .state] | all(. == \"gone\")" "every worker left"
check ".clusters_lost == $lost_at_partition" "only the partition lost clusters"
accepted=$(field "$t.accepted")
echo "account: $(jq -c '{trajectories, leases, clusters_lost}' status.json)"
# Acknowledged to the workers ("accepted" or "duplicate" after a lost answer), by their summaries.
acknowledged=0
for w in near-1 near-2 far-1 far-2; do
  jobs=$(sed -n "s/^worker $w stopped: \([0-9]*\) jobs.*/\1/p" worker-$w.log)
  [ -n "$jobs" ] && acknowledged=$((acknowledged + jobs)) || fail "worker $w printed no summary"
done
[ "$acknowledged" = "$accepted" ] && ok ||
  fail "the workers were acknowledged $acknowledged submissions, the orchestrator accepted $accepted"
# The trainer received exactly the groups the orchestrator delivered (none twice).
received=$(jq '[.steps[].groups] | add' trainer.json)
delivered=$(field "$t | .delivered_fresh + .delivered_stale")
[ "$received" = "$delivered" ] && ok ||
  fail "the trainer received $received groups, the orchestrator delivered $delivered"

# --- 6. The journal: every accepted submission once, and the far workers' second registration -----
# The event line of every record (docs/formats.md, section 7: the magic, then per record a u32
# length, a u64 hash and the payload, whose first line is the event as JSON), one per line.
journal_events() {
  od -An -v -tu1 -w1 "$1" | LC_ALL=C awk '
    NR <= 8 { next }
    left == 0 {
      if (h < 4) length_ += $1 * 256 ^ h
      if (++h == 12) { left = length_; h = 0; length_ = 0; line = ""; first = 1 }
      next
    }
    first { if ($1 == 10) { print line; first = 0 } else line = line sprintf("%c", $1) }
    --left == 0 && first { print line }'
}
[ "$(field .journal.generation)" = 0 ] && ok || fail "the journal was compacted: its checks below see only part of it"
journal_events orchestrator.journal > events.jsonl
[ "$(jq -s length events.jsonl)" = "$(field .journal.records)" ] && ok ||
  fail "read $(wc -l < events.jsonl) events from the journal, the status counts $(field .journal.records) records"
jq -r 'select(.e == "submit") | "\(.job) \(.cluster) \(.attempt)"' events.jsonl > submits.txt
[ "$(wc -l < submits.txt)" = "$accepted" ] && ok ||
  fail "the journal holds $(wc -l < submits.txt) accepted submissions, the status counts $accepted"
twice=$(cut -d' ' -f1 submits.txt | sort | uniq -d | head -5 | tr '\n' ' ')
[ -z "$twice" ] && ok || fail "jobs accepted twice: $twice"
for w in far-1 far-2; do
  # The events of cluster w, in journal order: a second register, then a lease granted and a
  # submission accepted after it (not only a late one from before the partition).
  jq -r "select(.cluster == \"$w\") | .e" events.jsonl > events-$w.txt
  registers=$(grep -c '^register$' events-$w.txt)
  [ "$registers" -ge 2 ] && ok || fail "cluster $w registered $registers time(s), expected again after the partition"
  awk '/^register$/ { n++ } n >= 2 && /^leases$/ { leased = 1 } leased && /^submit$/ { done = 1 }
       END { exit !done }' events-$w.txt && ok ||
    fail "cluster $w had no lease granted and then a submission accepted after registering again"
  grep -q "is unknown to the orchestrator; registering again" worker-$w.log && ok ||
    fail "worker $w did not report registering again"
done

# --- 7. The infrastructure stops cleanly ----------------------------------------------------------
for p in proxy-orchestrator proxy-relay; do
  pid_var=${p//-/_}_pid
  kill -TERM ${!pid_var}
  wait ${!pid_var} && ok || fail "$p did not exit cleanly on SIGTERM"
done
kill -TERM $orchestrator_pid $relay_near_pid $relay_far_pid $store_pid
wait $orchestrator_pid $relay_near_pid $relay_far_pid $store_pid 2>/dev/null

if [ "$failed" -gt 0 ]; then
  echo "--- status"; jq -c 'del(.clusters)' status.json 2>/dev/null
  jq -c '.clusters[] | {id, state, ready_version, completed}' status.json 2>/dev/null
  for w in far-1 far-2; do echo "--- worker $w"; grep -v 'pulled version\|serves version' worker-$w.log | tail -8; done
  echo "--- proxies"; cat proxy-orchestrator.log proxy-relay.log
fi
echo "partition e2e: $passed passed, $failed failed, $((SECONDS - started)) s"
[ "$failed" -eq 0 ]
