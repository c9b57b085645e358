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
# server_started NAME PID: waits (30 s at most: a loaded machine can be slow to start a process)
# for the weft server PID, writing NAME.log, to say where it listens; sets NAME_pid and NAME_url
# (empty, with a message on stderr, if it exited or never said).
server_started() {
  local name=$1 pid=$2 deadline=$((SECONDS + 30))
  pids+=($pid)
  until grep -q 'on http://' $name.log 2> /dev/null; do
    if ! kill -0 $pid 2> /dev/null || (( SECONDS >= deadline )); then
      echo "server_started: $name (pid $pid) did not say where it listens: $(cat $name.log 2> /dev/null)" >&2
      break
    fi
    sleep 0.05
  done
  eval "${name}_pid=$pid"
  eval "${name}_url=$(grep -o 'on http://127.0.0.1:[0-9]*' $name.log 2> /dev/null | head -1 | cut -c4-)"
}
