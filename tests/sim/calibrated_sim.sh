#!/usr/bin/env bash
# The simulated shape of a real `weft run`: prints a `weft sim` scenario that extends BASE (the
# run's shape: orchestrator, regions, clusters) with what the real run measured (its report): the
# model's parameters, each version's density and the bytes per changed element, and the pace (half
# of a step's time training, the other half generating). tests/sim/crosscheck.sh compares it with
# the run; bench/staleness_learning.sh predicts other staleness bounds with it.
# Usage: calibrated_sim.sh REAL_REPORT BASE_SIM_YAML NAME > SIM.yaml
set -euo pipefail
real=$(realpath "$1") base=$(realpath "$2") name=$3
steps=$(jq '.steps' "$real")
step_seconds=$(jq '.per_step[-1].seconds / .steps' "$real")
slots=$(jq '[.orchestrator.clusters[] | .capacity] | add' "$real")
prompts=$(jq '.per_step[0].groups' "$real")
samples=$(jq '.per_step[0].samples / .per_step[0].groups' "$real")
cat <<YAML
extends: $base
name: $name
trainer:
  step_time: $(jq -n "$step_seconds / 2 * 1000 | floor")ms
  prompts_per_step: $prompts
  samples_per_prompt: $samples
  steps: $steps
  upload_bandwidth: 1GB
model:
  parameters: $(jq '.parameters' "$real")
  format: bf16
  densities_from: $real
  bits_per_change: $(jq '([.per_step[].delta_bytes] | add) * 8 / ([.per_step[].changed_elements] | add)' "$real")
  keyframe_interval: 1000
  delta_budget: 1000
  apply_throughput: 1GB
  load_throughput: 1GB
  encode_throughput: 1GB
generation:
  response_tokens: {median: 10, sigma: 0.3}
  tokens_per_second: {median: $(jq -n "10 / ($step_seconds / 2 * $slots / $prompts)"), sigma: 0.2}
YAML
