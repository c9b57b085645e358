#!/usr/bin/env bash
# End to end: tasks at the text level, with prompts from a JSONL dataset whose metadata holds each
# problem's answer.
#   - `task: {kind: http}`: workers hand the engine the prompts as text (the embedded engine
#     tokenises them) or token ids, and score every completion with a reward service (a Python
#     script that compares the completion's text with the metadata's answer and logs every
#     request): the run finishes, every reward came from the service with the job's metadata,
#     and the trainer got each group's metadata back;
#   - `task: {kind: trainer}`: workers send no reward and the trainer scores every sample.
# Usage: text_task_test.sh WEFT WORKDIR
set -uo pipefail
weft=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
work=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
work=$(pwd)
source "$here/../test_lib.sh"

# Fixed ports below the ephemeral range (32768 and up), where only listeners bind.
# Its own slice of ports, so that tests run in parallel (ctest -j2) never pick the same ones.
base=$((27200 + RANDOM % 2200))
steps=5 prompts=4 samples=4

# The dataset: every one-digit sum, as text, and a few as token ids (the begin token 13, the
# digits, '+' 10 and '=' 11), each with its answer in the metadata; some ask for more samples.
/usr/bin/python3 - <<'PY'
import json
with open("prompts.jsonl", "w") as f:
    for a in range(10):
        for b in range(10):
            row = {"prompt": f"{a}+{b}=", "metadata": {"answer": str(a + b), "row": 10 * a + b}}
            if (a + b) % 7 == 0:
                row["prompt"] = [13, a, 10, b, 11]
            if a == b:
                row["samples"] = 6
            f.write(json.dumps(row) + "\n")
        f.write("\n")  # blank lines are skipped
PY

# config FILE PORT_BASE RUN_DIR: a small run whose task section comes from stdin.
config() {
  cat > "$1" <<YAML
run: {id: text, dir: $3, time_limit: 80s}
store: {listen: 127.0.0.1:$2}
orchestrator:
  listen: 127.0.0.1:$(($2 + 1))
  max_staleness: 2
  cluster_timeout: 5s
  tick: 50ms
  max_wait: 1s
  tokens: {worker: w, trainer: t, admin: a}
regions:
  - {name: near, relay: 127.0.0.1:$(($2 + 2)), workers: 2}
worker: {capacity: 2, heartbeat: 200ms}
model: {d_model: 32, layers: 1, heads: 2, d_ff: 64}
trainer:
  threads: 1
  warmup: {steps: 200, batch: 16}
  steps: $steps
  prompts_per_step: $prompts
  samples_per_prompt: $samples
  eval_problems: 20
  stall_after: 40s
YAML
  cat >> "$1"
}
check() {  # check FILE 'jq expression' 'what it means'
  if [ "$(jq -r "$2" "$1" 2>/dev/null)" = true ]; then ok; else fail "$3 ($2 in $1)"; fi
}

# 1. kind: http, with the reward service.
service_port=$((base + 3))
/usr/bin/python3 "$here/reward_service.py" --port $service_port --log requests.jsonl > service.out 2>&1 &
service=$!
trap 'kill $service 2>/dev/null' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$service_port/" > /dev/null && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$service_port/" > /dev/null && ok || fail "the reward service did not start: $(cat service.out)"
config http.yaml $base "$work/http-run" <<YAML
task:
  kind: http
  url: http://127.0.0.1:$service_port/score
  timeout: 5s
  retries: 3
  max_prompt_tokens: 5
  max_tokens: 3
  stop_token: 12
  digits: 1
  dataset: $work/prompts.jsonl
YAML
started=$SECONDS
if "$weft" run http.yaml > http.out 2>&1; then ok; else fail "weft run (kind http) failed: $(tail -20 http.out)"; fi
echo "kind http: $((SECONDS - started)) s"
report=http-run/report.json progress=http-run/trainer.json
check $report '.completed' "the run completed"
check $report ".steps == $steps" "every step ran"
check $report '.staleness_violations == 0' "no staleness violations"
# Every reward came from the service: the workers sent one with every sample, so the trainer
# computed none.
check $progress '.rewards_computed == 0' "the trainer computed no reward"
groups=$(jq '[.steps[].groups] | add' $progress)
check $progress ".groups_with_metadata == $groups and $groups == $((steps * prompts))" \
  "the trainer got the metadata of every group back"
