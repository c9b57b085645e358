#!/usr/bin/env bash
# An object larger than 2 GiB served and relayed by processes that could not hold it: a model of
# 2 GiB and a little more (one keyframe blob) is published to a directory, served by
# `weft store serve` and relayed by `weft relay`, each in a memory cgroup of 512 MiB (or, where
# this machine makes none, under an address-space limit of 1.5 GiB), and pulled through both,
# two readers at once through the relay and a plain GET of the blob besides. The pulled models
# must equal the published file bit for bit, the relay must have fetched the blob once, and the
# peak resident memory of the server and the relay must stay within 256 MiB.
# Usage: large_object_test.sh WEFT WORKDIR
set -uo pipefail
weft=$1 work=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$here/../test_lib.sh"
pids=()
cgroups=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 $p 2> /dev/null; done
  wait 2> /dev/null
  for c in "${cgroups[@]}"; do rmdir "$c" 2> /dev/null; done
  cd / && rm -rf "$work"
}
trap cleanup EXIT

# A safetensors file of COUNT BF16 tensors of ELEMENTS each (and one of 8), with bytes from a
# keyed stream: make_model OUT COUNT ELEMENTS.
make_model() {
  local out=$1 count=$2 elements=$3 header="{" offset=0 i name length
  for ((i = 0; i < count; i++)); do
    name=$(printf 'w%02d' $i)
    header+="\"$name\":{\"dtype\":\"BF16\",\"shape\":[$elements],\"data_offsets\":[$offset,$((offset + elements * 2))]},"
    offset=$((offset + elements * 2))
  done
  header+="\"z\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[$offset,$((offset + 16))]}}"
  offset=$((offset + 16))
  while ((${#header} % 8 != 0)); do header+=" "; done
  length=${#header}
  printf "$(printf '\\x%02x' $((length & 255)) $((length >> 8 & 255)) $((length >> 16 & 255)) 0 0 0 0 0)" > "$out"
  printf '%s' "$header" >> "$out"
  openssl enc -aes-128-ctr -nosalt -pbkdf2 -pass pass:weft < /dev/zero 2> /dev/null | head -c $offset >> "$out"
}

# limited NAME COMMAND...: starts a weft server writing NAME.log with at most 512 MiB of memory,
# and waits for its URL (NAME_url, NAME_pid).
# (LARGE_OBJECT_LIMIT=address-space tries the fallback where cgroups could be made.)
limit_kind=none
cgroup_root=""
if [ "${LARGE_OBJECT_LIMIT:-}" = address-space ]; then
  limit_kind=address-space
elif mkdir /sys/fs/cgroup/memory/weft-probe-$$ 2> /dev/null; then
  rmdir /sys/fs/cgroup/memory/weft-probe-$$
  limit_kind=cgroup cgroup_root=/sys/fs/cgroup/memory
elif grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2> /dev/null &&
  mkdir /sys/fs/cgroup/weft-probe-$$ 2> /dev/null; then
  rmdir /sys/fs/cgroup/weft-probe-$$
  limit_kind=cgroup2 cgroup_root=/sys/fs/cgroup
else
  limit_kind=address-space
fi
limited() {
  local name=$1
  shift
  : > $name.log  # here, not in the child: the wait below must not read an earlier run's log
  if [ $limit_kind = cgroup ] || [ $limit_kind = cgroup2 ]; then
    local group=$cgroup_root/weft-large-$$-$name
    mkdir "$group" || exit 1
    cgroups+=("$group")
    if [ $limit_kind = cgroup ]; then
      echo $((512 << 20)) > "$group/memory.limit_in_bytes"
    else
      echo $((512 << 20)) > "$group/memory.max"
    fi
    (echo $BASHPID > "$group/cgroup.procs" && exec "$@") > $name.log 2>&1 &
  else
    MALLOC_ARENA_MAX=2 prlimit --as=$((1536 << 20)) -- "$@" > $name.log 2>&1 &
  fi
  server_started $name $!
}
# peak_mib PID: the process's peak resident memory, in MiB.
peak_mib() { echo $(($(awk '/^VmHWM:/ {print $2}' /proc/$1/status) / 1024)); }

echo "memory limit: $limit_kind"
make_model model.safetensors 16 $((64 << 20))  # 16 tensors of 128 MiB: 2 GiB and 16 bytes
size=$(stat -c %s model.safetensors)
[ "$size" -gt $((2 << 30)) ] && ok || fail "the model is only $size bytes"
expect_ok "$weft" store publish --store store --run big model.safetensors
blob=$(ls store/blobs)
[ "$(stat -c %s store/blobs/$blob)" = "$size" ] && ok || fail "the keyframe is not one blob of $size bytes"

limited serve "$weft" store serve --store store --listen 127.0.0.1:0 --threads 2
limited relay "$weft" relay --upstream "$serve_url" --cache relay-cache --max-bytes 8GiB \
  --listen 127.0.0.1:0 --threads 2
[ -n "$serve_url" ] && [ -n "$relay_url" ] && ok || fail "the servers did not start: $(cat serve.log relay.log)"

# Two readers through the relay and a plain GET of the blob, all at once; one reader directly.
"$weft" store pull --store "$relay_url" --run big -o a.safetensors > a.txt 2>&1 &
reader_a=$!
"$weft" store pull --store "$relay_url" --run big -o b.safetensors > b.txt 2>&1 &
reader_b=$!
curl -sf "$relay_url/v1/objects/blobs/$blob" | openssl dgst -sha256 -r | cut -d' ' -f1 > get.txt &
getter=$!
wait $reader_a && ok || fail "pull through the relay: $(cat a.txt)"
wait $reader_b && ok || fail "second pull through the relay: $(cat b.txt)"
wait $getter
[ "$(cat get.txt)" = "$blob" ] && ok || fail "a GET through the relay hashes to $(cat get.txt)"
cmp -s model.safetensors a.safetensors && ok || fail "the model pulled through the relay differs"
cmp -s model.safetensors b.safetensors && ok || fail "the second model pulled through the relay differs"
rm -f a.safetensors b.safetensors
expect_ok "$weft" store pull --store "$serve_url" --run big -o c.safetensors
cmp -s model.safetensors c.safetensors && ok || fail "the model pulled from the store server differs"
rm -f c.safetensors

# One upstream fetch of the blob for all three readers.
stats=$(curl -sf "$relay_url/v1/stats")
upstream=$(grep -o '"upstream_bytes":[0-9]*' <<< "$stats" | cut -d: -f2)
[ "$upstream" -ge "$size" ] && [ "$upstream" -lt $((size + (1 << 20))) ] && ok ||
  fail "the relay fetched $upstream bytes upstream for a blob of $size: $stats"
serve_peak=$(peak_mib $serve_pid)
relay_peak=$(peak_mib $relay_pid)
echo "peak resident memory: store server $serve_peak MiB, relay $relay_peak MiB"
[ "$serve_peak" -le 256 ] && ok || fail "the store server's peak was $serve_peak MiB"
[ "$relay_peak" -le 256 ] && ok || fail "the relay's peak was $relay_peak MiB"
kill $serve_pid $relay_pid 2> /dev/null
echo "large object: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
