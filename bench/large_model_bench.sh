#!/usr/bin/env bash
# Runs bench/large_model_bench with its S3 part, against a single-node Ceph RADOS Gateway started
# for it (tests/s3/rgw.sh, which installs Debian's Ceph packages first if they are missing; its OSD on
# BlueStore, the data on disk, sized for the model).
#   bash bench/large_model_bench.sh BUILD_DIR [--gib N] [other large_model_bench arguments]
set -euo pipefail
build=$(cd "${1:?usage: large_model_bench.sh BUILD_DIR [--gib N] [...]}" && pwd)
shift
gib=4
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [ "${args[$i]}" = --gib ]; then gib=${args[$((i + 1))]}; fi
done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rgw="$here/../tests/s3/rgw.sh"
dir=$(mktemp -d /tmp/weft-large-s3-XXXXXX)
rmdir "$dir"
port=$((19000 + RANDOM % 900))  # below the ephemeral ports (32768 and up)
bash "$rgw" install
# Room for the keyframe and the deltas the pulls read, twice over.
store_bytes=$(awk -v g="$gib" 'BEGIN { printf "%.0f", (g * 3 + 2) * 1073741824 }')
RGW_OSD_STORE=bluestore RGW_STORE_BYTES=$store_bytes RGW_OWNER_PID=$$ bash "$rgw" start "$dir" $port weft-bench
trap 'bash "$rgw" stop "$dir" >/dev/null 2>&1' EXIT
AWS_ACCESS_KEY_ID=WEFTTESTKEY AWS_SECRET_ACCESS_KEY=WEFTTESTSECRET AWS_REGION=us-east-1 \
  "$build/bench/large_model_bench" --s3 "s3://weft-bench/large?endpoint=http://127.0.0.1:$port" "$@"
