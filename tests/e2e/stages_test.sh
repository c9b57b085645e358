#!/usr/bin/env bash
# End to end: the example trainers of the other post-training stages run from their configs,
# configs/local-rft.yaml (rejection-sampling fine-tuning) and configs/local-distill.yaml (on-policy
# distillation from a teacher the trainer makes, served by clusters of its own), shortened (fewer
# steps, shorter warm-ups, the run in WORKDIR, ports of its own), each checked through its report.
# Usage: stages_test.sh WEFT REPO WORKDIR
set -uo pipefail
weft=$1 repo=$2 work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
work=$(pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../test_lib.sh"

# The committed config with the run in $work/NAME, its ports moved to a slice of its own and the
# training shortened.
shorten() {
  local name=$1 base=$2
  sed -e "s#dir: runs/$name #dir: $work/$name #" \
      -e "s#time_limit: 15m#time_limit: 240s#" \
      -e "s#127.0.0.1:8[34]7\([0-9]\)#127.0.0.1:$((base))\1#" \
      -e "s#127.0.0.1:8[34]8\([0-9]\)#127.0.0.1:$((base + 1))\1#" \
      -e "s#^  steps: 150 #  steps: 6 #" \
      -e "s#prompts_per_step: 64#prompts_per_step: 16#" \
      -e "s#warmup: {steps: 500,#warmup: {steps: 60,#" \
      -e "s#warmup: {steps: 2000,#warmup: {steps: 120,#" \
      -e "s#eval_problems: 500#eval_problems: 40#" \
      "$repo/configs/$name.yaml" > "$name.yaml"
}
base=$((2900 + RANDOM % 200))  # ports ${base}0-${base}9 and $((base + 1))0-...9

shorten local-rft $base
if "$weft" run local-rft.yaml > rft.out 2>&1; then ok; else fail "the rft run failed: $(tail -5 rft.out)"; fi
report=local-rft/report.json
jq -e '.completed and .algorithm == "rft" and .steps == 6 and .staleness_violations == 0
       and .digest_mismatches == 0' $report > /dev/null && ok ||
  fail "rft report: $(jq -c '{completed, algorithm, steps, staleness_violations, failure}' $report)"
# The steps learnt from the samples the verifier accepted, and only those (a policy after so short
# a warm-up gets few right: a step may have none).
jq -e '[.per_step[] | .survivors] | all(. >= 0 and . <= 1) and any(. > 0)' $report > /dev/null && ok ||
  fail "rft steps without survivors: $(jq -c '[.per_step[] | .survivors]' $report)"

shorten local-distill $((base + 2))
if "$weft" run local-distill.yaml > distill.out 2>&1; then ok; else
  fail "the distill run failed: $(tail -5 distill.out)"
fi
report=local-distill/report.json
jq -e '.completed and .algorithm == "distill" and .steps == 6 and .staleness_violations == 0
       and .digest_mismatches == 0 and .teacher_accuracy != null' $report > /dev/null && ok ||
  fail "distill report: $(jq -c '{completed, algorithm, steps, teacher_accuracy, failure}' $report)"
# Every group a step learnt from came back scored by the teacher's clusters, whose model the
# orchestrator knows by its digest.
jq -e '.groups_scored >= ([.per_step[] | .groups] | add)' $report > /dev/null && ok ||
  fail "groups scored: $(jq -c '{groups_scored, groups: [.per_step[] | .groups]}' $report)"
jq -e '[.per_step[] | .reverse_kl] | all(. != 0)' $report > /dev/null && ok ||
  fail "steps without a reverse KL: $(jq -c '[.per_step[] | .reverse_kl]' $report)"
grep -q "serving model teacher version 0 (digest" local-distill/logs/worker-us-east-teacher-1.log &&
  ok || fail "the teacher's worker did not register the model: $(tail -3 local-distill/logs/worker-us-east-teacher-1.log)"

echo "stages_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
