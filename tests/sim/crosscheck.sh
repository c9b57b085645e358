#!/usr/bin/env bash
# Compares a simulated run with a real `weft run` of the same shape, within stated tolerances:
#   - versions published: equal;
#   - staleness: every lag within the bound K in both, and the mean lag of the delivered groups
#     within 1.5 versions of the real run's;
#   - WAN bytes per region: what the simulated relay fetched within a factor of 3 of what the real
#     relay fetched upstream (the real figure also holds manifests, and blobs fetched again).
# The simulation extends BASE (the run's shape) with what the real run measured
# (tests/sim/calibrated_sim.sh).
# Usage: crosscheck.sh WEFT REAL_REPORT BASE_SIM_YAML K WORKDIR   (exit 1 outside the tolerances)
set -euo pipefail
weft=$1 real=$(realpath "$2") base=$(realpath "$3") k=$4 work=$5
mkdir -p "$work"
bash "$(dirname "${BASH_SOURCE[0]}")/calibrated_sim.sh" "$real" "$base" crosscheck > "$work/sim.yaml"
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
