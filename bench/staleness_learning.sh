#!/usr/bin/env bash
# What the staleness bound k (orchestrator.max_staleness) costs learning: runs GRPO on the example
# task (`weft run`) at each k and trainer seed, with the built-in trainer (configs/local.yaml) and
# the PyTorch trainer (configs/local-torch.yaml), all at the same rollout budget (trainer.steps,
# prompts_per_step, samples_per_prompt as in the configs, or STEPS for all), one run after another.
# Each run's config is the repository's config with only run.id, run.dir (under OUT), the listen
# and relay ports (moved to 9300-9399, clear of the configs' 8170-8183 / 8270-8283),
# orchestrator.max_staleness, trainer.seed, (torch) trainer.command / PYTHONPATH and, with STEPS,
# trainer.steps changed. Then `weft sim` predicts the same shape at each k: configs/sim/local.yaml
# with max_staleness changed ("plain"), and the same extended with the pace, model size and
# densities one real run of each trainer measured (as tests/sim/crosscheck.sh does: "calibrated").
# Last, bench/staleness_learning_table.py prints a markdown table (accuracy after per seed and
# mean, final reward, trainer idle fraction, stale drops, mean lag, and the simulator's figures per
# k) and writes OUT/results.tsv, OUT/results.json and the table as OUT/table.markdown.
#
# Usage: bench/staleness_learning.sh WEFT OUT [--ks "0 1 2 4 8"] [--seeds "1 2 3"]
#            [--trainers "builtin torch"] [--steps N] [--torch-trainer DIR] [--weft-python DIR]
#            [--redo] [--table-only]
#   WEFT     the weft binary (copy it out of build/ if build/ may change while this runs)
#   OUT      the output folder (created; runs go to OUT/runs/TRAINER-kK-sSEED/)
#   The same settings from the environment: KS, SEEDS, TRAINERS, STEPS, TORCH_TRAINER (default
#   examples/torch_trainer), WEFT_PYTHON (the weft Python package folder, default build/python),
#   SIM_REFERENCE_K (the k of the run the calibrated simulation takes its pace from; default 4, its
#   first seed; another completed run of that trainer when that one is missing).
#   A run whose report says completed is not run again unless --redo (so a sweep can be resumed
#   or extended); --table-only only redoes the simulations and the table.
#   Runs take about 2-3 minutes each on two cores; the runs are started from the repository root
#   (the trainer command's working directory).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

[ $# -ge 2 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
weft=$(realpath "$1") out=$2
shift 2
ks=${KS:-0 1 2 4 8}
seeds=${SEEDS:-1 2 3}
trainers=${TRAINERS:-builtin torch}
steps=${STEPS:-}
torch_trainer=${TORCH_TRAINER:-$repo/examples/torch_trainer}
weft_python=${WEFT_PYTHON:-$repo/build/python}
ref_k=${SIM_REFERENCE_K:-4}
redo=0 table_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --ks) ks=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --trainers) trainers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --torch-trainer) torch_trainer=$2; shift 2 ;;
    --weft-python) weft_python=$2; shift 2 ;;
    --redo) redo=1; shift ;;
    --table-only) table_only=1; shift ;;
    *) echo "staleness_learning.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$weft" ] || { echo "staleness_learning.sh: $weft is not executable" >&2; exit 2; }
for t in $trainers; do
  case $t in builtin|torch) ;; *) echo "staleness_learning.sh: trainer $t: builtin or torch" >&2; exit 2 ;; esac
done
mkdir -p "$out/runs" "$out/sim"
out=$(realpath "$out")
torch_trainer=$(realpath "$torch_trainer")
weft_python=$(realpath "$weft_python")
py=/usr/bin/python3

# make_config TRAINER K SEED NAME: the run's config on stdout, by substitution on the known lines
# of the repository's config (checked by reading it back), so comments and number spellings stay.
make_config() {
  local src=$repo/configs/local.yaml base=8170 to=9300
  if [ "$1" = torch ]; then src=$repo/configs/local-torch.yaml base=8270 to=9350; fi
  SRC=$src BASE=$base TO=$to K=$2 SEED=$3 NAME=$4 DIR=$out/runs/$4/run STEPS=$steps \
  TORCH_TRAINER=$torch_trainer WEFT_PYTHON=$weft_python $py - <<'PY'
import os, re, sys
e = os.environ
text = open(e["SRC"]).read()
def sub(pattern, repl, count=1):
    global text
    text, n = re.subn(pattern, repl, text, flags=re.M)
    if n != count:
        sys.exit(f"staleness_learning.sh: {e['SRC']}: {pattern!r} matched {n} times, not {count}")
base, to = int(e["BASE"]), int(e["TO"])
def port(m):
    p = int(m.group(1))
    if not 0 <= p - base < 50:
        sys.exit(f"staleness_learning.sh: port {p} outside {base}..{base + 49}")
    return f"127.0.0.1:{p - base + to}"
sub(r"127\.0\.0\.1:(\d+)", port, 5)
sub(r"^(  id:) \S+", rf"\1 {e['NAME']}")
sub(r"^(  dir:) \S+", rf"\1 {e['DIR']}")
sub(r"^(  max_staleness:) \d+", rf"\1 {e['K']}")
sub(r"^(  seed:) \d+", rf"\1 {e['SEED']}")
if e["STEPS"]:
    sub(r"^(  steps:) \d+", rf"\1 {e['STEPS']}")
if "command:" in text:
    sub(r"^(  command:) .*$", rf"\1 [/usr/bin/python3, {e['TORCH_TRAINER']}/train.py]")
    sub(r"^(  env:) .*$", rf"\1 {{PYTHONPATH: {e['WEFT_PYTHON']}}}")
sys.stdout.write(text)
PY
}

