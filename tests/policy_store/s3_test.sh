#!/usr/bin/env bash
# The policy store on a real S3 service: a single-node Ceph RADOS Gateway started here
# (tests/s3/rgw.sh; ./test.sh installs Debian's Ceph packages), then, against it:
#   1. the object store contract and the S3 backend's own service suite (racing compare-and-swaps
#      and immutable writes, multipart uploads, ranged reads, paged listings, bad credentials);
#   2. the publisher and reader suites of the unit tests, on an s3:// store instead of a directory;
#   3. `weft store publish | pull | ls | pin | gc` from the command line, bytes checked against the
#      same run published to a directory;
#   4. a relay in front of S3, readers pulling through it;
#   5. four publishers racing for one version: exactly one wins, the others are told of a conflict;
#   6. a publisher killed with SIGKILL in the middle of a multipart upload: `latest` stays where it
#      was, nothing half-written is visible, a rerun completes, and `store gc` aborts the parts
#      the killed publisher left;
#   7. `weft run` with `store.uri` on S3: the trainer publishes there, the relay reads from it;
#   8. the Python package's publisher on S3;
#   9. `weft generate` with its dataset and output on S3, killed with kill -9 and run again.
# Usage: s3_test.sh WEFT SERVICE_TESTS STORE_TESTS MAKE_TEST_MODEL WORKDIR
set -uo pipefail
weft=$1 service_tests=$2 store_tests=$3 make_model=$4 work=$5
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rgw="$here/../s3/rgw.sh"
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$here/../test_lib.sh"
pids=()
# Its own slice, 31800-32767, below the ephemeral ports (32768 and up, which any outgoing
# connection may hold): the S3 service on `port`, the run of section 7 on the 450 above it.
port=$((31800 + RANDOM % 450))
cleanup() {
  for p in "${pids[@]}"; do kill -9 $p 2>/dev/null && wait $p 2>/dev/null; done
  bash "$rgw" stop "$work/rgw" >/dev/null 2>&1
}
trap cleanup EXIT

if ! command -v radosgw >/dev/null; then
  echo "FAIL: radosgw is not installed (./test.sh installs it: bash tests/s3/rgw.sh install)"
  exit 1
fi
RGW_OWNER_PID=$$ bash "$rgw" start "$work/rgw" $port weft-test || { echo "FAIL: RGW did not start"; exit 1; }
endpoint=http://127.0.0.1:$port

# Only what this script sets: no profile or endpoint of the machine's user leaks in.
export HOME=$work AWS_ACCESS_KEY_ID=WEFTTESTKEY AWS_SECRET_ACCESS_KEY=WEFTTESTSECRET
export AWS_REGION=us-east-1 AWS_ENDPOINT_URL=$endpoint
unset AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL_S3 AWS_DEFAULT_REGION AWS_CONFIG_FILE \
  AWS_SHARED_CREDENTIALS_FILE AWS_IGNORE_CONFIGURED_ENDPOINT_URLS
store=s3://weft-test/ci
# s3_get PATH: a signed GET of the service's own API (curl's signer), for what weft does not show
# (a valueless query parameter written "name=": curl 7.88 signs it as it is written).
s3_get() {
  curl -s --aws-sigv4 "aws:amz:us-east-1:s3" --user WEFTTESTKEY:WEFTTESTSECRET \
    -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "$endpoint$1"
}
uploads_under() { s3_get "/weft-test?uploads=" | grep -o "<Key>ci/$1[^<]*</Key>" | wc -l; }

# --- 1, 2. The suites ---------------------------------------------------------------------------
if WEFT_TEST_STORE=$store "$service_tests" > service.log 2>&1; then ok; else
  fail "the S3 service suite failed:"; tail -40 service.log
