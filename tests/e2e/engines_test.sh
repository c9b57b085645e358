#!/usr/bin/env bash
# End to end: `weft run` whose workers drive serving engines over HTTP, once with the SGLang API
# and once with the vLLM API (tests/engines: test servers of each API over the example policy),
# two engine replicas per worker.
#   - training still learns: the reward rises;
#   - every version reaches every replica through one download per worker: 0 digest mismatches,
#     0 staleness violations, and each replica reports loading every version it was given;
#   - one replica dies mid-run (every connection closed, its port closed for 2 s) and comes back
#     with its launch weights: its worker goes on with the other replica, then loads the current
#     version into it;
#   - measured (printed): the weight-update pause per replica, and the time from a version's
#     publication (its manifest written) to all replicas of a worker serving it.
#   - weft run's SIGTERM drains each worker (its summary line printed), and no replica is left
#     paused;
#   - on-policy distillation with the teacher on an engine of its own: every group learnt from is
#     scored through that engine's API;
# The SGLang run keeps each worker's copy of the weights in the served checkpoint file
# (engine.copy: file, the default), the vLLM run in host memory (engine.copy: memory).
# Usage: engines_test.sh WEFT WEFT_FAKE_ENGINE WORKDIR
set -uo pipefail
weft=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
fake=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
work=$(pwd)
source "$here/../test_lib.sh"

# Fixed ports below the ephemeral range (32768 and up), where only listeners bind.
# Its own slice of ports, so that tests run in parallel (ctest -j2) never pick the same ones.
base=$((20000 + RANDOM % 2000))  # up to base + 311
declare -A servers  # port -> pid of the test server listening there
cleanup() { for pid in "${servers[@]}"; do kill "$pid" 2> /dev/null; done; }
trap cleanup EXIT

# serve API PORT LOG: one test server over the launch model, in the background.
serve() {
  "$fake" serve --api "$1" --model-path "$work/launch" --port "$2" > "$3" 2>&1 &
  servers[$2]=$!
  for _ in $(seq 100); do grep -q "listening on" "$3" && return 0; sleep 0.1; done
  fail "the $1 test server on port $2 did not start: $(cat "$3")"
}

# The launch model: the example policy's architecture at the run's sizes, freshly initialised; the
# engines start from it. Digits 1 gives prompts of 5 tokens and answers of 3; SGLang refuses a
# request that fills its context, so the model has one position more (model.context: 9).
"$fake" init --dir "$work/launch" --d-model 32 --layers 2 --heads 2 --d-ff 128 --max-seq 9 \
  --dtype bf16 > init.out 2>&1 || fail "writing the launch model failed: $(cat init.out)"

# The store and orchestrator sections of a run on ports B and B + 1.
services() {  # services B
  cat <<YAML
store: {listen: 127.0.0.1:$1}
orchestrator:
  listen: 127.0.0.1:$(($1 + 1))
  max_staleness: 4
  lease: 20s
  cluster_timeout: 5s
  max_in_flight: 128
  tick: 50ms
  max_wait: 2s
  tokens: {worker: w, trainer: t, admin: a}
YAML
}

