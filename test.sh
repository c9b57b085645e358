#!/usr/bin/env bash
# Builds everything and runs the whole test suite:
#   0. the source checks: the formatting (.clang-format), the dependency direction between the
#      libraries (tests/check_layering.sh) and the references in code and docs
#      (tests/check_references.sh);
#   1. the doctest suites (with the orchestrator's corruption sweep), the Python package's pytest
#      suite (with the PyTorch trainer's tests) and the end-to-end tests
#      (ctest, release build: the CLI, the policy store under failures, weft run, weft run with
#      trainer commands, the PyTorch model against the C++ engine, a region partitioned through
#      weft_fault_proxy, the S3 backend against a Ceph RADOS Gateway started for it, a deployment
#      through a single-node Slurm started for it, the Kubernetes manifests against the API's
#      schemas, a Prometheus server scraping weft run and the dashboard in headless Chromium),
#      and the sync
#      suite again with the AVX-512 paths off
#      and with every SIMD path off (WEFT_CPU=avx2, scalar);
#   2. the unit suites again under AddressSanitizer + UndefinedBehaviorSanitizer, and the suites
#      with threads of their own under
#      ThreadSanitizer (the thread pool and HTTP plumbing, the store server, the orchestrator
#      service, the rollout worker); both trees are unity builds (each library's and suite's
#      sources compiled as one file), which builds them in about two thirds of the time, and
#      they build in the background at the lowest priority while stage 1 runs;
#   3. the libFuzzer targets, built in the AddressSanitizer tree (delta files, sparse chunks,
#      safetensors, the orchestrator's journal and snapshots, the HTTP request path of the
#      orchestrator, store server and relay) for a bounded time each, under an RSS limit.
# With --quick, the tier for iterating (a few minutes): the source checks, the release build
# without the benchmarks, the unit suites and one short end-to-end case (weft run). The suites
# that spend most of their time waiting (on child processes, sockets and timeouts) start as soon
# as what they run is built, while the rest builds at a lower priority.
# Each stage's heading says when it started, in minutes and seconds since the script did.
# Usage: ./test.sh [--quick]      (FUZZ_SECONDS=N to change the fuzzing time per target; default 10)
set -euo pipefail
cd "$(dirname "$0")"

stage() { printf '== %s (at %d:%02d)\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)); }

quick=false
case "${1:-}" in
  "") ;;
  --quick) quick=true ;;
  *) echo "usage: ./test.sh [--quick]" >&2; exit 2 ;;
esac

if $quick; then ./setup.sh --no-bench --configure-only; else ./setup.sh; fi

stage "source checks: formatting, dependency direction, references"
unformatted=$(git ls-files '*.cc' '*.h' | xargs clang-format --dry-run 2>&1 | grep -o '^[^:]*:[0-9]*' | sort -u || true)
if [ -n "$unformatted" ]; then
  echo "test.sh: these places are not formatted as .clang-format says (run clang-format -i on the files):"
  echo "$unformatted"
  exit 1
fi
tests/check_layering.sh
tests/check_references.sh

if $quick; then
  # The suites that mostly wait, and the programs they run.
  waiting='^(run_e2e|engine_adapters|policy_store|orchestrator_service|rollout_worker|fake_engine)$'
  waiting_targets=(weft weft_fake_engine_bin weft_engine_adapter_tests weft_policy_store_tests
    weft_orchestrator_tests weft_rollout_worker_tests weft_fake_engine_tests)
  stage "release build: what the waiting suites run"
  cmake --build build --target "${waiting_targets[@]}"
  stage "the waiting suites, while the rest builds"
  waiting_log=build/waiting-suites.log
  # Their exit status, written when they end (not `wait`: see sanitized_status below).
  waiting_status=build/waiting-suites.status
  rm -f "$waiting_status"
  # A process group of its own (job control on), stopped with the script whichever way it ends.
  set -m
  (ctest --test-dir build --output-on-failure -j6 -L 'unit|quick' -R "$waiting" > "$waiting_log" 2>&1
    echo $? > "$waiting_status") &
  waiting_pid=$!
  set +m
  trap '[ -e "$waiting_status" ] || kill -- -$waiting_pid 2> /dev/null || true' EXIT
  # At the lowest priority, so that the suites' deadlines are not spent waiting for a processor.
  nice -n 19 cmake --build build
  stage "the other unit suites"
  # Four at a time on two cores: much of their time is waiting on sockets and child processes.
  other_status=0
  ctest --test-dir build --output-on-failure -j4 -L 'unit|quick' -E "$waiting" || other_status=$?
  while [ ! -e "$waiting_status" ]; do sleep 0.2; done
  echo "-- the waiting suites (started while the build went on):"
  cat "$waiting_log"
  if [ "$other_status" -ne 0 ] || [ "$(cat "$waiting_status")" -ne 0 ]; then
    echo "test.sh --quick: tests failed (above)" >&2
    exit 1
  fi
  echo "test.sh --quick: all tests passed in $((SECONDS / 60)):$(printf %02d $((SECONDS % 60)))"
  exit 0
fi

