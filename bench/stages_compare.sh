#!/usr/bin/env bash
# The post-training stages compared on the example task at the same rollout budget (docs/stages.md):
# GRPO (configs/local.yaml), rejection-sampling fine-tuning (configs/local-rft.yaml) and on-policy
# distillation (configs/local-distill.yaml), each run whole with its files in WORKDIR, then one
# table from their reports: greedy accuracy and reward reached, samples generated, weight bytes per
# version, staleness, trainer wait. With REPORT files given instead, only the table.
# Usage: bench/stages_compare.sh [WORKDIR]            (after ./setup.sh; from the repository root)
#        bench/stages_compare.sh --table REPORT...
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--table" ]; then
  shift
  reports=("$@")
else
  work=$(realpath -m "${1:-runs/stages}")
  mkdir -p "$work"
  reports=()
  for name in local local-rft local-distill; do
    sed -e "s#dir: runs/$name #dir: $work/$name #" configs/$name.yaml > "$work/$name.yaml"
    build/cli/weft run "$work/$name.yaml" | tail -12
    reports+=("$work/$name/report.json")
  done
fi
python3 - "${reports[@]}" <<'PY'
import json, sys
print("| stage | greedy accuracy (before → after) | reward, first → last 10 steps | samples generated | teacher scores | delta bytes per version (mean) | changed elements per version | mean lag | dropped stale | trainer wait (s) | RL phase (s) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for path in sys.argv[1:]:
    r = json.load(open(path))
    steps = r["per_step"]
    groups = sum(s["groups"] for s in steps) or 1
    first = sum(s["reward"] for s in steps[:10]) / max(1, len(steps[:10]))
    last = sum(s["reward"] for s in steps[-10:]) / max(1, len(steps[-10:]))
    delta = sum(s["delta_bytes"] for s in steps) / max(1, len(steps))
    changed = sum(s["changed_elements"] for s in steps) / max(1, len(steps))
    lag = sum(s["mean_lag"] * s["groups"] for s in steps) / groups
    stage = r.get("algorithm", "grpo")
    teacher = r.get("teacher_accuracy")
    scored = r.get("groups_scored") or 0
    print(f"| {stage}{' (teacher accuracy %.3f)' % teacher if teacher is not None else ''} "
          f"| {r['eval_accuracy_before']:.3f} → {r['eval_accuracy_after']:.3f} "
          f"| {first:.3f} → {last:.3f} | {sum(s['samples'] for s in steps)} | {scored} groups "
          f"| {delta / 1000:.1f} kB | {changed:.0f} ({100 * r['mean_density']:.1f}%) | {lag:.2f} "
          f"| {r['trajectories_dropped_stale']} | {r['trainer_wait']['total_seconds']:.1f} "
          f"| {steps[-1]['seconds']:.0f} |")
PY