jq -s -e 'any(.[]; .reward == 1)' requests.jsonl > /dev/null && ok || fail "the service scored no completion right"
check $progress '[.steps[].reward] | add > 0' "the trainer's batches carry the service's rewards"
requests=$(wc -l < requests.jsonl)
used=$(jq '[.steps[].samples] | add' $progress)
[ "$requests" -ge "$used" ] && ok || fail "the service scored $requests completions, the trainer used $used samples"
# Each request carried its job's prompt and metadata (the answer is the prompt's sum), the
# completion's text and tokens, and the path of the URL.
jq -s -e 'all(.[];
    .path == "/score"
    and (.request.prompt | if type == "string" then (split("+") | (.[0] | tonumber) + (.[1] | rtrimstr("=") | tonumber))
                           else .[1] + .[3] end | tostring) == .request.metadata.answer
    and (.request.metadata.row | type) == "number"
    and (.request.completion.text | type) == "string"
    and (.request.completion.tokens | type) == "array")' requests.jsonl > /dev/null \
  && ok || fail "a request to the service lacks its job's prompt, metadata or completion: $(head -3 requests.jsonl)"
jq -s -e 'any(.[]; .request.prompt | type == "array") and any(.[]; .request.prompt | type == "string")' \
  requests.jsonl > /dev/null && ok || fail "the service saw no token-id prompt or no text prompt"
# The completions' text is their tokens decoded, without the end token (12) that stopped them.
jq -s -e 'all(.[]; .request.completion | .text == (.tokens | if .[-1] == 12 then .[:-1] else . end
      | map(if . < 10 then tostring elif . == 10 then "+" elif . == 11 then "=" elif . == 12 then "$"
            elif . == 13 then "^" else "?" end) | join("")))' requests.jsonl > /dev/null \
  && ok || fail "a completion's text is not its tokens decoded: $(head -3 requests.jsonl)"
kill $service && wait $service 2>/dev/null
trap - EXIT

# 2. kind: trainer: no reward service; the trainer scores every sample with its task.
config trainer.yaml $((base + 10)) "$work/trainer-run" <<YAML
task: {kind: trainer, max_prompt_tokens: 5, max_tokens: 3, stop_token: 12, digits: 1, dataset: prompts.jsonl}
YAML
before=$(wc -l < requests.jsonl)
started=$SECONDS
if "$weft" run trainer.yaml > trainer.out 2>&1; then ok; else fail "weft run (kind trainer) failed: $(tail -20 trainer.out)"; fi
echo "kind trainer: $((SECONDS - started)) s"
report=trainer-run/report.json progress=trainer-run/trainer.json
check $report '.completed' "the run completed"
check $report ".steps == $steps" "every step ran"
used=$(jq '[.steps[].samples] | add' $progress)
check $progress ".rewards_computed == $used and $used >= $((steps * prompts * samples))" \
  "the trainer scored every sample"
check $progress '[.steps[].reward] | add > 0' "the trainer's own rewards are not all 0"
groups=$(jq '[.steps[].groups] | add' $progress)
check $progress ".groups_with_metadata == $groups" "the trainer got the metadata of every group back"
[ "$(wc -l < requests.jsonl)" -eq "$before" ] && ok || fail "the reward service was asked during the trainer run"
check trainer-run/trainer-settings.json '.task == {"kind": "trainer", "digits": 1,
  "dataset": "'"$work"'/prompts.jsonl", "max_prompt_tokens": 5, "max_tokens": 3, "stop_token": 12}
  and .model.max_seq == 8' "the settings file has the task, the dataset's path made absolute"

# 3. The same with the PyTorch trainer (examples/torch_trainer), when the weft Python package is
#    built beside the weft binary.
python_package=$(cd "$(dirname "$weft")/../python" 2>/dev/null && pwd)
if [ -n "$python_package" ] && [ -d "$python_package/weft" ]; then
  config torch.yaml $((base + 20)) "$work/torch-run" <<YAML
  command: [/usr/bin/python3, $here/../../examples/torch_trainer/train.py]
  env: {PYTHONPATH: $python_package, OMP_NUM_THREADS: "1"}
task: {kind: trainer, max_prompt_tokens: 5, max_tokens: 3, stop_token: 12, digits: 1, dataset: prompts.jsonl}
YAML
  started=$SECONDS
  if "$weft" run torch.yaml > torch.out 2>&1; then ok; else fail "weft run (kind trainer, PyTorch) failed: $(tail -20 torch.out)"; fi
  echo "kind trainer, PyTorch trainer: $((SECONDS - started)) s"
  progress=torch-run/trainer.json
  check torch-run/report.json ".completed and .steps == $steps" "the PyTorch run completed"
  used=$(jq '[.steps[].samples] | add' $progress)
  check $progress ".trainer == \"pytorch\" and .rewards_computed == $used and $used > 0" \
    "the PyTorch trainer scored every sample"
  groups=$(jq '[.steps[].groups] | add' $progress)
  check $progress ".groups_with_metadata == $groups" "the PyTorch trainer got the metadata back"
else
  echo "text_task e2e: no weft Python package beside $weft; the PyTorch case is left out"
fi

if [ "$failed" -gt 0 ]; then
  for log in http-run/logs/trainer.log http-run/logs/worker-near-1.log trainer-run/logs/trainer.log \
             torch-run/logs/trainer.log; do
    echo "--- $log"; tail -15 "$log" 2>/dev/null
  done
fi
echo "text_task e2e: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