fi
grep -o "conditional completion of multipart uploads: [a-z]*" service.log | head -1
# (Less the one that checks what the publisher keeps in memory against the store byte for byte:
# thousands of requests, and nothing in it depends on the backend.)
if WEFT_TEST_STORE=$store "$store_tests" -tc='publish*,reader*' -tce='*come from memory*' \
  > suites.log 2>&1; then ok; else
  fail "the publisher and reader suites failed on S3:"; tail -40 suites.log
fi

# --- 3. The command line ------------------------------------------------------------------------
for v in 0 1 2 3; do "$make_model" m$v.safetensors 11 $v big || exit 1; done
for v in 0 1 2 3; do
  expect_ok "$weft" store publish --store $store --run cli --keyframe-interval 2 m$v.safetensors
  expect_ok "$weft" store publish --store dir --run cli --keyframe-interval 2 m$v.safetensors
done
expect_ok "$weft" store ls --store $store
if grep -q "run cli: latest 3, 4 versions" out.txt; then ok; else fail "store ls: $(cat out.txt)"; fi
expect_ok "$weft" store pull --store $store --run cli -o s3.safetensors
expect_ok "$weft" store pull --store dir --run cli -o dir.safetensors
same s3.safetensors dir.safetensors
expect_ok "$weft" store pull --store $store --run cli --have m1.safetensors --version 3 -o s3b.safetensors
same s3b.safetensors dir.safetensors
expect_ok "$weft" store pin --store $store --run cli --holder w1 --version 1
expect_ok "$weft" store gc --store $store --run cli --abandoned-uploads 1h
if grep -q "keeping versions from 0" out.txt; then ok; else fail "store gc kept: $(cat out.txt)"; fi
expect_ok "$weft" store pin --store $store --run cli --holder w1 --remove
expect_ok "$weft" store gc --store $store --run cli
if grep -q "keeping versions from 2; deleted 2 versions" out.txt; then ok; else
  fail "store gc: $(cat out.txt)"
fi
expect_ok "$weft" store pull --store $store --run cli --version 2 -o v2.safetensors
expect_error "no version 0" "$weft" store pull --store $store --run cli --version 0 -o v0.safetensors
# Bad settings: refused, naming what is wrong, never showing the secret.
expect_error "unknown option 'colour'" "$weft" store ls --store "$store?colour=red"
AWS_SECRET_ACCESS_KEY=wrong-secret-value run "$weft" store ls --store $store
if grep -q "SignatureDoesNotMatch" err.txt && ! grep -q "wrong-secret-value" err.txt out.txt; then ok; else
  fail "a wrong secret: $(cat err.txt)"
fi

# --- 4. A relay in front of S3 ------------------------------------------------------------------
"$weft" relay --upstream $store --cache relay-cache --listen 127.0.0.1:0 > relay.log 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q 'http://' relay.log && break; sleep 0.05; done
relay_url=$(grep -o 'on http://127.0.0.1:[0-9]*' relay.log | head -1 | cut -c4-)
if [[ -n $relay_url ]]; then ok; else fail "the relay did not start: $(cat relay.log)"; fi
expect_ok "$weft" store pull --store "$relay_url" --run cli -o relayed.safetensors
same relayed.safetensors dir.safetensors
expect_ok "$weft" store pull --store "$relay_url" --run cli -o relayed2.safetensors
same relayed2.safetensors dir.safetensors

# --- 5. Publishers racing for version 4 ---------------------------------------------------------
racers=()
for i in 1 2 3 4; do
  "$make_model" race$i.safetensors $((20 + i)) 4 big || exit 1
  "$weft" store publish --store $store --run cli --version 4 race$i.safetensors > race$i.out 2> race$i.err &
  racers+=($!)
done
won=0 lost=0 winner=0
for i in 1 2 3 4; do
  if wait ${racers[$((i - 1))]}; then won=$((won + 1)); winner=$i
  elif grep -q "already published differently\|the next version is" race$i.err; then lost=$((lost + 1))
  else fail "racer $i failed otherwise: $(cat race$i.err)"; fi
