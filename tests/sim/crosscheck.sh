#!/usr/bin/env bash
# Compares a simulated run with a real `weft run` of the same shape, within stated tolerances:
#   - versions published: equal;
#   - staleness: every lag within the bound K in both, and the mean lag of the delivered groups
#     within 1.5 versions of the real run's;
#   - WAN bytes per region: what the simulated relay fetched within a factor of 3 of what the real
#     relay fetched upstream (the real figure also holds manifests, and blobs fetched again).
# The simulation extends BASE (the run's shape: orchestrator, regions, clusters) with what the real
# run measured: the model's parameters, each version's density and the bytes per changed element,
# and the pace (half of a step's time training, the other half generating).
# Usage: crosscheck.sh WEFT REAL_REPORT BASE_SIM_YAML K WORKDIR   (exit 1 outside the tolerances)
set -euo pipefail
weft=$1 real=$(realpath "$2") base=$(realpath "$3") k=$4 work=$5
mkdir -p "$work"
steps=$(jq '.steps' "$real")
step_seconds=$(jq '.per_step[-1].seconds / .steps' "$real")
slots=$(jq '[.orchestrator.clusters[] | .capacity] | add' "$real")
prompts=$(jq '.per_step[0].groups' "$real")
samples=$(jq '.per_step[0].samples / .per_step[0].groups' "$real")
cat > "$work/sim.yaml" <<YAML
extends: $base
name: crosscheck
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
"$weft" sim "$work/sim.yaml" --out "$work/out" > "$work/sim.out"
sim=$work/out/report.json
failed=0
row() { printf '  %-34s %14s %14s  %s\n' "$@"; }
verdict() { if [ "$1" = true ]; then echo ok; else failed=1; echo "OUTSIDE ($2)"; fi; }

echo "crosscheck: weft run ($real) against weft sim ($sim)"
row "" "weft run" "weft sim" ""
rv=$(jq '.versions_published' "$real"); sv=$(jq '.trainer.versions_published' "$sim")
row "versions published" "$rv" "$sv" "$(verdict "$([ "$rv" = "$sv" ] && echo true)" "must be equal")"
# The real report has each step's mean and max lag; weigh the means by the groups of each step.
rmean=$(jq '([.per_step[] | .mean_lag * .groups] | add) / ([.per_step[] | .groups] | add)' "$real")
rmax=$(jq '[.per_step[] | .max_lag] | max' "$real")
smean=$(jq '.staleness.mean' "$sim"); smax=$(jq '[.staleness.histogram | keys[] | tonumber] | max' "$sim")
row "max lag (bound $k)" "$rmax" "$smax" "$(verdict "$(jq -n "$rmax <= $k and $smax <= $k")" "above the bound")"
row "mean lag" "$(printf %.2f "$rmean")" "$(printf %.2f "$smean")" \
  "$(verdict "$(jq -n "(($rmean) - ($smean)) | fabs <= 1.5")" "more than 1.5 apart")"
for region in $(jq -r '.relays | keys[]' "$real"); do
  rb=$(jq --arg r "$region" '.relays[$r].upstream_bytes' "$real")
  sb=$(jq --arg r "$region" '.regions[] | select(.name == $r) | .wan_bytes_with_relay' "$sim")
  row "WAN bytes, $region" "$rb" "$(printf %.0f "$sb")" \
    "$(verdict "$(jq -n "$sb > 0 and $rb / $sb <= 3 and $sb / $rb <= 3")" "more than a factor of 3 apart")"
done
[ "$failed" -eq 0 ]