# The sanitized trees build in the background, at the lowest priority, from here on: they use the
# cores that installing Ceph and the end-to-end tests (waiting on processes and sockets) leave idle,
# and yield them whenever a test wants them.
sanitized_targets_asan=(weft_common_tests weft_sync_tests weft_policy_store_tests weft_trainer_adapter_tests
  weft_orchestrator_tests weft_examples_tests weft_rollout_worker_tests weft_engine_adapter_tests)
sanitized_targets_tsan=(weft_common_tests weft_policy_store_tests weft_orchestrator_tests weft_rollout_worker_tests
  weft_engine_adapter_tests)
build_sanitized_trees() {
  # One tree for the sanitized suites and the fuzz targets (coverage instrumentation does not change
  # what the suites test; only the delta fuzz targets link a build of weft_sync that skips checksums).
  cmake -S . -B build-asan -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DWEFT_SANITIZE=address,undefined -DWEFT_BUILD_FUZZ=ON -DWEFT_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON > /dev/null
  cmake --build build-asan --target "${sanitized_targets_asan[@]}"
  touch build-asan/.weft-built
  cmake -S . -B build-tsan -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DWEFT_SANITIZE=thread -DWEFT_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON > /dev/null
  cmake --build build-tsan --target "${sanitized_targets_tsan[@]}"
  touch build-tsan/.weft-built
  # Last, the fuzz targets: the suites above start running while these build.
  cmake --build build-asan --target weft_fuzz_targets
  touch build-asan/.weft-fuzz-built
}
sanitized_log=build/sanitized-trees.log
# The build's exit status, written when it ends. (Not `wait` on its process ID: by the time a stage
# asks, the build may have ended long before, and the tests' many processes may have reused its
# ID, which makes bash forget its status.)
sanitized_status=build/sanitized-trees.status
rm -f build-asan/.weft-built build-tsan/.weft-built build-asan/.weft-fuzz-built "$sanitized_status"
# With job control on, the build is a process group of its own, stopped with the script whichever
# way it ends. It stays in the script's session: the kernel shares the processor fairly between
# sessions (autogroups) before it looks at priorities, so a build in a session of its own would
# take half of it from the tests.
set -m
nice -n 19 bash -c "$(declare -p sanitized_targets_asan sanitized_targets_tsan)
$(declare -f build_sanitized_trees); (set -e; build_sanitized_trees); echo \$? > $sanitized_status" \
  > "$sanitized_log" 2>&1 &
builder=$!
set +m
trap '[ -e "$sanitized_status" ] || kill -- -$builder 2> /dev/null || true' EXIT
# Waits for the background build to have built what a stage runs (asan, tsan: that tree's suites;
# fuzz: the fuzz targets); when the build ends without it, shows the build's log.
wait_for_tree() {
  local marker="build-$1/.weft-built"
  [ "$1" != fuzz ] || marker=build-asan/.weft-fuzz-built
  while [ ! -e "$marker" ] && [ ! -e "$sanitized_status" ]; do sleep 1; done
  if [ -e "$marker" ]; then return; fi
  tail -n 60 "$sanitized_log"
  echo "test.sh: building the sanitized trees failed (exit status $(cat "$sanitized_status");" \
    "the whole log: $sanitized_log)"
  exit 1
}

stage "Debian's Ceph (monitor, OSD, RADOS Gateway) for the S3 backend's tests"
bash tests/s3/rgw.sh install
stage "Debian's Slurm and MUNGE for the deployment's tests"
bash tests/slurm/slurm.sh install
stage "Node.js and npm for the Kubernetes manifests' validator"
bash tests/deploy/node_modules.sh install
stage "Debian's Prometheus and Chromium for the monitoring tests"
bash tests/install_packages.sh test.sh prometheus chromium jq curl

stage "unit and end-to-end tests"
ctest --test-dir build --output-on-failure -j2

stage "the codec's fallback paths: AVX2 only, then scalar only"
WEFT_CPU=avx2 build/tests/weft_sync_tests
WEFT_CPU=scalar build/tests/weft_sync_tests

stage "sanitizers: address, undefined (once their tree is built)"
wait_for_tree asan
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
build-asan/tests/weft_common_tests
# Without the 4 GiB index test: it scans zero pages for a minute here, and the release run has it.
build-asan/tests/weft_sync_tests -tce='*over 2^32 elements*'
build-asan/tests/weft_policy_store_tests
build-asan/tests/weft_trainer_adapter_tests
build-asan/tests/weft_orchestrator_tests
build-asan/tests/weft_examples_tests
build-asan/tests/weft_rollout_worker_tests
build-asan/tests/weft_engine_adapter_tests

stage "sanitizer: thread (once its tree is built)"
wait_for_tree tsan
TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/weft_common_tests
TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/weft_policy_store_tests
TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/weft_orchestrator_tests -tce='*property*,*kill -9*,*sweep*'
TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/weft_rollout_worker_tests
TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/weft_engine_adapter_tests

stage "fuzzing, ${FUZZ_SECONDS:-10} s per target (once they are built)"
wait_for_tree fuzz
tests/fuzz/run_fuzzers.sh build-asan build/cli/weft build/tests/weft_make_test_model "${FUZZ_SECONDS:-10}"

echo "test.sh: all tests passed in $((SECONDS / 60)):$(printf %02d $((SECONDS % 60)))"