done
if [[ $won == 1 && $lost == 3 ]]; then ok; else fail "racing publishers: $won won, $lost lost"; fi
if [[ $won == 1 ]]; then
  # Version 4 serves the winner's model.
  expect_ok "$weft" store pull --store $store --run cli --version 4 -o v4.safetensors
  expect_ok "$weft" store publish --store dir --run cli race$winner.safetensors
  expect_ok "$weft" store pull --store dir --run cli --version 4 -o v4dir.safetensors
  same v4.safetensors v4dir.safetensors
fi

# --- 6. A publisher killed in the middle of a multipart upload ----------------------------------
"$make_model" huge0.safetensors 13 0 huge || exit 1
"$make_model" huge1.safetensors 13 1 huge || exit 1
big="$store?part_size=5MiB&multipart_threshold=5MiB&parallel=1"
expect_ok "$weft" store publish --store "$big" --run big huge0.safetensors
# Each request waits 300 ms (a shaped link): the next version's keyframe goes up in 6 parts, one
# at a time, so the upload is in flight for seconds.
"$weft" store publish --store "$big" --run big --keyframe-interval 1 --shape-latency 300ms \
  huge1.safetensors > killed.out 2>&1 &
victim=$!
pids+=($victim)
in_flight=0
for _ in $(seq 200); do
  if (( $(uploads_under blobs/) > 0 )); then in_flight=1; break; fi
  sleep 0.05
done
sleep 0.7  # a part or two uploaded
kill -9 $victim 2>/dev/null
wait $victim 2>/dev/null
if [[ $in_flight == 1 ]]; then ok; else fail "no multipart upload was seen in flight: $(cat killed.out)"; fi
left=$(uploads_under blobs/)
if (( left >= 1 )); then ok; else fail "the killed publisher's upload is not listed ($left)"; fi
expect_ok "$weft" store ls --store $store --run big
if grep -q "run big: latest 0, 1 versions" out.txt; then ok; else fail "after the kill: $(cat out.txt)"; fi
expect_ok "$weft" store pull --store $store --run big -o big0.safetensors
expect_ok "$weft" store publish --store dir --run big huge0.safetensors
expect_ok "$weft" store pull --store dir --run big -o dir-big0.safetensors
same big0.safetensors dir-big0.safetensors
expect_ok "$weft" store publish --store "$big" --run big --keyframe-interval 1 huge1.safetensors
expect_ok "$weft" store pull --store $store --run big -o big1.safetensors
expect_ok "$weft" store publish --store dir --run big huge1.safetensors
expect_ok "$weft" store pull --store dir --run big -o dir-big1.safetensors
same big1.safetensors dir-big1.safetensors
expect_ok "$weft" store gc --store $store --run big --abandoned-uploads 0s
if grep -q "aborted $left multipart uploads" out.txt; then ok; else fail "gc of uploads: $(cat out.txt)"; fi
if (( $(uploads_under "") == 0 )); then ok; else fail "uploads remain after gc: $(s3_get "/weft-test?uploads=")"; fi

# --- 7. weft run with its store on S3 ------------------------------------------------------------
# The trainer publishes to S3, the region's relay reads from it, the workers pull through the relay.
base=$((port + 450))
cat > run.yaml <<YAML
run: {id: on-s3, dir: $work/run, time_limit: 120s}
store: {uri: "$store"}
orchestrator:
  listen: 127.0.0.1:$((base + 1))
  max_staleness: 4
  cluster_timeout: 3s
  tick: 50ms
  max_wait: 2s
  tokens: {worker: w, trainer: t, admin: a}
regions:
  - {name: near, relay: 127.0.0.1:$((base + 2)), bandwidth: 50MB, latency: 2ms, workers: 2}
worker: {capacity: 2, heartbeat: 300ms}
model: {d_model: 32, layers: 2, heads: 2, d_ff: 64}
task: {digits: 1}
trainer:
  threads: 1
  warmup: {steps: 10, batch: 16}
  steps: 20
  prompts_per_step: 8
  samples_per_prompt: 4
  eval_problems: 20
  keyframe_interval: 8
