# Helpers shared by the shell tests: counters and checks. Source it after cd-ing to the work dir.
passed=0 failed=0
ok() { passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
run() { "$@" > out.txt 2> err.txt; }
expect_ok() { if run "$@"; then ok; else fail "$* exited non-zero: $(cat err.txt)"; fi; }
# expect_error PATTERN command...: non-zero exit and PATTERN in stderr.
expect_error() {
  local pattern=$1; shift
  if run "$@"; then fail "$* succeeded, expected an error"; return; fi
  if grep -q -- "$pattern" err.txt; then ok; else fail "$*: stderr lacks '$pattern': $(cat err.txt)"; fi
}
same() { if cmp -s "$1" "$2"; then ok; else fail "$1 and $2 differ"; fi; }
