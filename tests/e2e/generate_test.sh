#!/usr/bin/env bash
# End to end: `weft generate` writes every (prompt, sample) of its dataset exactly once while
# things are killed with kill -9: the orchestrator (restarted from its journal), a worker (its jobs
# go to the others) and weft generate itself, which the same command then resumes. And what it
# refuses: a dataset line without an id or with an id twice, an output directory holding another
# run's records or files it did not write, a checkpoint that is not the model the store holds.
# Usage: generate_test.sh WEFT WORKDIR
set -uo pipefail
weft=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
work=$(pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../test_lib.sh"

base=$((27000 + RANDOM % 2000))
prompts=6000 samples=4
total=$((prompts * samples))
python3 - "$prompts" > prompts.jsonl <<'PY'
import random, sys
rng = random.Random(3)
for i in range(int(sys.argv[1])):
    print('{"id": "p%05d", "prompt": "%d+%d="}' % (i, rng.randrange(100), rng.randrange(100)))
PY
cat > gen.yaml <<YAML
run: {id: gen, dir: $work/run, time_limit: 300s}
store: {listen: 127.0.0.1:$base}
orchestrator:
  listen: 127.0.0.1:$((base + 1))
  lease: 10s
  cluster_timeout: 3s
  max_in_flight: 1024
  tick: 50ms
  max_wait: 2s
  tokens: {worker: w, trainer: t, admin: a}
regions:
  - {name: near, relay: 127.0.0.1:$((base + 2)), workers: 0, models: {adder: 2}}
  - {name: far, relay: 127.0.0.1:$((base + 3)), latency: 20ms, workers: 0, models: {adder: 1}}
fixed_models:
  - {name: adder, run: adder}
worker: {capacity: 1, heartbeat: 300ms}
model: {d_model: 64, layers: 2, heads: 4, d_ff: 256}
task: {digits: 2}
trainer: {warmup: {steps: 40, batch: 16}, eval_problems: 20, threads: 1}
generate:
  model: adder
  checkpoint: $work/adder.safetensors
  dataset: $work/prompts.jsonl
  samples: $samples
  output: $work/out
  shard_records: 5000
  min_reward: 1.0
  jobs_ahead: 64
YAML
expect_ok "$weft" train --config gen.yaml --checkpoint adder.safetensors

records() { cat out/*.jsonl 2> /dev/null | grep -c '' || true; }
wait_records() {
  local target=$1 pid=$2
  for _ in $(seq 1 1200); do
    [ "$(records)" -ge "$target" ] && return 0
    kill -0 "$pid" 2> /dev/null || return 1
    sleep 0.05
  done
  return 1
}
# This run's processes only.
orchestrator_pid() { pgrep -f -- "orchestrator --config $work/run/orchestrator.yaml" | head -1; }
worker_pid() { pgrep -f -- "--config $work/gen.yaml --cluster $1 " | head -1; }
ours() { pgrep -f -- "$work/" | grep -v "^$$\$" || true; }

"$weft" generate gen.yaml > gen1.out 2>&1 &
gen=$!
if wait_records $((total / 10)) $gen; then ok; else fail "no records came: $(tail -5 gen1.out)"; fi
# 1. kill -9 the orchestrator: restarted from its journal, the run goes on.
victim=$(orchestrator_pid)
kill -9 "$victim" && ok || fail "no orchestrator process"
if wait_records $((total / 4)) $gen; then ok; else
  fail "no records after the orchestrator was killed: $(tail -5 gen1.out)"
fi
# 2. kill -9 a worker: its jobs go to the others once it is lost.
victim=$(worker_pid near-adder-1)
kill -9 "$victim" && ok || fail "no process for worker near-adder-1"
if wait_records $((total / 2)) $gen; then ok; else
  fail "no records after a worker was killed: $(tail -5 gen1.out)"
fi
# 3. kill -9 weft generate itself mid-run; its processes stop with it.
kill -9 $gen
wait $gen 2> /dev/null
for _ in $(seq 1 300); do [ -z "$(ours)" ] && break; sleep 0.1; done
[ -z "$(ours)" ] && ok || fail "processes of the killed run remain: $(ours | xargs ps -o args= -p)"
before=$(records)
[ "$before" -lt "$total" ] && ok || fail "the run finished before it was killed ($before records)"
grep -q "restarting it" gen1.out && ok || fail "the orchestrator was not restarted: $(cat gen1.out)"

# A record a crash cut short in the middle of its write (the end of the last shard): cut off and
# generated again.
last=$(ls out/rejected-*.jsonl | tail -1)
printf '{"prompt_id": "p00000", "sam' >> "$last"

# 4. The same command again: it resumes and finishes.
if "$weft" generate gen.yaml > gen2.out 2>&1; then ok; else fail "the rerun failed: $(tail -5 gen2.out)"; fi
grep -q "$before of $total samples already in" gen2.out && ok ||
  fail "the rerun did not start from the $before records: $(head -3 gen2.out)"
grep -q "a record cut short by a crash; cut off" gen2.out && ok || fail "the torn record was not cut off"
# Every (prompt, sample) once, none twice, all of them.
cat out/part-*.jsonl out/rejected-*.jsonl | jq -r '"\(.prompt_id) \(.sample)"' | sort > pairs.txt
[ "$(wc -l < pairs.txt)" -eq "$total" ] && ok || fail "$(wc -l < pairs.txt) records, not $total"
[ -z "$(uniq -d pairs.txt)" ] && ok || fail "records twice: $(uniq -d pairs.txt | head -3)"
python3 - "$prompts" "$samples" > expected.txt <<'PY'
import sys
for i in range(int(sys.argv[1])):
    for s in range(int(sys.argv[2])):
        print("p%05d %d" % (i, s))
PY
sort expected.txt | cmp -s - pairs.txt && ok || fail "the records are not every (prompt, sample)"
jq -e '.completed and .samples_total == '$total' and .samples_before == '$before run/generate-report.json > /dev/null &&
  ok || fail "report: $(cat run/generate-report.json)"
# Kept records hold the tokens and pass the filter; every one names the model and its digest.
digest=$(jq -r .model_digest run/generate-report.json)
jq -e -s 'all(.[]; .reward >= 1 and (.tokens | length) > 0 and .model == "adder")' out/part-*.jsonl \
  > /dev/null && ok || fail "a kept record fails the filter or lacks its tokens"
jq -e -s --arg d "$digest" 'all(.[]; .model_digest == $d and .model_version == 0)' out/*.jsonl \
  > /dev/null && ok || fail "a record does not name the model's digest and version"
# Run again once complete: nothing to do.
expect_ok "$weft" generate gen.yaml
grep -q "$total of $total samples already in" out.txt && ok || fail "a complete run ran again: $(cat out.txt)"

# 5. Refused, each naming what is wrong.
printf '{"id": "a", "prompt": "1+1="}\n{"id": "b", "prompt": "1+2="}\n{"prompt": "2+2="}\n' > no-id.jsonl
sed "s#$work/prompts.jsonl#$work/no-id.jsonl#; s#$work/out#$work/out-b#" gen.yaml > no-id.yaml
expect_error "no-id.jsonl:3: the prompt has no id" "$weft" generate no-id.yaml
printf '{"id": "a", "prompt": "1+1="}\n{"id": "a", "prompt": "1+2="}\n' > twice.jsonl
sed "s#$work/prompts.jsonl#$work/twice.jsonl#; s#$work/out#$work/out-b#" gen.yaml > twice.yaml
expect_error 'twice.jsonl:2: id "a" is also the id of line 1' "$weft" generate twice.yaml
sed "s#samples: $samples#samples: 2#" gen.yaml > other.yaml
expect_error "holds another run's records" "$weft" generate other.yaml
mkdir -p foreign && echo hello > foreign/notes.txt
sed "s#$work/out#$work/foreign#" gen.yaml > foreign.yaml
expect_error "holds notes.txt, which weft generate did not write" "$weft" generate foreign.yaml
sed "s#warmup: {steps: 40#warmup: {steps: 41#" gen.yaml > other-model.yaml
expect_ok "$weft" train --config other-model.yaml --checkpoint other.safetensors
sed "s#$work/adder.safetensors#$work/other.safetensors#; s#$work/out#$work/out-c#" gen.yaml > swapped.yaml
expect_error "is not run adder version 0 of the store" "$weft" generate swapped.yaml
[ ! -e out-c ] && ok || fail "a refused run made its output directory"

echo "generate_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