YAML
if "$weft" run run.yaml > run.out 2>&1; then ok; else fail "weft run on S3: $(tail -5 run.out)"; fi
report=run/report.json
if [[ $(jq -r .completed $report) == true && $(jq -r .digest_mismatches $report) == 0 &&
      $(jq -r .staleness_violations $report) == 0 && $(jq -r .versions_published $report) == 21 ]]; then
  ok
else
  fail "the run on S3: $(jq -c '{completed, failure, digest_mismatches, staleness_violations, versions_published}' $report)"
fi
expect_ok "$weft" store ls --store $store --run on-s3
if grep -q "run on-s3: latest 20, 21 versions" out.txt; then ok; else fail "the run's versions on S3: $(head -2 out.txt)"; fi
if grep -q "with the store $store" run.out; then ok; else fail "weft run did not say it uses $store"; fi

# --- 8. The Python package publishing to S3 (where it is built) ------------------------------------
python_dir=$(dirname "$(dirname "$weft")")/python
if [[ -d $python_dir/weft ]] && /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  if PYTHONPATH=$python_dir /usr/bin/python3 - "$store" > python.out 2>&1 <<'PY'
import sys, torch, weft
publisher = weft.Publisher(sys.argv[1], "from-python", serving="bf16")
weights = {"w": torch.randn(64, 64, generator=torch.Generator().manual_seed(1))}
assert publisher.start(weights).version == 0
weights["w"] += 0.01
assert publisher.publish(weights).version == 1
PY
  then ok; else fail "the Python package on S3: $(tail -3 python.out)"; fi
  expect_ok "$weft" store pull --store $store --run from-python -o from-python.safetensors
else
  echo "s3_test: the Python package is not built here; its S3 check is skipped"
fi

# --- 9. weft generate with its dataset and output on S3 -----------------------------------------
# The dataset is read from the bucket; records are staged in the run directory and each shard is
# uploaded whole once full. weft generate is killed with kill -9 mid-run and run again: every
# (prompt, sample) is in the bucket once, in complete shards only.
gbase=$((port + 500))
prompts=4000 samples=2
gtotal=$((prompts * samples))
python3 - "$prompts" > prompts.jsonl <<'PY'
import random, sys
rng = random.Random(5)
for i in range(int(sys.argv[1])):
    print('{"id": %d, "prompt": "%d+%d="}' % (i, rng.randrange(10), rng.randrange(10)))
PY
s3_put() {  # s3_put FILE KEY
  curl -sf --aws-sigv4 "aws:amz:us-east-1:s3" --user WEFTTESTKEY:WEFTTESTSECRET \
    -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' -T "$1" "$endpoint/weft-test/$2"
}
s3_keys() { s3_get "/weft-test?list-type=2&prefix=${1//\//%2F}" | grep -o "<Key>[^<]*</Key>" | sed 's/<[^>]*>//g'; }
s3_put prompts.jsonl data/prompts.jsonl && ok || fail "could not put the dataset in the bucket"
gen_config() {  # gen_config SAMPLES OUTPUT
  cat <<YAML
run: {id: gen-s3, dir: $work/gen-run, time_limit: 300s}
store: {listen: 127.0.0.1:$gbase}
orchestrator:
  listen: 127.0.0.1:$((gbase + 1))
  cluster_timeout: 3s
  tick: 50ms
  max_wait: 2s
  tokens: {worker: w, trainer: t, admin: a}
regions:
  - {name: near, relay: 127.0.0.1:$((gbase + 2)), workers: 0, models: {adder: 1}}
fixed_models:
  - {name: adder, run: adder}
worker: {capacity: 1, heartbeat: 300ms}
model: {d_model: 32, layers: 2, heads: 2, d_ff: 64}
task: {digits: 1}
trainer: {warmup: {steps: 10, batch: 16}, eval_problems: 20, threads: 1}
generate:
  model: adder
  checkpoint: $work/adder.safetensors
  dataset: s3://weft-test/data/prompts.jsonl
  samples: $1
  output: $2
  shard_records: 1000
  min_reward: 1.0
  jobs_ahead: 64
YAML
}
gen_config $samples s3://weft-test/gen-out > gen.yaml
expect_ok "$weft" train --config gen.yaml --checkpoint adder.safetensors
"$weft" generate gen.yaml > gen1.out 2>&1 &
gen=$!
for _ in $(seq 1 1200); do  # a minute at most
  [[ $(s3_keys gen-out/ | grep -c jsonl) -ge 2 ]] && break
  kill -0 $gen 2> /dev/null || break
  sleep 0.05