# check_config FILE K SEED: what the config says about the bound, the seed and the ports.
check_config() {
  grep -q "^  max_staleness: $2\b" "$1" || { echo "check_config: $1: max_staleness is not $2" >&2; return 1; }
  grep -q "^  seed: $3\b" "$1" || { echo "check_config: $1: seed is not $3" >&2; return 1; }
  if grep -o '127\.0\.0\.1:[0-9]*' "$1" | cut -d: -f2 | grep -qv '^93[0-9][0-9]$'; then
    echo "check_config: $1: a port outside 9300-9399" >&2
    return 1
  fi
}

ports_free() {  # every port of the config unused
  local p
  for p in $(grep -o '127\.0\.0\.1:93[0-9][0-9]' "$1" | cut -d: -f2); do
    if ss -ltn "sport = :$p" 2>/dev/null | grep -q LISTEN; then echo "$p"; return 1; fi
  done
}

run_one() {  # TRAINER K SEED
  local name=$1-k$2-s$3
  local d=$out/runs/$name
  if [ "$redo" = 0 ] && [ -f "$d/run/report.json" ] && [ "$(jq -r .completed "$d/run/report.json" 2>/dev/null)" = true ]; then
    echo "== $name: done already ($(cat "$d/wall_seconds" 2>/dev/null || echo ?) s)"
    return 0
  fi
  mkdir -p "$d"
  rm -f "$d/wall_seconds" "$d/rc"
  make_config "$1" "$2" "$3" "$name" > "$d/config.yaml"
  check_config "$d/config.yaml" "$2" "$3"
  local busy tries=0
  while ! busy=$(ports_free "$d/config.yaml"); do
    tries=$((tries + 1))
    [ $tries -le 30 ] || { echo "== $name: port $busy still in use after 60 s; skipped"; echo 98 > "$d/rc"; return 0; }
    sleep 2
  done
  echo "== $name: started $(date -u +%H:%M:%S)"
  local t0 t1 rc=0
  t0=$(date +%s.%N)
  (cd "$repo" && exec "$weft" run "$d/config.yaml") > "$d/run.log" 2>&1 < /dev/null || rc=$?
  t1=$(date +%s.%N)
  echo "$rc" > "$d/rc"
  $py -c "print(round($t1 - $t0, 1))" > "$d/wall_seconds"
  if [ "$rc" -ne 0 ]; then
    echo "== $name: FAILED (exit $rc) after $(cat "$d/wall_seconds") s; log tail:"
    tail -n 15 "$d/run.log" | tr '\r' '\n' | tail -n 15 | sed 's/^/   | /'
  else
    echo "== $name: done in $(cat "$d/wall_seconds") s: $(jq -r '"accuracy \(.eval_accuracy_before) -> \(.eval_accuracy_after), dropped stale \(.trajectories_dropped_stale)"' "$d/run/report.json")"
  fi
}

if [ "$table_only" = 0 ]; then
  for t in $trainers; do
    for k in $ks; do
      for s in $seeds; do
        run_one "$t" "$k" "$s"
      done
    done
  done
fi

# The simulator's prediction per k. plain: configs/sim/local.yaml (the shape of configs/local.yaml)
# with max_staleness changed; its pace is the simulator's default (long 70B-style generations),
# so it only says what the shape allows. calibrated-TRAINER: the same extended with what the
# reference run of that trainer measured, as tests/sim/crosscheck.sh builds it.
sim_one() {  # VARIANT K SEED FILE
  local o=$out/sim/$1-k$2/seed$3
  mkdir -p "$o"
  if ! "$weft" sim "$4" --seed "$3" --out "$o" > "$o/sim.out" 2>&1; then
    echo "== sim $1 k=$2 seed $3 failed:"; tail -n 5 "$o/sim.out" | sed 's/^/   | /'
  fi
}
for k in $ks; do
  d=$out/sim/plain-k$k
  mkdir -p "$d"
  sed -e "s/^name: .*/name: plain-k$k/" -e "s/^\(  max_staleness:\) [0-9]*/\1 $k/" \
    "$repo/configs/sim/local.yaml" > "$d/sim.yaml"
  if [ -n "$steps" ]; then sed -i "s/^\(  steps:\) [0-9]*/\1 $steps/" "$d/sim.yaml"; fi
  for s in $seeds; do sim_one plain "$k" "$s" "$d/sim.yaml"; done
done
first_seed=${seeds%% *}
for t in $trainers; do
  ref=$out/runs/$t-k$ref_k-s$first_seed/run/report.json
  if ! [ -f "$ref" ] || [ "$(jq -r .completed "$ref")" != true ]; then
    ref=
    for r in "$out"/runs/"$t"-k*/run/report.json; do
      if [ -f "$r" ] && [ "$(jq -r .completed "$r")" = true ]; then ref=$r; break; fi
    done
  fi
  [ -n "$ref" ] || { echo "== no completed $t run to calibrate the simulation on"; continue; }
  echo "$ref" > "$out/sim/calibrated-$t.reference"
  for k in $ks; do
    d=$out/sim/calibrated-$t-k$k
    mkdir -p "$d"
    bash "$repo/tests/sim/calibrated_sim.sh" "$ref" "$out/sim/plain-k$k/sim.yaml" \
      "calibrated-$t-k$k" > "$d/sim.yaml"
    for s in $seeds; do sim_one "calibrated-$t" "$k" "$s" "$d/sim.yaml"; done
  done
done

$py "$here/staleness_learning_table.py" "$out" --ks "$ks" --seeds "$seeds" --trainers "$trainers"
