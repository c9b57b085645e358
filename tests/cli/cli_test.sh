#!/usr/bin/env bash
# End-to-end tests of the weft CLI on real safetensors files: cast, delta encode / apply / squash /
# inspect round trips bit for bit in every dtype and serving format, and clear errors on bad input.
# Usage: cli_test.sh WEFT MAKE_TEST_MODEL WORKDIR
set -uo pipefail
weft=$1 make_model=$2 work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$here/../test_lib.sh"

for v in 0 1 2 3; do "$make_model" m$v.safetensors 7 $v || exit 1; done

# Every dtype in the files (F32 weights and one tensor of each other dtype) round-trips.
expect_ok "$weft" delta encode m0.safetensors m1.safetensors -o d01
expect_ok "$weft" delta apply m0.safetensors d01 -o r1.safetensors
same m1.safetensors r1.safetensors
expect_ok "$weft" delta encode m1.safetensors m2.safetensors -o d12 --chunk-log2 10 --threads 2
expect_ok "$weft" delta apply m1.safetensors d12 -o r2.safetensors --threads 1
same m2.safetensors r2.safetensors

# Every serving format: cast each version, diff the served files, apply, compare bit for bit.
for target in bf16 fp16 fp8-e4m3 fp8-e5m2 "fp8-e4m3 --block 128" "fp8-e5m2 --block 64" "fp8-e4m3 --no-saturate"; do
  tag=${target// /_}
  for v in 0 1 2 3; do expect_ok "$weft" cast m$v.safetensors --to $target -o s$v.$tag; done
  expect_ok "$weft" delta encode s0.$tag s1.$tag -o d01.$tag
  expect_ok "$weft" delta encode s1.$tag s2.$tag -o d12.$tag
  expect_ok "$weft" delta encode s2.$tag s3.$tag -o d23.$tag
  expect_ok "$weft" delta apply s0.$tag d01.$tag -o r1.$tag
  same s1.$tag r1.$tag
  # Squash three deltas; the catch-up from version 0 lands on version 3 exactly.
  expect_ok "$weft" delta squash d01.$tag d12.$tag d23.$tag -o d03.$tag
  expect_ok "$weft" delta apply s0.$tag d03.$tag -o r3.$tag
  same s3.$tag r3.$tag
  expect_ok "$weft" delta inspect d03.$tag
  # Context-coded deltas round-trip too, and squash only on their base.
  expect_ok "$weft" delta encode s0.$tag s1.$tag -o c01.$tag --mode context
  expect_ok "$weft" delta encode s1.$tag s2.$tag -o c12.$tag --mode context
  expect_ok "$weft" delta apply s0.$tag c01.$tag -o q1.$tag
  same s1.$tag q1.$tag
  expect_ok "$weft" delta squash c01.$tag c12.$tag d23.$tag --base s0.$tag --mode context -o c03.$tag
  expect_ok "$weft" delta apply s0.$tag c03.$tag -o q3.$tag
  same s3.$tag q3.$tag
done
expect_ok "$weft" delta inspect c03.bf16
grep -q "format version" out.txt && ok || fail "inspect output lacks the format version"
grep -q "bits per change" out.txt && ok || fail "inspect output lacks bits per change"
expect_ok "$weft" delta inspect --json --tensors d01
grep -q '"density"' out.txt && ok || fail "inspect --json lacks density"

# FP8 casts carry their scale tensors.
expect_ok "$weft" cast m0.safetensors --to fp8-e4m3 --block 128 -o blocked
grep -aq 'q_proj.weight_scale_inv' blocked && ok || fail "no scale tensor in the FP8 file"

# Errors: clear, non-zero, naming the file and the problem; no output file left behind.
expect_error "is not the version" "$weft" delta apply m1.safetensors d01 -o bad.safetensors
expect_error "digest" "$weft" delta apply m1.safetensors d01 -o bad.safetensors
[ ! -e bad.safetensors ] && ok || fail "a refused apply wrote its output"
cp d01 corrupt && printf '\x55' | dd of=corrupt bs=1 seek=200 conv=notrunc 2>/dev/null
expect_error "corrupt" "$weft" delta apply m0.safetensors corrupt -o bad.safetensors
head -c 100 d01 > truncated
expect_error "truncated" "$weft" delta apply m0.safetensors truncated -o bad.safetensors
expect_error "not a weft delta" "$weft" delta inspect m0.safetensors
head -c 50 m0.safetensors > short.safetensors
expect_error "short.safetensors" "$weft" delta encode short.safetensors m1.safetensors -o x
expect_error "exceeds the file size" "$weft" cast short.safetensors --to bf16 -o x
expect_error "different dtype or shape" "$weft" delta encode m0.safetensors s0.bf16 -o x
expect_error "starts from digest" "$weft" delta squash d12.bf16 d01.bf16 -o x
expect_error "chunk size" "$weft" delta squash d01 d12 -o x
expect_error "needs the weights" "$weft" delta squash d01.bf16 d12.bf16 --mode context -o x
expect_error "is not what\|has digest" "$weft" delta squash d12.bf16 d23.bf16 --base s0.bf16 -o x
[ ! -e bad.safetensors ] && ok || fail "a failed command wrote its output"
if run "$weft" cast m0.safetensors --to int3 -o x; then fail "bad --to accepted"; else ok; fi

# Policy store over a directory: publish versions, list, pull from nothing and from an older copy.
same_data() {  # same tensors, bit for bit (headers may differ in metadata)
  if "$weft" delta encode "$1" "$2" -o same.delta > same.txt && grep -q " 0 of " same.txt; then ok; else fail "$1 and $2 hold different tensors"; fi
}
for v in 0 1 2 3; do expect_ok "$weft" store publish --store st --run r1 --keyframe-interval 2 s$v.bf16; done
grep -q "keyframe" out.txt && fail "version 3 should not need a keyframe: $(cat out.txt)" || ok
expect_ok "$weft" store ls --store st
grep -q "run r1: latest 3, 4 versions" out.txt && ok || fail "store ls: $(cat out.txt)"
expect_ok "$weft" store pull --store st --run r1 -o p3.safetensors
grep -q "keyframe v2 + 1 delta" out.txt && ok || fail "pull path: $(cat out.txt)"
same_data s3.bf16 p3.safetensors
expect_ok "$weft" store pull --store st --run r1 --version 1 -o p1.safetensors
same_data s1.bf16 p1.safetensors
expect_ok "$weft" store pull --store st --run r1 --have s2.bf16 -o q3.safetensors
grep -q "1 delta from v2" out.txt && ok || fail "pull --have path: $(cat out.txt)"
same_data s3.bf16 q3.safetensors
expect_error "the next version is 4" "$weft" store publish --store st --run r1 --version 9 s3.bf16
expect_error "different dtype or shape" "$weft" store publish --store st --run r1 m3.safetensors
expect_error "gave up after" "$weft" store pull --store http://127.0.0.1:1 --run r1 -o x --deadline 1s
expect_error "run id" "$weft" store pull --store st --run ../r1 -o x
expect_error "no published version" "$weft" store pull --store st --run nothing -o x
# Mistyped store URIs are refused and create nothing; reading a store that is not there is an
# error, and creates nothing either.
for typo in s3:/bucket/x s3:bucket s3//bucket http:/127.0.0.1:1 file:relative; do
  expect_error "s3://BUCKET/PREFIX" "$weft" store ls --store "$typo"
done
[ ! -e s3: ] && [ ! -e s3 ] && [ ! -e http: ] && [ ! -e file:relative ] && ok ||
  fail "a mistyped store URI created a directory"
expect_error "does not exist" "$weft" store ls --store "file://$PWD/nonexistent/x"
expect_error "does not exist" "$weft" store pull --store nonexistent --run r1 -o x
[ ! -e nonexistent ] && ok || fail "reading a store created its directory"
# A reader that pins what it pulled gets one catch-up delta when it comes back three versions later.
expect_ok "$weft" store publish --store st --run r2 s0.bf16
expect_ok "$weft" store pull --store st --run r2 --pin-as worker-7 -o w0.safetensors
for v in 1 2 3; do expect_ok "$weft" store publish --store st --run r2 s$v.bf16; done
expect_ok "$weft" store ls --store st --run r2
grep -q "pin worker-7: v0" out.txt && ok || fail "store ls lacks the pin: $(cat out.txt)"
expect_ok "$weft" store pull --store st --run r2 --have w0.safetensors --pin-as worker-7 -o w3.safetensors
grep -q "1 catch-up delta from v0" out.txt && ok || fail "pull of a pinned reader: $(cat out.txt)"
same_data s3.bf16 w3.safetensors
expect_ok "$weft" store ls --store st --run r2
grep -q "pin worker-7: v3" out.txt && ok || fail "the pin did not move: $(cat out.txt)"
expect_error "pin holder" "$weft" store pin --store st --run r2 --holder "a/b" --version 1
expect_error "has no version 9" "$weft" store pin --store st --run r2 --holder w --version 9
expect_ok "$weft" store pin --store st --run r2 --holder worker-7 --remove
# A publisher killed after version 2's manifest, before latest: other weights for version 2
# conflict until the version is discarded; `store ls` and `store recover` say so.
for v in 0 1 2; do expect_ok "$weft" store publish --store st --run r3 s$v.bf16; done
printf '1\n' > st/runs/r3/latest
expect_ok "$weft" store ls --store st --run r3
grep -q "latest 1, 2 versions and 1 never made latest (weft store recover --run r3)" out.txt && ok ||
  fail "store ls of an unpublished version: $(cat out.txt)"
expect_error "weft store recover --run r3" "$weft" store publish --store st --run r3 s3.bf16
expect_ok "$weft" store recover --store st --run r3
grep -q "runs/r3/versions/00000000000000000002.json" out.txt && ok || fail "recover: $(cat out.txt)"
expect_error "not both" "$weft" store recover --store st --run r3 --finish --discard
expect_ok "$weft" store recover --store st --run r3 --discard
expect_ok "$weft" store publish --store st --run r3 s3.bf16
expect_ok "$weft" store pull --store st --run r3 -o r3.safetensors
same_data s3.bf16 r3.safetensors
# Retention: with version 3 pinned (rebuilt from the keyframe at 2), versions 0 and 1 go.
expect_ok "$weft" store gc --store st --run r1 --pin 3 --dry-run
grep -q "would delete 2 versions" out.txt && ok || fail "gc dry run: $(cat out.txt)"
expect_ok "$weft" store gc --store st --run r1 --pin 3
grep -q "deleted 2 versions" out.txt && ok || fail "gc: $(cat out.txt)"
expect_ok "$weft" store pull --store st --run r1 -o after-gc.safetensors
same_data s3.bf16 after-gc.safetensors

# The same store served over HTTP: publish with the writer token, pull without one.
WEFT_STORE_TOKEN=let-me-in "$weft" store serve --store served --listen 127.0.0.1:0 > serve.txt 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
url=""
for _ in $(seq 100); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*' serve.txt || true)
  [ -n "$url" ] && break
  sleep 0.1
done
if [ -z "$url" ]; then
  fail "store server did not start: $(cat serve.txt)"
else
  for v in 0 1 2; do WEFT_STORE_TOKEN=let-me-in expect_ok "$weft" store publish --store "$url" --run r2 s$v.bf16; done
  expect_error "401" "$weft" store publish --store "$url" --run r2 s3.bf16
  expect_ok "$weft" store pull --store "$url" --run r2 --have s1.bf16 -o http2.safetensors
  grep -q "1 delta from v1" out.txt && ok || fail "pull over HTTP: $(cat out.txt)"
  same_data s2.bf16 http2.safetensors
  kill $server && wait $server 2>/dev/null
  grep -q "stopped" serve.txt && ok || fail "store server did not stop cleanly: $(cat serve.txt)"
fi
trap - EXIT

# A blob corrupted on disk (version 3's delta) is detected and named, and no output is written.
blob=$(grep -o '"sha256": *"[0-9a-f]*"' st/runs/r1/versions/00000000000000000003.json | grep -o '[0-9a-f]\{64\}')
printf '\x42' | dd of="st/blobs/$blob" bs=1 seek=30 conv=notrunc 2>/dev/null
rm -f bad.safetensors
expect_error "corrupted" "$weft" store pull --store st --run r1 --have s2.bf16 -o bad.safetensors
[ ! -e bad.safetensors ] && ok || fail "output written from a corrupted store"

# Run configs: every mistake is refused before anything starts, naming the key.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
expect_ok "$weft" run --help
good() { cat "$root/configs/local.yaml"; }
good | sed 's/^  steps: 150 .*/  stepz: 150/' > bad1.yaml
expect_error "trainer.stepz: unknown key (line" "$weft" run bad1.yaml
good | sed 's/name: eu-west/name: EU west/' > bad2.yaml
expect_error "regions\[1\].name: 'EU west' must be lower-case" "$weft" run bad2.yaml
good | sed 's/relay: 127.0.0.1:8182/relay: 127.0.0.1:8181/' > bad3.yaml
expect_error "regions\[1\].relay: 127.0.0.1:8181 is already taken" "$weft" run bad3.yaml
good | sed 's/^  learning_rate: 2e-5 .*/  learning_rate: fast/' > bad4.yaml
expect_error "trainer.learning_rate: 'fast' is not a number" "$weft" run bad4.yaml
good | sed 's/^  learning_rate: 2e-5 .*/&\n  optimizer: sgd/' > bad4b.yaml
expect_error "trainer.optimizer: 'sgd' is not an optimizer (known: adamw, muon) (line 54)" "$weft" run bad4b.yaml
good | sed 's/^  learning_rate: 2e-5 .*/&\n  delta_mode: zstd/' > bad4c.yaml
expect_error "trainer.delta_mode: 'zstd' is not a delta mode (known: plain, context) (line 54)" "$weft" run bad4c.yaml
good | sed 's/^  learning_rate: 2e-5 .*/&\n  learning_rate: 1e-3/' > bad4d.yaml
expect_error "trainer.learning_rate is given twice (lines 53 and 54): keep one of them" "$weft" run bad4d.yaml
printf 'name: a\nseed: 1\nname: b\n' > twice-sim.yaml
expect_error "name is given twice (lines 1 and 3)" "$weft" sim twice-sim.yaml
# Sizes the simulator cannot hold are refused before it starts, with its estimate.
printf 'extends: %s\ntrainer: {prompts_per_step: 10000000}\n' "$root/configs/sim/small.yaml" > huge-sim.yaml
expect_error "would hold about .* GiB: .* more than --max-memory 8GiB" "$weft" sim huge-sim.yaml
printf 'extends: %s\nduration: 9600h\n' "$root/configs/sim/small.yaml" > long-sim.yaml
expect_error "6912001 versions" "$weft" sim long-sim.yaml
printf 'extends: %s\nduration: 9601h\n' "$root/configs/sim/small.yaml" > longer-sim.yaml
expect_error "duration: must be at most 400 days" "$weft" sim longer-sim.yaml
printf 'extends: %s\ntrainer: {steps: 100000001}\n' "$root/configs/sim/small.yaml" > steps-sim.yaml
expect_error "trainer.steps: must be at most 100000000" "$weft" sim steps-sim.yaml
good | sed 's/^  max_staleness: 4 .*/  max_staleness: -1/' > bad5.yaml
expect_error "orchestrator.max_staleness" "$weft" run bad5.yaml
good | sed 's/^  dir: runs\/local .*/  dir: not-a-run/' > bad6.yaml
mkdir -p not-a-run && touch not-a-run/precious
expect_error "holds files weft run did not write" "$weft" run bad6.yaml
[ -e not-a-run/precious ] && ok || fail "weft run touched a directory it did not make"
expect_error "region 'mars' is not in" "$weft" worker --config "$root/configs/local.yaml" --cluster x --region mars
# Engines and tasks by name: an unknown one is refused, naming the known ones.
good | sed 's/^  engine: embedded .*/  engine: tgi/' > bad7.yaml
expect_error "no engine named 'tgi' (known: embedded, sglang, vllm)" "$weft" run bad7.yaml
expect_error "no engine named 'tgi'" "$weft" worker --config bad7.yaml --cluster x --region us-east
# A serving engine needs its replicas and the served checkpoint directory; its section's keys are
# checked before anything starts.
good | sed 's/^  engine: embedded .*/  engine: sglang/' > bad7b.yaml
expect_error "the sglang engine needs its replicas' URLs" "$weft" run bad7b.yaml
(good | sed 's/^  engine: embedded .*/  engine: vllm/'; echo "engine: {urls: [http://127.0.0.1:1], checkpoint_dir: /tmp/x, pause: in_place}") > bad7c.yaml
expect_error "engine.pause: 'in_place' is not a pause mode of vllm (abort, wait, keep)" "$weft" run bad7c.yaml
(good | sed 's/^  engine: embedded .*/  engine: vllm/'; echo "engine: {urls: [ftp://h:1], checkpoint_dir: /tmp/x}") > bad7d.yaml
expect_error "engine URL 'ftp://h:1' must start with http://" "$weft" worker --config bad7d.yaml --cluster x --region us-east
good | sed 's/^task: {kind: arithmetic, digits: 2}/task: {kind: chess, digits: 2}/' > bad8.yaml
expect_error "task.kind: 'chess' is not a task kind (known: arithmetic, http, trainer) (line 43)" "$weft" run bad8.yaml
expect_error "task.kind: 'chess' is not a task kind" "$weft" worker --config bad8.yaml --cluster x --region us-east
# Tasks by kind: configs that still name the task with `name` are told to write `kind`; each kind
# checks its own keys.
good | sed 's/^task: {kind: arithmetic, digits: 2}/task: {name: arithmetic, digits: 2}/' > bad9.yaml
expect_error "task.name (line 43): the task is chosen by \`kind\`; write task: {kind: arithmetic, ...}" "$weft" run bad9.yaml
task_error() {  # task_error PATTERN TASK: the config with `task: TASK` is refused with PATTERN
  good | sed "s|^task: {kind: arithmetic, digits: 2}|task: $2|" > bad10.yaml
  expect_error "$1" "$weft" run bad10.yaml
}
task_error "task.url is needed for kind http" "{kind: http, max_prompt_tokens: 7, max_tokens: 4}"
task_error "task.url (line 43): 'ftp://x/score' is not an http:// or https:// URL" \
  "{kind: http, url: ftp://x/score, max_prompt_tokens: 7, max_tokens: 4}"
task_error "task.timeout (line 43): 'soon' is not a duration" \
  "{kind: http, url: http://127.0.0.1:1/score, timeout: soon, max_prompt_tokens: 7, max_tokens: 4}"
task_error "task.retries must be 0 to 100" \
  "{kind: http, url: http://127.0.0.1:1/score, retries: 101, max_prompt_tokens: 7, max_tokens: 4}"
task_error "task.max_tokens is needed for kind trainer" "{kind: trainer, max_prompt_tokens: 7}"
task_error "task.stop_token: '-2' is not a token id" \
  "{kind: trainer, max_prompt_tokens: 7, max_tokens: 4, stop_token: -2}"
task_error "task.url: unknown key (line 43); known: dataset, digits, kind" \
  "{kind: arithmetic, url: http://127.0.0.1:1/score}"
task_error "the built-in trainer's problems of 2 digits with their answers need 11" \
  "{kind: trainer, max_prompt_tokens: 5, max_tokens: 4}"
good | sed 's/^model: {d_model: 96, layers: 3, heads: 4, d_ff: 384}/model: {d_model: 96, layers: 3, heads: 4, d_ff: 384, context: 10}/' > bad11.yaml
expect_error "model.context is 10 tokens; the task's sequences are up to 11 (max_prompt_tokens 7 + max_tokens 4)" "$weft" run bad11.yaml

echo "cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
