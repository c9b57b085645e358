#!/usr/bin/env bash
# Runs bench/s3_bench against a single-node Ceph RADOS Gateway started for it (tests/s3/rgw.sh, its
# OSD on BlueStore: the data on disk, as the store server keeps it),
# which installs Debian's Ceph packages first if they are missing).
#   bash bench/s3_bench.sh BUILD_DIR [--quick]
set -euo pipefail
build=$(cd "${1:?usage: s3_bench.sh BUILD_DIR [--quick]}" && pwd)
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rgw="$here/../tests/s3/rgw.sh"
dir=$(mktemp -d /tmp/weft-s3-bench-XXXXXX)
rmdir "$dir"
port=$((19000 + RANDOM % 900))  # below the ephemeral ports (32768 and up)
bash "$rgw" install
RGW_OSD_STORE=bluestore RGW_OWNER_PID=$$ bash "$rgw" start "$dir" $port weft-bench
trap 'bash "$rgw" stop "$dir" >/dev/null 2>&1' EXIT
AWS_ACCESS_KEY_ID=WEFTTESTKEY AWS_SECRET_ACCESS_KEY=WEFTTESTSECRET AWS_REGION=us-east-1 \
  "$build/bench/s3_bench" "s3://weft-bench/bench?endpoint=http://127.0.0.1:$port" "$@"
