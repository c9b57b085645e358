#!/usr/bin/env bash
# A deployment through a real Slurm (a single-node cluster of Debian's slurmctld, slurmd and munge
# started here by tests/slurm/slurm.sh; ./test.sh installs the packages):
#   1. configs that cannot be deployed are refused naming the key (no partition for a region, GPUs
#      asked where none are declared, the journal on node-local storage, a Kubernetes key);
#   2. `weft deploy slurm --submit` starts the orchestrator, the store server, a relay per region
#      (three partitions: the services', us-east's and eu-west's), job arrays of workers with the
#      embedded engine, and the built-in trainer, each job waiting for the addresses it needs;
#   3. mid-run, it grows us-east by an array of two tasks (timing each from sbatch to serving the
#      current version), cancels a task (it must drain: hand back its leases and deregister; its
#      drain is timed), requeues another (it comes back, catches up and serves again), sends a
#      third the signal Slurm sends ahead of a time limit (it drains and requeues itself), and
#      requeues the orchestrator (it replays its journal; the workers and the trainer ride it out);
#   4. the run completes: every job done, 0 digest mismatches, 0 staleness violations, no cluster
#      lost, and every trajectory the orchestrator acknowledged delivered to the trainer (or
#      counted as dropped for staleness); stop.sh then ends every job, the workers draining.
# Prints FIGURE lines: the seconds from sbatch to a new task serving the current version, and a
# cancelled task's drain.
#   5. a serving engine (the SGLang test server) started by each worker's job from deploy.engine:
#      the run completes and stopping the job stops the replica;
#   6. a trainer of two ranks through srun, each told its rank, the world size, the first node and
#      the channel.
# Usage: slurm_test.sh WEFT WEFT_FAKE_ENGINE WORKDIR
set -uo pipefail
weft=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
fake=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
slurm="$here/../slurm/slurm.sh"
# The deployment's directory must be on storage weft deploy takes for shared (not under /tmp): on
# this one node every directory is shared, but the check cannot know that.
case "$work" in
  /tmp/* | /var/tmp/* | /dev/shm/* | /run/*) work=/var/lib/weft-tests/slurm-$$ ;;
esac
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$here/../test_lib.sh"
pids=()
# Its own slice, 15000-16999: slurmctld and slurmd, then the orchestrator, store and relays.
port=$((15000 + (RANDOM % 190) * 10))
cleanup() {
  bash "$slurm" stop "$work/cluster" > /dev/null 2>&1
  [[ $work == /var/lib/weft-tests/* ]] && rm -rf "$work"
}
trap cleanup EXIT

if ! command -v sbatch > /dev/null || ! command -v slurmctld > /dev/null; then
  echo "FAIL: Slurm is not installed (./test.sh installs it: bash tests/slurm/slurm.sh install)"
  exit 1
fi
SLURM_OWNER_PID=$$ bash "$slurm" start "$work/cluster" $port services east west ||
  { echo "FAIL: Slurm did not start"; exit 1; }
source "$work/cluster/env"
# The services publish $(hostname) as their address; where it does not resolve, 127.0.0.1 (the
# jobs get this environment from sbatch).
getent hosts "$(hostname)" > /dev/null || export WEFT_ADVERTISE_HOST=127.0.0.1
shared=$work/shared
admin=slurm-admin-token

cat > base.yaml <<EOF
run: {id: slurmtest, time_limit: 10m}
store: {listen: 127.0.0.1:$((port + 3))}
orchestrator:
  listen: 127.0.0.1:$((port + 2))
  max_staleness: 4
  lease: 20s
  cluster_timeout: 15s
  max_in_flight: 256
  tokens: {worker: slurm-worker-token, trainer: slurm-trainer-token, admin: $admin}
regions:
  - {name: us-east, relay: 127.0.0.1:$((port + 4)), workers: 2}
  - {name: eu-west, relay: 127.0.0.1:$((port + 5)), workers: 1}
worker: {engine: embedded, capacity: 2, heartbeat: 500ms}
model: {d_model: 32, layers: 1, heads: 2, d_ff: 64}
task: {kind: arithmetic, digits: 1}
trainer:
  warmup: {steps: 50}
  steps: 70
  prompts_per_step: 8
  samples_per_prompt: 4
  eval_problems: 50
  min_step_time: 1s
  stall_after: 120s
EOF
deploy_section() {  # deploy_section DIR [EXTRA_WORKER_KEYS]: the deploy: section
  cat <<EOF
deploy:
  slurm:
    dir: $1
    partitions:
      services: {}
      east: {region: us-east}
      west: {region: eu-west}
    orchestrator: {partition: services}
    store: {partition: services}
    trainer: {partition: services}
    workers: {drain: 20s, time: "30:00"${2:-}}
EOF
}
{ cat base.yaml; deploy_section "$shared"; } > deploy.yaml

# 1. Refused configs.
{ cat base.yaml; deploy_section "$shared" | grep -v 'west:'; } > no-partition.yaml
expect_error "region 'eu-west' has nowhere to run: no partition of deploy.slurm.partitions" \
  "$weft" deploy slurm no-partition.yaml --check
{ cat base.yaml; deploy_section "$shared" ", gpus: 4"; } > gpus.yaml
expect_error "deploy.slurm.workers.gpus: 4 GPUs per worker, but partition east" \
  "$weft" deploy slurm gpus.yaml --check
{ cat base.yaml; deploy_section /tmp/weft-journal; } > local.yaml
expect_error "deploy.slurm.dir: /tmp/weft-journal is node-local storage" \
  "$weft" deploy slurm local.yaml --check
{ cat base.yaml; deploy_section "$shared" ", node_selector: {a: b}"; } > foreign.yaml
expect_error "deploy.slurm.workers.node_selector (line [0-9]*): a Kubernetes setting" \
  "$weft" deploy slurm foreign.yaml --check
expect_error "no deploy.kubernetes section" "$weft" deploy kubernetes deploy.yaml --check
{ cat base.yaml; deploy_section "$shared" | sed 's/time: "30:00"/time: "2-xx"/'; } > time.yaml
expect_error "deploy.slurm.workers.time: '2-xx' is not a Slurm time limit" "$weft" deploy slurm time.yaml --check
{ cat base.yaml; deploy_section "$shared" | sed 's/drain: 20s/drain: 40m/'; } > drain.yaml
expect_error "deploy.slurm.workers.drain (2400 s) must be shorter than the time limit" \
  "$weft" deploy slurm drain.yaml --check
{ cat base.yaml; deploy_section "$shared" | sed 's/trainer: {partition: services}/trainer: {partition: gpu, nodes: 2}/'; } > trainer.yaml
expect_error "deploy.slurm.trainer.partition: 'gpu' is not in deploy.slurm.partitions" \
  "$weft" deploy slurm trainer.yaml --check
{ cat base.yaml; deploy_section "$shared" | sed 's/trainer: {partition: services}/trainer: {partition: services, nodes: 2}/'; } > ranks.yaml
expect_error "deploy.slurm.trainer: the built-in trainer runs as one process" \
  "$weft" deploy slurm ranks.yaml --check
expect_ok "$weft" deploy slurm deploy.yaml --check
[ ! -e "$shared" ] && ok || fail "--check wrote $shared"
# A worker started before its orchestrator answers waits, backing off and saying so; stopped
# meanwhile, it leaves having never registered.
# It needs its own token alone (a worker's config need not hold the others'), in the file or its
# environment.
grep -v 'tokens:' deploy.yaml > no-tokens.yaml
expect_error "orchestrator.tokens.worker is needed (in the file or WEFT_WORKER_TOKEN)" \
  "$weft" worker --config no-tokens.yaml --cluster early-1 --region us-east
expect_error "orchestrator.tokens.worker is needed" "$weft" run no-tokens.yaml
WEFT_WORKER_TOKEN=early-worker-token timeout --preserve-status -s TERM 4 "$weft" worker --config no-tokens.yaml --cluster early-1 \
  --region us-east --orchestrator "http://127.0.0.1:$((port + 12))" \
  --store "http://127.0.0.1:$((port + 13))" > early.txt 2>&1 && ok || fail "the early worker did not exit 0: $(cat early.txt)"
grep -q "does not answer yet .*; trying again in 1 s" early.txt && grep -q "trying again in 2 s" early.txt &&
  grep -q "stopped before the orchestrator answered; it never registered" early.txt && ok ||
  fail "the early worker's log: $(cat early.txt)"

# 2. The deployment, submitted.
status() { curl -sf -m 5 -H "Authorization: Bearer $admin" "http://127.0.0.1:$((port + 2))/v1/status"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# wait_for SECONDS 'jq expression on the status page' WHAT: polls until the expression is true.
wait_for() {
  local deadline=$((SECONDS + $1))
  until [ "$(status | jq -r "$2" 2> /dev/null)" = true ]; do
    if ((SECONDS >= deadline)); then
      fail "waited $1 s for $3 ($2)"
      return 1
    fi
    sleep 0.2
  done
  return 0
}
diagnose() {
  echo "--- squeue"; squeue
  echo "--- status"; status | jq -c 'del(.regions)' | head -c 3000; echo
  for f in "$shared"/logs/*.log; do echo "--- $f"; tail -n 15 "$f"; done
  echo "--- slurmctld"; tail -n 40 "$work/cluster/log/slurmctld.log"
  exit 1
}
expect_ok "$weft" deploy slurm deploy.yaml --submit
cat out.txt
job_of() { awk -v n="$1" '$1 == n { print $2 }' "$shared/slurm/jobs"; }
# The files holding tokens are their owner's alone; the scripts are executable.
[ "$(stat -c %a "$shared/slurm/config.yaml" "$shared/slurm/orchestrator.yaml" "$shared/slurm/trainer.token" "$shared/slurm/submit.sh" | tr '\n' ' ')" = "600 600 600 755 " ] && ok ||
  fail "the deployment's file modes: $(stat -c '%n %a' "$shared"/slurm/*)"
east=$(job_of workers-us-east) trainer=$(job_of trainer) orchestrator=$(job_of orchestrator)
[ -n "$east" ] && [ -n "$trainer" ] && [ -n "$orchestrator" ] && ok || { fail "no job IDs in $shared/slurm/jobs"; diagnose; }
# Three workers ready and the RL phase under way.
wait_for 120 '([.clusters[] | select(.state == "ready")] | length) == 3 and .latest_version >= 3' \
  "three ready workers and version 3" || diagnose

# 3a. Grow us-east by two tasks: from sbatch to each serving the version current then.
grown_at=$(now)
grown=$(sbatch --parsable --array=2-3 "$shared/slurm/workers-us-east.sbatch") || fail "sbatch --array=2-3 failed"
grown=${grown%%;*}
declare -A serving
for _ in $(seq 600); do
  page=$(status) || { sleep 0.1; continue; }
  for task in 2 3; do
    [ -n "${serving[$task]:-}" ] && continue
    if [ "$(jq -r --arg c "us-east-$grown-$task" '(.latest_version) as $v | any(.clusters[]; .id == $c and .state == "ready" and .ready_version == $v)' <<< "$page")" = true ]; then
      serving[$task]=$(since "$grown_at")
    fi
  done
  [ -n "${serving[2]:-}" ] && [ -n "${serving[3]:-}" ] && break
  sleep 0.1
done
if [ -n "${serving[2]:-}" ] && [ -n "${serving[3]:-}" ]; then
  ok
  echo "FIGURE sbatch to a new array task serving the current version: ${serving[2]} s and ${serving[3]} s"
else
  fail "the tasks of array $grown did not serve the current version within 60 s"; diagnose
fi

# 3b. Cancel a task: it drains (hands back its leases, deregisters) before Slurm's KillWait.
cancelled=us-east-$east-1
cancelled_at=$(now)
scancel "${east}_1"
wait_for 40 "any(.clusters[]; .id == \"$cancelled\" and .state == \"gone\")" "$cancelled to deregister" || diagnose
[ "$(status | jq '.clusters_lost')" = 0 ] && ok || fail "$cancelled was lost, not deregistered"
deregistered=$(since "$cancelled_at")
until [ -z "$(squeue -h -j "${east}_1" -o %T 2> /dev/null)" ]; do sleep 0.1; done
ended=$(since "$cancelled_at")
echo "FIGURE drain of a cancelled task: deregistered ${deregistered} s after scancel, its job ended after ${ended} s"
log=$shared/logs/workers-us-east-${east}_1.log
grep -q "SIGTERM: draining $cancelled" "$log" && grep -q "worker $cancelled stopped:" "$log" &&
  grep -q "worker $cancelled exited with status 0" "$log" && ok ||
  fail "$cancelled did not drain and exit 0: $(tail -n 5 "$log")"

# restart_requeued JOB: once JOB (just requeued) has stopped, lets it start again at once (not
# after Slurm's two-minute hold); false if it is not running again within 60 s.
restart_requeued() {
  local deadline=$((SECONDS + 60)) state
  # First the requeue must have taken effect (the job no longer running), then it may start.
  while [ "$(squeue -h -j "$1" -o %T 2> /dev/null)" = RUNNING ]; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
  # Not in the second its last run ended: slurmd refuses to start a job again in the same second
  # it was killed ("Job credential revoked"), which is why Slurm holds requeued jobs a while.
  local pending_since=""
  while ((SECONDS < deadline)); do
    state=$(squeue -h -j "$1" -o %T 2> /dev/null)
    [ "$state" = RUNNING ] && return 0
    if [ "$state" = PENDING ]; then
      [ -n "$pending_since" ] || pending_since=$SECONDS
      ((SECONDS - pending_since >= 2)) && scontrol update JobId="$1" StartTime=now > /dev/null 2>&1
    fi
    sleep 0.1
  done
  echo "restart_requeued $1: state '$state' after 60 s"
  return 1
}
requeue_now() { scontrol requeue "$1" && restart_requeued "$1"; }

# 3c. Requeue a task: it drains, and comes back (without Slurm's two-minute requeue hold) to
# catch up and serve again under the same name.
requeued=us-east-$east-0
requeue_now "${east}_0" && ok || { fail "${east}_0 did not run again after its requeue"; diagnose; }
wait_for 60 "(.latest_version) as \$v | any(.clusters[]; .id == \"$requeued\" and .state == \"ready\" and .ready_version == \$v)" \
  "$requeued to serve again after its requeue" || diagnose
grep -q "worker $requeued on .* (restart 1)" "$shared/logs/workers-us-east-${east}_0.log" && ok ||
  fail "no restart of $requeued in its log"

# 3d. The signal Slurm sends `drain` seconds before a task's time limit (SIGUSR1 to the job
# script, sent here by hand): the worker drains, and the task requeues itself to come back.
timed=us-east-$grown-3
scancel --batch --signal=USR1 "${grown}_3"
log=$shared/logs/workers-us-east-${grown}_3.log
for _ in $(seq 300); do grep -q "requeueing $timed" "$log" 2> /dev/null && break; sleep 0.1; done
grep -q "the time limit is near: draining $timed" "$log" && grep -q "requeueing $timed" "$log" && ok ||
  fail "$timed did not drain and requeue itself on SIGUSR1: $(tail -n 5 "$log")"
restart_requeued "${grown}_3" && ok || { fail "${grown}_3 did not run again after requeueing itself"; diagnose; }
wait_for 60 "(.latest_version) as \$v | any(.clusters[]; .id == \"$timed\" and .state == \"ready\" and .ready_version == \$v)" \
  "$timed to serve again after requeueing itself" || diagnose

# 3e. Requeue the orchestrator: it replays its journal on start; workers and trainer ride it out.
before=$(status | jq '.jobs.added')
requeue_now "$orchestrator" && ok || { fail "the orchestrator did not run again after its requeue"; diagnose; }
wait_for 60 ".jobs.added >= $before" "the requeued orchestrator to answer with its journal replayed" || diagnose
grep -q "events replayed" "$shared/logs/orchestrator-$orchestrator.log" &&
  [ "$(grep -c 'events replayed' "$shared/logs/orchestrator-$orchestrator.log")" -ge 2 ] && ok ||
  fail "the orchestrator's log shows no second start"

# 4. The run completes.
deadline=$((SECONDS + 240))
until [ -z "$(squeue -h -j "$trainer" -o %T 2> /dev/null)" ]; do
  ((SECONDS < deadline)) || { fail "the trainer did not finish within 240 s"; diagnose; }
  sleep 1
done
progress=$shared/trainer.json
[ "$(jq -r '.phase' "$progress")" = done ] && [ "$(jq -r '.steps | length' "$progress")" = 70 ] && ok ||
  { fail "the trainer did not finish its 70 steps: $(head -c 400 "$progress")"; tail -n 20 "$shared"/logs/trainer-*.log; }
[ "$(jq -r '.staleness_violations' "$progress")" = 0 ] && ok || fail "staleness violations"
final=$(status)
check() {  # check 'jq expression on the final status' 'what it means'
  if [ "$(jq -r "$1" <<< "$final" 2> /dev/null)" = true ]; then ok; else fail "$2 ($1)"; fi
}
check '[.regions[].sync.digest_mismatches] | add == 0' "0 digest mismatches"
check '.clusters_lost == 0' "no cluster lost (the cancelled and requeued ones drained)"
check '.jobs.given_up == 0' "no job given up"
check '.trajectories.accepted == .trajectories.delivered_fresh + .trajectories.delivered_stale + .trajectories.dropped_stale + .trajectories.buffered' \
  "every acknowledged trajectory delivered or counted as stale"
check '.trajectories.accepted >= 560' "the trainer's 70 steps of 8 groups acknowledged"
check '.leases.handed_back >= 0 and ([.clusters[] | select(.id | startswith("us-east-'"$grown"'"))] | length) == 2' \
  "the grown tasks registered"
echo "final: $(jq -c '{jobs, leases, trajectories, clusters_lost, latest_version}' <<< "$final")"

# stop.sh: every job ends, the workers draining.
timeout 120 bash "$shared/slurm/stop.sh" > stop.txt 2>&1 && ok || fail "stop.sh: $(cat stop.txt)"
[ -z "$(squeue -h -o %i)" ] && ok || fail "jobs left after stop.sh: $(squeue)"
for log in "$shared"/logs/workers-*.log; do
  grep -q "exited with status 0" "$log" || fail "$log: the worker did not exit 0: $(tail -n 3 "$log")"
done

# 5. A serving engine started by each worker's job (deploy.engine; the SGLang test server on the
# CPU): the worker drives the replica its job started, the run completes, and stopping the job
# stops the replica too.
"$fake" init --dir "$work/launch" --d-model 32 --layers 1 --heads 2 --d-ff 64 --max-seq 9 \
  --dtype bf16 > init.out 2>&1 || fail "writing the launch model failed: $(cat init.out)"
engine_dir=$work/engine-shared
engine_port=$((port + 20))
cat > engine.yaml <<YAML
run: {id: slurmengine, time_limit: 5m}
store: {listen: 127.0.0.1:$((port + 7))}
orchestrator:
  listen: 127.0.0.1:$((port + 6))
  max_staleness: 4
  lease: 20s
  cluster_timeout: 15s
  tokens: {worker: engine-worker-token, trainer: engine-trainer-token, admin: $admin}
regions:
  - {name: us-east, relay: 127.0.0.1:$((port + 8)), workers: 1}
worker: {engine: sglang, capacity: 2, heartbeat: 500ms}
engine: {checkpoint_dir: "$work/served/{cluster}", pause: abort, health_interval: 200ms}
model: {d_model: 32, layers: 1, heads: 2, d_ff: 64, context: 9}
task: {kind: arithmetic, digits: 1}
trainer:
  warmup: {steps: 30}
  steps: 15
  prompts_per_step: 8
  samples_per_prompt: 4
  eval_problems: 20
  min_step_time: 300ms
deploy:
  engine:
    command: [$fake, serve, --api, sglang, --model-path, $work/launch, --host, 127.0.0.1,
              --port, "{port}"]
    gpus: 0
    port: $engine_port
  slurm:
    dir: $engine_dir
    partitions: {services: {}, east: {region: us-east}}
    orchestrator: {partition: services}
    store: {partition: services}
    trainer: {partition: services}
    workers: {drain: 20s}
YAML
status() { curl -sf -m 5 -H "Authorization: Bearer $admin" "http://127.0.0.1:$((port + 6))/v1/status"; }
shared=$engine_dir
expect_ok "$weft" deploy slurm engine.yaml --submit
trainer=$(job_of trainer)
deadline=$((SECONDS + 180))
until [ -z "$(squeue -h -j "$trainer" -o %T 2> /dev/null)" ]; do
  ((SECONDS < deadline)) || { fail "the engine deployment's trainer did not finish within 180 s"; diagnose; }
  sleep 1
done
[ "$(jq -r '.phase' "$engine_dir/trainer.json")" = done ] && ok ||
  { fail "the engine deployment did not finish: $(head -c 300 "$engine_dir/trainer.json")"; diagnose; }
final=$(status)
check '[.regions[].sync.digest_mismatches] | add == 0' "0 digest mismatches with the engine"
check "[.clusters[].sync.replicas[]?.url] | any(startswith(\"http://127.0.0.1:\"))" \
  "the worker drove the replica its job started"
engine_log=$(ls "$engine_dir"/logs/engine-*.log 2> /dev/null | head -n 1)
[ -n "$engine_log" ] && ok || fail "no engine log in $engine_dir/logs"
timeout 120 bash "$engine_dir/slurm/stop.sh" > stop.txt 2>&1 && ok || fail "stop.sh: $(cat stop.txt)"
sleep 1
if pgrep -f "model-path $work/launch" > /dev/null; then
  fail "an engine replica outlived its job: $(pgrep -af "model-path $work/launch")"
else
  ok
fi

# 6. A trainer of several ranks (trainer.command: here a script that records what each rank is
# told): srun starts them all, each with its rank and the world size for a sharded publisher, the
# first node's address for torch.distributed, and the channel (the orchestrator's address and the
# trainer token). A region of 0 workers submits no array.
ranks_dir=$work/ranks-shared
cat > ranks.yaml <<YAML
run: {id: slurmranks, time_limit: 5m}
store: {listen: 127.0.0.1:$((port + 10))}
orchestrator:
  listen: 127.0.0.1:$((port + 9))
  tokens: {worker: ranks-worker-token, trainer: ranks-trainer-token, admin: $admin}
regions:
  - {name: us-east, relay: 127.0.0.1:$((port + 11)), workers: 0}
trainer:
  command: [bash, -c, 'echo "\$WEFT_RANK \$WEFT_WORLD \$LOCAL_RANK \$MASTER_ADDR \$WEFT_ORCHESTRATOR \$WEFT_TRAINER_TOKEN" > "\$WEFT_RUN_DIR/rank-\$WEFT_RANK"']
deploy:
  slurm:
    dir: $ranks_dir
    partitions: {services: {}, east: {region: us-east}}
    orchestrator: {partition: services}
    store: {partition: services}
    trainer: {partition: services, tasks_per_node: 2}
YAML
expect_ok "$weft" deploy slurm ranks.yaml --submit
grep -q workers-us-east "$ranks_dir/slurm/jobs" && fail "an array of 0 workers was submitted" || ok
trainer=$(awk '$1 == "trainer" { print $2 }' "$ranks_dir/slurm/jobs")
for _ in $(seq 300); do [ -z "$(squeue -h -j "$trainer" -o %T 2> /dev/null)" ] && break; sleep 0.1; done
orchestrator_url=$(cat "$ranks_dir/addresses/orchestrator")
for rank in 0 1; do
  got=$(cat "$ranks_dir/rank-$rank" 2> /dev/null)
  [ "$got" = "$rank 2 $rank $(hostname) $orchestrator_url ranks-trainer-token" ] && ok ||
    fail "rank $rank was told '$got'"
done
timeout 60 bash "$ranks_dir/slurm/stop.sh" > stop.txt 2>&1 && ok || fail "stop.sh: $(cat stop.txt)"

echo "slurm e2e: $passed passed, $failed failed"
[ $failed -eq 0 ]
