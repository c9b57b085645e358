#!/usr/bin/env bash
# Seeds and runs every fuzz target for a bounded time. Seeds are made fresh with the release
# build's tools, so they always match the current formats.
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
done
"$weft" delta encode "$work/seeds-safetensors/m0.safetensors" "$work/seeds-safetensors/m1.safetensors" \
  -o "$work/seeds-delta/d01.all" > /dev/null
run() {
  local target=$1; shift
  echo "fuzz: $target for $seconds s"
  "$fuzz_build/tests/fuzz/$target" -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=65536 \
    -print_final_stats=1 "$@" 2>&1 | grep -E "^(stat::number_of_executed_units|stat::new_units_added|==|SUMMARY|Done)" || true
  # libFuzzer exits non-zero and writes crash-* files on a finding.
  if ls crash-* leak-* timeout-* oom-* > /dev/null 2>&1; then
    echo "fuzz: $target found a failing input:"; ls crash-* leak-* timeout-* oom-* 2>/dev/null; exit 1
  fi
}
cd "$work"
run delta_file_fuzz corpus-delta seeds-delta
run sparse_chunk_fuzz corpus-sparse
run safetensors_fuzz corpus-safetensors seeds-safetensors
echo "fuzz: no failures"
