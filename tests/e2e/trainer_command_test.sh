#!/usr/bin/env bash
# End to end: `weft run` with the trainer a run config names in trainer.command.
#   - bad trainer.command and trainer.env values are refused before anything starts, naming the
#     key and line;
#   - a shell-script trainer sees the channel (docs/run.md, "The trainer"): its environment, the
#     settings file, its arguments and working directory; it writes a progress file and fails, and
#     the report says so; a garbled progress file is reported, not fatal;
#   - the weft binary itself as the trainer command (`weft train` with no flags, from the
#     environment alone) completes a tiny run.
# Usage: trainer_command_test.sh WEFT WORKDIR
set -euo pipefail
weft=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
work=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
work=$(pwd)
source "$here/../test_lib.sh"
# expect_error's command fails by design; keep going after any failed check.
set +e

# Fixed ports below the ephemeral range (32768 and up), where only listeners bind.
# Its own slice of ports, so that tests run in parallel (ctest -j2) never pick the same ones.
base=$((29600 + RANDOM % 2200))
# config FILE PORT_BASE RUN_DIR WORKERS: a tiny run whose trainer section goes on from stdin.
config() {
  cat > "$1" <<YAML
run: {id: tc, dir: $3, time_limit: 60s}
store: {listen: 127.0.0.1:$2}
orchestrator:
  listen: 127.0.0.1:$(($2 + 1))
  max_staleness: 2
  cluster_timeout: 3s
  tick: 50ms
  max_wait: 1s
  tokens: {worker: w, trainer: t, admin: a}
regions:
  - {name: near, relay: 127.0.0.1:$(($2 + 2)), workers: $4}
worker: {capacity: 2, heartbeat: 200ms}
model: {d_model: 16, layers: 1, heads: 2, d_ff: 32}
task: {digits: 1}
trainer:
  threads: 1
  warmup: {steps: 5, batch: 8}
  steps: 4
  prompts_per_step: 4
  samples_per_prompt: 2
  eval_problems: 10
  stall_after: 30s
YAML
  cat >> "$1"
}
check() {  # check REPORT 'jq expression' 'what it means'
  if [ "$(jq -r "$2" "$1" 2>/dev/null)" = true ]; then ok; else fail "$3 ($2 in $1)"; fi
}

# 1. Config errors: non-zero, naming the key and its line, before anything starts.
bad() {  # bad PATTERN: the trainer lines on stdin
  config bad.yaml $base "$work/bad-run" 0
  expect_error "$1" "$weft" run bad.yaml
  grep -q "line " err.txt && ok || fail "the error for '$1' names no line: $(cat err.txt)"
}
echo "  command: python3 trainer.py" | bad "trainer.command must be a non-empty list of strings"
echo "  command: []" | bad "trainer.command must be a non-empty list of strings"
echo "  command: [[python3], x]" | bad "trainer.command\[0\] must be a string"
echo "  command: ['']" | bad "trainer.command\[0\] is empty"
echo "  env: {1BAD: x}" | bad "trainer.env.1BAD: '1BAD' is not an environment variable name"
echo "  env: {BAD-NAME: x}" | bad "trainer.env.BAD-NAME: 'BAD-NAME' is not an environment variable name"
echo "  env: {WEFT_STORE: /tmp}" | bad "trainer.env.WEFT_STORE: weft run sets this variable itself"
echo "  env: [A=1]" | bad "trainer.env must be a map"
echo "  env: {A: [1]}" | bad "trainer.env.A must be a string"
echo "  env: {A: }" | bad "trainer.env.A must be a string"
echo "  command: [no-such-trainer-4b1e]" | config bad.yaml $base "$work/bad-run" 0
expect_error "trainer.command: 'no-such-trainer-4b1e' is not an executable found on PATH" "$weft" run bad.yaml
echo "  command: [./missing.sh]" | config bad.yaml $base "$work/bad-run" 0
expect_error "trainer.command: './missing.sh' is not an executable file" "$weft" run bad.yaml
[ ! -e bad-run ] && ok || fail "a refused config made its run directory"

