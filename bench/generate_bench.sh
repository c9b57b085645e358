#!/usr/bin/env bash
# The orchestration's overhead in `weft generate`: its samples per second (once the first sample
# arrived; run/generate-report.json) against the embedded engine's own throughput in one process
# (build/bench/engine_throughput, one thread per core and one per job slot of the run), on the same
# checkpoint, prompts, samples per prompt and sampling. The checkpoint is configs/local.yaml's
# policy after its warm-up (weft train --checkpoint); the run is configs/generate-local.yaml with
# PROMPTS generated prompts (default 10000) and its files in WORKDIR.
# Usage: bench/generate_bench.sh [WORKDIR] [PROMPTS]   (after ./setup.sh; from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
weft=$PWD/build/cli/weft
work=$(realpath -m "${1:-runs/generate-bench}")
prompts=${2:-10000}
rm -rf "$work" && mkdir -p "$work"
python3 - "$prompts" > "$work/prompts.jsonl" <<'PY'
import random, sys
rng = random.Random(11)
for i in range(int(sys.argv[1])):
    print('{"id": %d, "prompt": "%d+%d="}' % (i, rng.randrange(100), rng.randrange(100)))
PY
"$weft" train --config configs/local.yaml --checkpoint "$work/adder.safetensors" | tail -1
sed -e "s#dir: runs/gen-local #dir: $work/run #" \
    -e "s#checkpoint: runs/adder.safetensors#checkpoint: $work/adder.safetensors#" \
    -e "s#dataset: examples/data/addition-prompts.jsonl#dataset: $work/prompts.jsonl#" \
    -e "s#output: runs/gen-local/out#output: $work/out#" \
    configs/generate-local.yaml > "$work/generate.yaml"
samples=$(sed -n 's/^  samples: \([0-9]*\).*/\1/p' "$work/generate.yaml")
workers=$(grep -o 'models: {adder: [0-9]*}' "$work/generate.yaml" | grep -o '[0-9]*}' | tr -d '}' |
          paste -sd+ | python3 -c 'print(eval(input()))')
capacity=$(sed -n 's/^  capacity: \([0-9]*\).*/\1/p' "$work/generate.yaml")
slots=$((workers * capacity))
"$weft" generate "$work/generate.yaml" | tail -1
run=$(jq .samples_per_second "$work/run/generate-report.json")
cores=$(nproc)
line() { build/bench/engine_throughput "$work/adder.safetensors" "$work/prompts.jsonl" "$samples" "$1" \
           96 3 4 384 2; }
base_cores=$(line "$cores" | tee /dev/stderr | sed 's/.* \([0-9.]*\) samples\/s$/\1/')
base_slots=$(line "$slots" | tee /dev/stderr | sed 's/.* \([0-9.]*\) samples\/s$/\1/')
printf '\n| what | samples/s |\n| --- | --- |\n'
printf '| embedded engine, one process, %d threads (one per core) | %.0f |\n' "$cores" "$base_cores"
printf '| embedded engine, one process, %d threads (one per job slot of the run) | %.0f |\n' "$slots" "$base_slots"
printf '| weft generate (%d workers, capacity %d, with the orchestrator, relays and store server) | %.0f |\n' \
  "$workers" "$capacity" "$run"
python3 -c "best = max($base_cores, $base_slots); print('weft generate runs at %.1f%% of the best '
            'single-process figure (overhead %.1f%%)' % (100 * $run / best, 100 - 100 * $run / best))"