run_api() {  # run_api API PORT_BASE COPY (engine.copy: where each worker keeps its copy)
  local api=$1 b=$2 copy=$3
  local urls=()
  for i in 0 1 2 3; do
    serve "$api" $((b + 10 + i)) "$work/$api-engine-$i.log"
    urls+=("http://127.0.0.1:$((b + 10 + i))")
  done
  cat > "$api.yaml" <<YAML
run: {id: engines-$api, dir: $work/$api-run, time_limit: 240s}
$(services $b)
regions:
  - name: near
    relay: 127.0.0.1:$((b + 2))
    bandwidth: 50MB
    latency: 2ms
    workers: 2
    worker_engines: [[${urls[0]}, ${urls[1]}], [${urls[2]}, ${urls[3]}]]
worker: {engine: $api, capacity: 2, heartbeat: 300ms}
engine:
  checkpoint_dir: $work/$api-served/{cluster}
  copy: $copy
  pause: abort
  max_paused: 1
  health_interval: 200ms
  request_timeout: 60s
model: {d_model: 32, layers: 2, heads: 2, d_ff: 128, context: 9}
task: {kind: arithmetic, digits: 1}
trainer:
  threads: 1
  seed: 3
  warmup: {steps: 150, batch: 32, learning_rate: 3e-3}
  steps: 60
  min_step_time: 200ms     # long enough for a replica to die and come back mid-run
  prompts_per_step: 16
  samples_per_prompt: 8
  learning_rate: 1e-4
  eval_problems: 100
  stall_after: 60s
YAML
  "$weft" run "$api.yaml" > "$api-run.out" 2>&1 &
  local run_pid=$!
  # Mid-run, one replica of the first worker dies and comes back two seconds later.
  local step=0
  for _ in $(seq 600); do
    step=$(jq -r '(.steps | length) // 0' "$work/$api-run/trainer.json" 2> /dev/null || echo 0)
    [ "${step:-0}" -ge 10 ] && break
    kill -0 $run_pid 2> /dev/null || break
    sleep 0.2
  done
  local logs=$work/$api-run/logs
  local before
  before=$(grep -c "engine replica ${urls[1]} serves version" "$logs/worker-near-1.log")
  # The test server's restart: every connection closes, the port stays closed for 2 s, and the
  # engine comes back as launched (its launch weights and version).
  /usr/bin/python3 -c "import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=b'{\"down_ms\": 2000}', method='POST'), timeout=10)" \
    "${urls[1]}/_test/restart" || fail "$api: restarting the replica at ${urls[1]} failed"
  wait $run_pid
  local rc=$?
  [ $rc -eq 0 ] && ok || fail "$api: weft run exited $rc: $(tail -20 "$api-run.out")"

  local report=$work/$api-run/report.json
  check() {  # check 'jq expression' 'what it means'
    if [ "$(jq -r "$1" "$report" 2> /dev/null)" = true ]; then ok; else fail "$api: $2 ($1)"; fi
  }
  check '.completed' "the run completed"
  check '.steps == 60' "every step ran"
  # Each worker kept its copy where engine.copy says.
  local where="in the served checkpoint file"
  [ "$copy" = memory ] && where="in host memory"
  [ "$(grep -l "its copy $where" "$logs"/worker-*.log | wc -l)" -eq 2 ] && ok ||
    fail "$api: the workers do not say their copy is $where"
  check '.digest_mismatches == 0' "no digest mismatches"
  check '.staleness_violations == 0' "no staleness violations"
  check '.final_reward > .initial_reward' "the reward rose"
  # Every completion had the room it asked for (a cut one cannot reach its stop token).
  ! grep -h "completions are cut short" "$logs"/worker-*.log && ok ||
    fail "$api: the engines' context cut completions short"
  check '.orchestrator.jobs.given_up == 0' "no job was given up"
  # The replica that came back (with its launch weights) was loaded with the current version.
  local after
  after=$(grep -c "engine replica ${urls[1]} serves version\|replica ${urls[1]} is back; loaded" "$logs/worker-near-1.log")
  [ "$after" -gt "$before" ] && ok ||
    fail "$api: the restarted replica was not loaded again: $(grep -i "replica ${urls[1]}" "$logs/worker-near-1.log" | tail -3)"
  # weft run stops its workers with SIGTERM: each drains (hands back what it holds, deregisters,
  # finishes a load under way) rather than dying, and leaves no replica paused.
  for w in 1 2; do
    grep -q "^worker near-$w stopped: " "$logs/worker-near-$w.log" && ok ||
      fail "$api: worker near-$w did not drain on SIGTERM: $(tail -3 "$logs/worker-near-$w.log")"
  done
  for url in "${urls[@]}"; do
    local state=""
    for _ in $(seq 30); do  # (a replica the test restarted may still be rebinding its port)
      state=$(curl -s --max-time 2 "$url/_test/state") && [ -n "$state" ] && break
      sleep 0.2
    done
    local paused
    paused=$(jq -r .paused <<< "$state")
    [ "$paused" = false ] && ok ||
      fail "$api: replica $url left paused after the run (state: ${state:-unreachable})"
  done
  # One download per worker and version, loaded into each of its replicas (but the one killed,
  # which misses the versions published while it was down).
  for w in 1 2; do
    local pulls
    pulls=$(grep -c "pulled version" "$logs/worker-near-$w.log")
    [ "$pulls" -ge 5 ] && ok || fail "$api: worker $w pulled only $pulls versions"
    for r in 0 1; do
      local url=${urls[$((2 * (w - 1) + r))]} loads
      loads=$(grep -c "engine replica $url serves version" "$logs/worker-near-$w.log")
      if [ "$w$r" = 11 ]; then
        [ "$loads" -ge 2 ] && ok || fail "$api: the killed replica $url loaded $loads versions"
      else
        [ "$loads" -eq "$pulls" ] && ok || fail "$api: replica $url loaded $loads versions; worker $w pulled $pulls"
      fi
    done
  done
  # The measurements: pause per replica load, and publication to all of a worker's replicas.
  /usr/bin/python3 - "$work/$api-run" "engines-$api" "$api" <<'PY' | tee -a "$work/measurements.txt"
import os, re, statistics, sys, datetime
run, run_id, api = sys.argv[1:4]
pauses = {}
served = {}
for name in sorted(os.listdir(f"{run}/logs")):
    if not name.startswith("worker-"):
        continue
    for line in open(f"{run}/logs/{name}", errors="replace"):
        m = re.match(r"\S (\d\d):(\d\d):(\d\d\.\d+) .*engine replica (\S+) serves version (\d+) \(pause ([\d.]+) ms\)", line)
        if m:
            pauses.setdefault(m.group(4), []).append(float(m.group(6)))
        m = re.match(r"\S (\d\d):(\d\d):(\d\d\.\d+) .*cluster (\S+) serves version (\d+) ", line)
        if m:
            t = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
            served.setdefault(int(m.group(5)), []).append(t)
lags = []
for version, times in served.items():
    path = f"{run}/store/runs/{run_id}/versions/{version:020d}.json"
    if not os.path.exists(path):
        continue
    mt = datetime.datetime.utcfromtimestamp(os.path.getmtime(path))  # logs are in UTC
    published = mt.hour * 3600 + mt.minute * 60 + mt.second + mt.microsecond / 1e6
    lags += [(t - published) * 1000 for t in times]
print(f"{api}: weight-update pause per replica load (ms):")
for url, p in sorted(pauses.items()):
    print(f"  {url}: {len(p)} loads, median {statistics.median(p):.1f}, max {max(p):.1f}")
if lags:
    lags.sort()
    print(f"{api}: publication -> all replicas of a worker serving it (ms): {len(lags)} "
          f"worker-versions, median {statistics.median(lags):.0f}, "
          f"p90 {lags[int(0.9 * (len(lags) - 1))]:.0f}, max {max(lags):.0f}")
PY
  cleanup
  servers=()
}