done
[[ $(s3_keys gen-out/ | grep -c jsonl) -ge 2 ]] && ok || fail "no shard was uploaded: $(tail -3 gen1.out)"
kill -9 $gen
wait $gen 2> /dev/null
for _ in $(seq 1 300); do pgrep -f -- "$work/gen" > /dev/null || break; sleep 0.1; done
pkill -9 -f -- "$work/gen" 2> /dev/null
if "$weft" generate gen.yaml > gen2.out 2>&1; then ok; else fail "the rerun on S3 failed: $(tail -5 gen2.out)"; fi
before=$(grep -o "^weft generate gen.yaml: [0-9]* of" gen2.out | grep -o "[0-9]* of" | cut -d' ' -f1)
[[ -n $before && $before -gt 0 && $before -lt $gtotal ]] && ok ||
  fail "the rerun did not resume from what the first run wrote: $(head -2 gen2.out)"
rm -rf gen-out && mkdir gen-out
for key in $(s3_keys gen-out/); do s3_get "/weft-test/$key" > "gen-out/$(basename "$key")"; done
cat gen-out/part-*.jsonl gen-out/rejected-*.jsonl | jq -r '"\(.prompt_id) \(.sample)"' | sort > pairs.txt
python3 - "$prompts" "$samples" <<'PY' | sort > expected.txt
import sys
for i in range(int(sys.argv[1])):
    for s in range(int(sys.argv[2])):
        print("%d %d" % (i, s))
PY
cmp -s expected.txt pairs.txt && ok ||
  fail "the bucket does not hold every (prompt, sample) once: $(wc -l < pairs.txt) records, $(uniq -d pairs.txt | wc -l) twice"
[[ -z $(ls gen-run/output-staging | grep jsonl) ]] && ok ||
  fail "shards left in the staging directory: $(ls gen-run/output-staging)"
jq -e '.completed and .shards_uploaded > 0 and .output == "s3://weft-test/gen-out"' \
  gen-run/generate-report.json > /dev/null && ok || fail "report: $(cat gen-run/generate-report.json)"
# A complete output is left as it is, even with a shard still staged that was uploaded (a crash
# between its upload and its removal): the bucket's copy counts. Another run's output, or a prefix
# with other objects, is refused.
cp gen-out/rejected-00000.jsonl gen-run/output-staging/
expect_ok "$weft" generate gen.yaml
grep -q "$gtotal of $gtotal samples already in" out.txt && ok || fail "the complete rerun: $(head -2 out.txt)"
[[ ! -e gen-run/output-staging/rejected-00000.jsonl ]] && ok || fail "the uploaded shard stays staged"
gen_config 3 s3://weft-test/gen-out > gen3.yaml
expect_error "holds another run's records" "$weft" generate gen3.yaml
s3_put prompts.jsonl other/notes.txt
gen_config $samples s3://weft-test/other > gen4.yaml
expect_error "holds other/notes.txt, which weft generate did not write" "$weft" generate gen4.yaml
gen_config $samples s3://weft-test > gen5.yaml
expect_error "names a bucket, not an object under it" "$weft" generate gen5.yaml

echo "s3_test: $passed passed, $failed failed"
[[ $failed == 0 ]]