# 2. A shell-script trainer: records what it was given, reports two steps of five and fails (or,
#    given 'garbled', writes a progress file against the schema and succeeds).
cat > fake_trainer.sh <<'SH'
set -eu
env | grep -E '^(WEFT_|EXTRA_SETTING=)' | sort > seen-env.txt
pwd > seen-pwd.txt
echo "$@" > seen-args.txt
cp "$WEFT_SETTINGS" seen-settings.json
if [ "$1" = hang ]; then
  sleep 300 &
  echo $! > seen-sleep.pid
  wait
fi
if [ "$1" = garbled ]; then
  echo '{"phase": "rl", "steps": [{"step": "one", "version": 1, "reward": 0.5}]}' > "$WEFT_PROGRESS.tmp"
  mv "$WEFT_PROGRESS.tmp" "$WEFT_PROGRESS"
  exit 0
fi
cat > "$WEFT_PROGRESS.tmp" <<JSON
{"phase": "rl", "warmup_steps": 0, "steps_total": 5, "custom": [1, 2],
 "steps": [{"step": 1, "version": 1, "reward": 0.25, "samples": 4},
           {"step": 2, "version": 2, "reward": 0.75, "samples": 4, "mean_lag": 1.0, "max_lag": 1,
            "loss": 0.1}]}
JSON
mv "$WEFT_PROGRESS.tmp" "$WEFT_PROGRESS"
echo "the fake trainer gives up" >&2
exit 3
SH
config fail.yaml $((base + 10)) "$work/fail-run" 0 <<'YAML'
  command: [sh, fake_trainer.sh, fail, second word]
  env: {EXTRA_SETTING: "hello world"}
YAML
if "$weft" run fail.yaml > fail.out 2>&1; then fail "weft run succeeded with a failing trainer"; else ok; fi
grep -q "the trainer exited with status 3" fail.out && ok || fail "weft run did not report the trainer's failure: $(tail -5 fail.out)"
grep -q "the trainer (sh fake_trainer.sh fail 'second word')" fail.out && ok || fail "weft run did not name the trainer: $(head -3 fail.out)"
grep -q "the fake trainer gives up" fail-run/logs/trainer.log && ok || fail "the trainer's output is not in its log"
report=fail-run/report.json
check $report '.completed == false and (.failure | test("trainer exited with status 3"))' "the report has the failure"
check $report '.trainer == "sh fake_trainer.sh fail '"'second word'"'"' "the report names the trainer command"
check $report '.steps == 2 and .per_step[1].reward == 0.75 and .per_step[1].max_lag == 1' "the report has the trainer's steps"
check $report '.per_step[1] | has("loss") | not' "fields outside the schema are left out"
check $report '.initial_reward == 0.5 and .final_reward == 0.5' "rewards the trainer left out are computed from its steps"
check $report '.eval_accuracy_after == null and .versions_published == null and .progress_error == null' \
  "figures the trainer did not report are null"
check $report '.warmup_steps == 0' "the trainer's warmup_steps replaces the config's"
[ "$(cat seen-pwd.txt)" = "$work" ] && ok || fail "the trainer ran in $(cat seen-pwd.txt), not in $work"
[ "$(cat seen-args.txt)" = "fail second word" ] && ok || fail "the trainer's arguments: $(cat seen-args.txt)"
cat > expected-env.txt <<ENV
EXTRA_SETTING=hello world
WEFT_CONFIG=$work/fail.yaml
WEFT_MAX_STALENESS=2
WEFT_ORCHESTRATOR=http://127.0.0.1:$((base + 11))
WEFT_PROGRESS=$work/fail-run/trainer.json
WEFT_RUN_DIR=$work/fail-run
WEFT_RUN_ID=tc
WEFT_SETTINGS=$work/fail-run/trainer-settings.json
WEFT_STORE=$work/fail-run/store
WEFT_STORE_URL=http://127.0.0.1:$((base + 10))
WEFT_TRAINER_TOKEN=t
ENV
if diff expected-env.txt seen-env.txt > env.diff; then ok; else fail "the trainer's environment: $(cat env.diff)"; fi
check seen-settings.json '.run_id == "tc" and .max_staleness == 2 and .serving == "bf16"' "the settings name the run"
check seen-settings.json '.model == {"vocab": 16, "d_model": 16, "layers": 1, "heads": 2, "d_ff": 32, "max_seq": 8}' \
  "the settings have the model, max_seq from the task"
