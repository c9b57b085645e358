#!/usr/bin/env bash
# The policy store under failures, across real processes:
#   - publishers killed with SIGKILL at random points leave the store readable, `latest` at a
#     complete version, and a rerun completes or conflicts cleanly;
#   - a store server or relay killed mid-transfer: the reader resumes when it comes back, and
#     fails with a clear error at its deadline when it does not;
#   - a corrupted blob in a relay's cache is detected, fetched again, and never reaches a reader;
#   - concurrent readers behind one relay make one upstream fetch per blob;
#   - a writable store server takes a model published through it (its uploads streamed to disk),
#     refuses a blob whose bytes do not match its name, and a relay answers 404 at once for a key
#     that names a directory upstream.
# Usage: failure_test.sh WEFT MAKE_TEST_MODEL WORKDIR
set -uo pipefail
weft=$1 make_model=$2 work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$here/../test_lib.sh"
pids=()
trap 'for p in "${pids[@]}"; do kill -9 $p 2>/dev/null; done' EXIT

for v in 0 1 2 3 4 5 6; do "$make_model" m$v.safetensors 11 $v big || exit 1; done

# start_server NAME COMMAND...: starts a weft server writing NAME.log, waits for its URL.
start_server() {
  local name=$1; shift
  : > $name.log  # here, not in the child: a restart's wait must not read the last run's log
  "$@" > $name.log 2>&1 &
  server_started $name $!
}
# http_get URL PATH: the body of a GET over bash's /dev/tcp (no curl needed).
http_get() {
  local hostport=${1#http://}
  exec 3<>/dev/tcp/${hostport%:*}/${hostport#*:}
  printf 'GET %s HTTP/1.0\r\nHost: x\r\n\r\n' "$2" >&3
  sed '1,/^\r$/d' <&3
  exec 3<&-
}
# http_raw URL REQUEST: the whole answer to REQUEST (printf %b escapes) over /dev/tcp, 5 s at most.
http_raw() {
  local hostport=${1#http://}
  timeout 5 bash -c 'exec 3<>/dev/tcp/${0%:*}/${0#*:}; printf "%b" "$1" >&3; cat <&3' "$hostport" "$2"
}
# stat_of JSON FIELD: a number from a flat JSON object.
stat_of() { grep -o "\"$2\":[0-9]*" <<< "$1" | cut -d: -f2; }

# --- 1. Publishers killed at random points -------------------------------------------------------
"$weft" store publish --store st --run r --keyframe-interval 3 m0.safetensors > /dev/null || exit 1
next=1
for round in $(seq 1 10); do
  model=m$(( (next % 6) + 1 )).safetensors
  "$weft" store publish --store st --run r --keyframe-interval 3 --version $next $model > /dev/null 2>&1 &
  victim=$!
  sleep 0.$(printf '%03d' $((RANDOM % 400)))
  kill -9 $victim 2>/dev/null
  wait $victim 2>/dev/null
  # Whatever the instant, the latest version is complete: it pulls, every blob and digest checked.
  latest=$("$weft" store ls --store st --run r | sed -n 's/^run r: latest \([0-9]*\),.*/\1/p')
  if [[ -n "$latest" ]] && "$weft" store pull --store st --run r -o after_kill.safetensors > pull.txt 2>&1; then ok
  else fail "round $round: store unreadable after killing the publisher: $(cat pull.txt)"; fi
  # A rerun completes the version, or (if the killed one finished) conflicts cleanly.
  if "$weft" store publish --store st --run r --keyframe-interval 3 --version $next $model > rerun.txt 2>&1; then ok
  elif grep -q "the next version is $((next + 1)), not $next" rerun.txt; then ok
  else fail "round $round: rerun neither completed nor conflicted cleanly: $(cat rerun.txt)"; fi
  next=$((next + 1))
done
"$weft" store pull --store st --run r -o direct.safetensors > /dev/null || fail "final pull failed"
[[ $("$weft" store ls --store st --run r | sed -n 's/^run r: latest \([0-9]*\),.*/\1/p') == 10 ]] && ok || fail "latest is not 10 after ten rounds"

# --- 2. A store server killed mid-transfer ----------------------------------------------------------
# A model of about 29 MB, more than loopback socket buffers hold: a killed server really cuts the
# transfer (a smaller one could sit whole in the kernel's buffers and arrive anyway).
"$make_model" huge.safetensors 13 0 huge || exit 1
"$weft" store publish --store hs --run h huge.safetensors > /dev/null || exit 1
start_server server "$weft" store serve --store hs --listen 127.0.0.1:0
port=${server_url##*:}
# At 10 MB/s the server dies 0.8 s in and is back 0.5 s later, on the same port.
"$weft" store pull --store $server_url --run h -o resumed.safetensors --shape-bandwidth 10MB > resumed.txt 2>&1 &
reader=$!
sleep 0.8
kill -9 $server_pid
sleep 0.5
start_server server "$weft" store serve --store hs --listen 127.0.0.1:$port
if wait $reader; then ok; else fail "pull did not survive a server restart: $(cat resumed.txt)"; fi
grep -q "downloads resumed" resumed.txt && ok || fail "the pull did not resume: $(cat resumed.txt)"
"$weft" store pull --store hs --run h -o direct_huge.safetensors > /dev/null
cmp -s resumed.safetensors direct_huge.safetensors && ok || fail "resumed pull differs from a direct one"

# Killed and gone for good: a clear error once the deadline passes, and no output file.
"$weft" store pull --store $server_url --run h -o never.safetensors --shape-bandwidth 10MB --deadline 4s > gone.txt 2>&1 &
reader=$!
sleep 0.8
kill -9 $server_pid
if wait $reader; then fail "pull from a dead server succeeded"
elif grep -q "gave up after .* tries in" gone.txt && grep -q "bytes had arrived" gone.txt && grep -q "Couldn't connect" gone.txt; then ok
else fail "unclear error from a dead server: $(cat gone.txt)"; fi
[[ ! -e never.safetensors ]] && ok || fail "a failed pull wrote its output"

# --- 3. A relay: single flight across processes, corrupted cache, killed mid-transfer ------------------
start_server server "$weft" store serve --store st --listen 127.0.0.1:0
start_server relay "$weft" relay --upstream $server_url --cache rcache --max-bytes 200MB --listen 127.0.0.1:0
readers=()
for i in 1 2 3 4; do
  "$weft" store pull --store $relay_url --run r -o via$i.safetensors > via$i.txt 2>&1 &
  readers+=($!)
done
for i in 1 2 3 4; do
  if wait ${readers[$((i - 1))]}; then ok; else fail "reader $i through the relay failed: $(cat via$i.txt)"; fi
  cmp -s via$i.safetensors direct.safetensors && ok || fail "reader $i through the relay got different bytes"
done
stats=$(http_get $relay_url /v1/stats)
one_reader=$(sed -n 's/.* \([0-9]*\) bytes downloaded.*/\1/p' via1.txt)
upstream=$(stat_of "$stats" upstream_bytes)
# Four readers, one copy of each blob from upstream (plus the small manifests).
if [[ -n "$upstream" && -n "$one_reader" ]] && (( upstream < one_reader * 3 / 2 )); then ok
else fail "four readers made the relay fetch $upstream bytes upstream, one reader needs $one_reader: $stats"; fi

# Corrupt the largest cached blob: the relay notices, refetches, the reader gets the right bytes.
victim=$(ls -S rcache/blobs | head -1)
printf 'garbage' | dd of=rcache/blobs/$victim bs=1 seek=1000 conv=notrunc 2> /dev/null
"$weft" store pull --store $relay_url --run r -o after_corruption.safetensors > corrupt.txt 2>&1 || fail "pull after cache corruption failed: $(cat corrupt.txt)"
cmp -s after_corruption.safetensors direct.safetensors && ok || fail "a corrupted cache reached a reader"
[[ $(stat_of "$(http_get $relay_url /v1/stats)" corrupted) == 1 ]] && ok || fail "the relay did not report the corrupted blob"
grep -q "corrupted on disk" relay.log && ok || fail "the relay did not log the corrupted blob"

# The relay killed mid-transfer (the reader's link to it shaped) and restarted on its cache.
relay_port=${relay_url##*:}
"$weft" store pull --store $relay_url --run r -o relay_resumed.safetensors --shape-bandwidth 3MB > relay_resumed.txt 2>&1 &
reader=$!
sleep 0.8
kill -9 $relay_pid
sleep 0.3
start_server relay "$weft" relay --upstream $server_url --cache rcache --max-bytes 200MB --listen 127.0.0.1:$relay_port
if wait $reader; then ok; else fail "pull did not survive a relay restart: $(cat relay_resumed.txt)"; fi
cmp -s relay_resumed.safetensors direct.safetensors && ok || fail "pull resumed through the relay differs"
[[ $(stat_of "$(http_get $relay_url /v1/stats)" upstream_bytes) -lt 100000 ]] && ok || fail "the restarted relay refetched what its cache held"

# A relay refuses writes and bad input.
WEFT_STORE_TOKEN=x "$weft" store publish --store $relay_url --run other m0.safetensors > write.txt 2>&1 && fail "the relay accepted a write" || ok
grep -q "read-only" write.txt && ok || fail "unclear refusal of a write: $(cat write.txt)"
"$weft" relay --upstream st --cache rc2 > bad.txt 2>&1 && fail "relay of a directory started" || ok
grep -q "must be an http" bad.txt && ok || fail "unclear error for a bad upstream: $(cat bad.txt)"
"$weft" store pull --store st --run r -o x --shape-bandwidth 10MB > bad.txt 2>&1 && fail "shaping a directory was accepted" || ok
grep -q "link shaping applies to http" bad.txt && ok || fail "unclear error for shaping a directory: $(cat bad.txt)"
"$weft" store pull --store $relay_url --run r -o x --shape-bandwidth fast > bad.txt 2>&1 && fail "a bad bandwidth was accepted" || ok
grep -q "'fast' is not a byte size" bad.txt && ok || fail "unclear error for a bad bandwidth: $(cat bad.txt)"

# --- 4. A writable store server, and what it and the relay refuse -------------------------------------
export WEFT_STORE_TOKEN=writer-token
start_server writable "$weft" store serve --store ws --listen 127.0.0.1:0
"$weft" store publish --store $writable_url --run w huge.safetensors > publish_http.txt 2>&1 || fail "publishing through the store server failed: $(cat publish_http.txt)"
"$weft" store pull --store ws --run w -o via_http.safetensors > /dev/null 2>&1 || fail "pulling what was published over HTTP failed"
cmp -s via_http.safetensors direct_huge.safetensors && ok || fail "a model published over HTTP differs"
[[ -z $(find ws -name '.*' -type f ! -name .lock) ]] && ok || fail "uploads left temporary files: $(find ws -name '.*')"
a_hash=$(printf 'a' | sha256sum | cut -d' ' -f1)
answer=$(http_raw $writable_url "PUT /v1/objects/blobs/$a_hash HTTP/1.0\r\nAuthorization: Bearer writer-token\r\nContent-Length: 1\r\n\r\nb")
grep -q "^HTTP/1.0 400" <<< "$answer" && grep -q "not to $a_hash" <<< "$answer" && ok || fail "a blob that does not match its name was not refused: $answer"
[[ ! -e ws/blobs/$a_hash ]] && ok || fail "a blob that does not match its name was stored"
answer=$(http_raw $writable_url "POST /livez HTTP/1.0\r\n\r\n")
grep -q "^HTTP/1.0 405" <<< "$answer" && grep -q "^Allow: GET, HEAD" <<< "$answer" && ok || fail "POST /livez was not refused with 405 and Allow: $answer"
unset WEFT_STORE_TOKEN
start=$SECONDS
answer=$(http_raw $relay_url "GET /v1/objects/runs/r HTTP/1.0\r\n\r\n")
grep -q "^HTTP/1.0 404" <<< "$answer" && (( SECONDS - start < 3 )) && ok || fail "the relay did not answer 404 at once for a directory key: $answer"
grep -q "$work" <<< "$answer" && fail "the relay's answer shows a path on the server: $answer" || ok

echo "store failures: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
