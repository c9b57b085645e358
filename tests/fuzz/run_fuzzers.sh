#!/usr/bin/env bash
# Seeds and runs every fuzz target for a bounded time. Seeds are made fresh with the release
# build's tools and by the targets themselves (--write-seeds=DIR), so they always match the current
# formats and APIs.
# Usage: run_fuzzers.sh FUZZ_BUILD_DIR WEFT MAKE_TEST_MODEL SECONDS
set -euo pipefail
fuzz_build=$(cd "$1" && pwd) weft=$(realpath "$2") make_model=$(realpath "$3") seconds=$4
work="$fuzz_build/fuzz-work"
rm -rf "$work" && mkdir -p "$work"/{seeds-delta,seeds-safetensors,corpus-delta,corpus-sparse,corpus-safetensors}
for v in 0 1 2; do "$make_model" "$work/seeds-safetensors/m$v.safetensors" 3 $v small; done
for target in bf16 fp8-e4m3; do
  for v in 0 1 2; do "$weft" cast "$work/seeds-safetensors/m$v.safetensors" --to $target -o "$work/s$v.$target" > /dev/null; done
  "$weft" delta encode "$work/s0.$target" "$work/s1.$target" -o "$work/seeds-delta/d01.$target" > /dev/null
  "$weft" delta encode "$work/s1.$target" "$work/s2.$target" -o "$work/seeds-delta/d12.$target" --chunk-log2 10 > /dev/null
  "$weft" delta encode "$work/s0.$target" "$work/s1.$target" -o "$work/seeds-delta/c01.$target" --mode context > /dev/null
done
"$weft" delta encode "$work/seeds-safetensors/m0.safetensors" "$work/seeds-safetensors/m1.safetensors" \
  -o "$work/seeds-delta/d01.all" > /dev/null
# The orchestrator's files (journals and snapshots of a small run of the core) and valid requests
# to every endpoint of the servers, written by their targets.
for target in journal snapshot orchestrator_http store_http relay_http; do
  mkdir -p "$work/corpus-$target"
  "$fuzz_build/tests/fuzz/${target}_fuzz" --write-seeds="$work/seeds-$target"
done
# run TARGET RSS_LIMIT_MB CORPUS...: runs a target in the background, two at a time (each is one
# process on one core, for its full time), its report kept for the end. A failing input is kept as
# TARGET-crash-* (or -leak-, -timeout-, -oom-) in the work folder, and the script fails at the end.
targets=()
run() {
  local target=$1 rss=$2; shift 2
  targets+=("$target")
  while (($(jobs -rp | wc -l) >= 2)); do wait -n || true; done
  "$fuzz_build/tests/fuzz/$target" -max_total_time="$seconds" -rss_limit_mb="$rss" -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$work/$target-" "$@" > "$work/$target.log" 2>&1 &
}
cd "$work"
run delta_file_fuzz 4096 corpus-delta seeds-delta
run sparse_chunk_fuzz 4096 corpus-sparse
run safetensors_fuzz 4096 corpus-safetensors seeds-safetensors
run journal_fuzz 2048 corpus-journal seeds-journal
run snapshot_fuzz 2048 corpus-snapshot seeds-snapshot
run orchestrator_http_fuzz 2048 corpus-orchestrator_http seeds-orchestrator_http
run store_http_fuzz 2048 corpus-store_http seeds-store_http
run relay_http_fuzz 2048 corpus-relay_http seeds-relay_http
# libFuzzer exits non-zero and writes the failing input on a finding: the inputs written are the
# answer. (ls fails when any of its patterns matches nothing: what it lists is the answer.)
wait || true
failed=()
for target in "${targets[@]}"; do
  echo "fuzz: $target for $seconds s"
  grep -E "^(stat::number_of_executed_units|stat::new_units_added|==|SUMMARY|Done|[a-z_]+_fuzz: )" \
    "$work/$target.log" || true
  found=$(ls -d "$work/$target"-{crash,leak,timeout,oom}-* 2> /dev/null || true)
  if [[ -n $found ]]; then
    echo "fuzz: $target found a failing input:"; echo "$found"
    failed+=("$target")
  fi
done
if ((${#failed[@]} > 0)); then
  echo "fuzz: failing inputs found by ${failed[*]} (a target reruns one: TARGET FILE)"; exit 1
fi
echo "fuzz: no failures"