# On-policy distillation through the engines: the student's worker drives one engine, the
# teacher's worker (regions[].models, its engine from regions[].model_engines) another, and every
# group the trainer learns from is scored by the teacher's engine (score jobs: SGLang's
# input_token_logprobs, vLLM's prompt_logprobs).
run_distill() {  # run_distill API PORT_BASE
  local api=$1 b=$2
  serve "$api" $((b + 10)) "$work/$api-student-engine.log"
  serve "$api" $((b + 11)) "$work/$api-teacher-engine.log"
  local student=http://127.0.0.1:$((b + 10)) teacher=http://127.0.0.1:$((b + 11))
  distill_config() {  # distill_config MODEL_ENGINES
    cat <<YAML
run: {id: distill-$api, dir: $work/$api-distill, time_limit: 240s}
$(services $b)
regions:
  - name: near
    relay: 127.0.0.1:$((b + 2))
    workers: 1
    worker_engines: [[$student]]
    models: {teacher: 1}
    model_engines: {teacher: $1}
fixed_models:
  - {name: teacher, run: distill-$api-teacher}
worker: {engine: $api, capacity: 2, heartbeat: 300ms}
engine:
  checkpoint_dir: $work/$api-distill-served/{cluster}
  health_interval: 200ms
  request_timeout: 60s
model: {d_model: 32, layers: 2, heads: 2, d_ff: 128, context: 9}
task: {kind: arithmetic, digits: 1}
trainer:
  algorithm: distill
  teacher: {model: teacher, warmup: {steps: 300, batch: 32, learning_rate: 3e-3}}
  threads: 1
  seed: 3
  warmup: {steps: 60, batch: 32, learning_rate: 3e-3}
  steps: 8
  prompts_per_step: 8
  samples_per_prompt: 4
  learning_rate: 1e-4
  eval_problems: 50
YAML
  }
  # One list of engines per teacher worker, or the run is refused before anything starts.
  distill_config "[[$teacher], [$teacher]]" > "$api-distill.yaml"
  expect_error "model_engines.teacher must list one list of engine URLs per worker (1)" \
    "$weft" run "$api-distill.yaml"
  distill_config "[[$teacher]]" > "$api-distill.yaml"
  if "$weft" run "$api-distill.yaml" > "$api-distill.out" 2>&1; then ok; else
    fail "$api: the distillation run failed: $(tail -5 "$api-distill.out")"
  fi
  local report=$work/$api-distill/report.json logs=$work/$api-distill/logs
  jq -e '.completed and .algorithm == "distill" and .steps == 8 and .staleness_violations == 0
         and .digest_mismatches == 0 and .groups_scored >= ([.per_step[] | .groups] | add)
         and ([.per_step[] | .reverse_kl] | all(. != 0))' "$report" > /dev/null && ok ||
    fail "$api: distillation report: $(jq -c '{completed, steps, groups_scored, failure}' "$report")"
  grep -q "serving model teacher version 0 (digest" "$logs/worker-near-teacher-1.log" && ok ||
    fail "$api: the teacher's worker did not register the model"
  # The teacher's engine scored them (the worker's summary when it stops), the student's none.
  grep -Eq "; [1-9][0-9]* targets scored" "$logs/worker-near-teacher-1.log" && ok ||
    fail "$api: the teacher's worker scored nothing: $(grep -h "targets scored" "$logs/worker-near-teacher-1.log")"
  grep -q "; 0 targets scored" "$logs/worker-near-1.log" && ok ||
    fail "$api: the student's worker scored: $(grep -h "targets scored" "$logs/worker-near-1.log")"
  cleanup
  servers=()
}

run_api sglang $base file
run_api vllm $((base + 100)) memory
run_distill sglang $((base + 200))
run_distill vllm $((base + 300))
cat "$work/measurements.txt"
echo "engines e2e: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
