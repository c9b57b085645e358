#!/usr/bin/env bash
# The simulator against a real run: `weft run configs/local.yaml` (about two minutes), then
# `weft sim` on the same shape (configs/sim/local.yaml) with what the run measured, compared by
# tests/sim/crosscheck.sh within its stated tolerances. With REPORT, compares against that run's
# report instead of running one.
# Usage: bench/sim_crosscheck.sh [REPORT]      (after ./setup.sh; from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
weft=build/cli/weft
report=${1:-}
if [ -z "$report" ]; then
  "$weft" run configs/local.yaml
  report=runs/local/report.json
fi
bash tests/sim/crosscheck.sh "$weft" "$report" configs/sim/local.yaml \
  "$(jq '.max_staleness' "$report")" runs/sim-crosscheck