check seen-settings.json '.task == {"kind": "arithmetic", "digits": 1, "dataset": null, "max_prompt_tokens": 5,
  "max_tokens": 3, "stop_token": 12}' "the settings have the task, its lengths filled in"
check seen-settings.json '.trainer | .steps == 4 and .warmup == {"steps": 5, "batch": 8, "learning_rate": 0.003}
  and .prompts_per_step == 4 and .samples_per_prompt == 2 and .steps_ahead == 2 and .learning_rate == 2e-05
  and .truncation == 2 and .eval_problems == 10 and .keyframe_interval == 50 and .keyframe_budget == 0.5
  and .stall_after_s == 30 and .min_step_time_s == 0 and .seed == 1 and .threads == 1
  and .optimizer == "adamw"' \
  "the settings have every trainer value, defaults filled in"

config garbled.yaml $((base + 10)) "$work/garbled-run" 0 <<'YAML'
  command: [sh, fake_trainer.sh, garbled]
YAML
if "$weft" run garbled.yaml > garbled.out 2>&1; then ok; else fail "the trainer's exit status 0 did not decide: $(tail -5 garbled.out)"; fi
check garbled-run/report.json '.progress_error | test("steps\\[0\\].step must be a non-negative integer")' \
  "the report says what is wrong with the progress file"
grep -q "progress file is unusable" garbled.out && ok || fail "weft run did not print the progress file's problem"

# Ctrl-C: weft run stops the trainer's whole process group (the script and its sleep).
config hang.yaml $((base + 10)) "$work/hang-run" 0 <<'YAML'
  command: [sh, fake_trainer.sh, hang]
YAML
rm -f seen-sleep.pid
"$weft" run hang.yaml > hang.out 2>&1 &
run_pid=$!
for _ in $(seq 1 100); do [ -s seen-sleep.pid ] && break; sleep 0.1; done
trainer_pid=$(pgrep -f -- "fake_trainer.sh hang" | head -1)
kill -INT $run_pid
if wait $run_pid; then fail "an interrupted run succeeded"; else ok; fi
check hang-run/report.json '.failure == "interrupted"' "the report says the run was interrupted"
sleeper=$(cat seen-sleep.pid 2>/dev/null)
[ -n "$sleeper" ] && [ -n "$trainer_pid" ] && ok || fail "the hanging trainer never started: $(cat hang.out)"
# Gone: no such process, or a zombie its new parent has not reaped yet.
gone() {
  for _ in $(seq 1 50); do
    case "$(ps -o stat= -p "$1" 2>/dev/null)" in "" | Z*) return 0 ;; esac
    sleep 0.1
  done
  return 1
}
gone "$trainer_pid" && ok || fail "the trainer outlived weft run"
gone "$sleeper" && ok || fail "the trainer's child process outlived weft run"

# 3. The weft binary as the trainer command: `weft train` with no flags, from the environment.
config weft.yaml $((base + 20)) "$work/weft-run" 1 <<YAML
  command: [$weft, train]
YAML
started=$SECONDS
if "$weft" run weft.yaml > weft.out 2>&1; then ok; else fail "weft run with [weft, train] failed: $(tail -20 weft.out)"; fi
report=weft-run/report.json
check $report '.completed and .trainer == "'"$weft"' train"' "the run completed with the command trainer"
check $report '.steps == 4 and .versions_published == 5 and (.eval_accuracy_after | type) == "number"' \
  "the trainer ran every step and evaluated"
check $report '.staleness_violations == 0 and .digest_mismatches == 0 and .warmup_steps == 5' "no violations"
check weft-run/trainer.json '.steps_total == 4 and .warmup_steps == 5' "weft train's progress file has its denominators"
grep -q "trained 4 steps" weft-run/logs/trainer.log && ok || fail "weft train's log lacks its summary: $(tail -5 weft-run/logs/trainer.log)"
echo "the [weft, train] run took $((SECONDS - started)) s"

if [ "$failed" -gt 0 ]; then
  for out in fail.out garbled.out hang.out weft.out; do
    [ -e $out ] && { echo "--- $out"; tail -20 $out; }
  done
fi
echo "trainer command e2e: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
