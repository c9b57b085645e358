#!/usr/bin/env bash
# A throw-away Prometheus server for tests, from Debian's prometheus 2.42 (it brings promtool).
#
#   tests/monitoring/prometheus.sh install                  apt-get installs prometheus if missing
#   tests/monitoring/prometheus.sh start DIR PORT TARGET... a fresh server under DIR answering on
#                                                           http://127.0.0.1:PORT
#   tests/monitoring/prometheus.sh stop DIR                 stops that server and removes DIR
#
# Each TARGET is HOST:PORT (an orchestrator: job "weft-orchestrator") or REGION=HOST:PORT (a
# region's relay: job "weft-relay", its series labelled region="REGION"), the job names of
# configs/monitoring/prometheus.yml, which its alerting rules use. Every target is scraped at
# /metrics once a second. DIR/prometheus.yml is the configuration, DIR/data the TSDB,
# DIR/prometheus.log the server's log and DIR/prometheus.pid its process. With
# PROMETHEUS_RULE_FILES="FILE..." in the environment the configuration loads those rule files too
# (evaluated once a second; their state is at /api/v1/rules).
#
# The server runs as the calling user in a session of its own, detached from the caller's stdin,
# stdout and stderr. start returns once /-/ready answers and every target has been scraped once, up
# or down (Prometheus starts scraping a few seconds after it is ready), within
# PROMETHEUS_START_TIMEOUT seconds (default 60). With PROMETHEUS_OWNER_PID=PID in the environment,
# start also leaves a watchdog that stops the server once PID is gone (for test scripts that may
# die before calling stop). On failure start prints the tail of the log, stops what it started and
# keeps DIR for a look. Needs curl and jq.
set -euo pipefail

readonly SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
readonly MARKER=.prometheus-sh-server  # in DIR: stop and start only ever delete a DIR that has it

say() { echo "prometheus: $*" >&2; }
die() { say "$*"; exit 1; }
usage() { die "usage: $0 install | start DIR PORT TARGET... | stop DIR"; }

cmd_install() {
  bash "$(dirname "$SELF")/../install_packages.sh" prometheus prometheus
}

pid_of() { cat "$1" 2>/dev/null || true; }

cmd_stop() {
  local d=$1 pid
  [[ -e $d/$MARKER ]] || { [[ ! -e $d ]] && return 0; die "$d was not made by $0; not touching it"; }
  pid=$(pid_of "$d/watchdog.pid")
  [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null || true
  pid=$(pid_of "$d/prometheus.pid")
  if [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null; then
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$d"
}

# The configuration for the targets given, on stdout.
write_config() {
  local orchestrators=() relays=() t region address rules
  for t in "$@"; do
    if [[ $t == *=* ]]; then
      region=${t%%=*} address=${t#*=}
      [[ $region =~ ^[A-Za-z0-9_.-]+$ ]] || die "bad region name in target '$t'"
      relays+=("$region" "$address")
    else
      orchestrators+=("$t")
    fi
  done
  for t in "${orchestrators[@]}" "${relays[@]}"; do
    [[ $t != *:* || $t =~ ^[A-Za-z0-9_.-]+:[0-9]+$ ]] || die "bad target address '$t' (want HOST:PORT)"
  done
  cat <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
EOF
  if [[ -n ${PROMETHEUS_RULE_FILES:-} ]]; then
    echo "rule_files:"
    for rules in $PROMETHEUS_RULE_FILES; do
      echo "  - '$(cd "$(dirname "$rules")" && pwd)/$(basename "$rules")'"
    done
  fi
  echo "scrape_configs:"
  if ((${#orchestrators[@]} > 0)); then
    echo "  - job_name: weft-orchestrator"
    echo "    static_configs:"
    echo "      - targets: [$(printf "'%s'," "${orchestrators[@]}" | sed 's/,$//')]"
  fi
  if ((${#relays[@]} > 0)); then
    echo "  - job_name: weft-relay"
    echo "    static_configs:"
    for ((i = 0; i < ${#relays[@]}; i += 2)); do
      echo "      - targets: ['${relays[i + 1]}']"
      echo "        labels: {region: '${relays[i]}'}"
    done
  fi
}

cmd_start() {
  local d=$1 port=$2
  shift 2
  (($# > 0)) || usage
  [[ $port =~ ^[0-9]+$ ]] || die "bad port '$port'"
  if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then cmd_install; fi
  [[ -e $d ]] && cmd_stop "$d"
  mkdir -p "$d/data"
  touch "$d/$MARKER"
  d=$(cd "$d" && pwd)
  write_config "$@" > "$d/prometheus.yml"
  promtool check config "$d/prometheus.yml" > "$d/check-config.out" 2>&1 ||
    { cat "$d/check-config.out" >&2; die "promtool refuses $d/prometheus.yml"; }
  # The server writes its own pid (setsid forks where the caller made this a process group's leader).
  rm -f "$d/prometheus.pid"
  setsid bash -c 'echo $$ > "$1/prometheus.pid"; exec prometheus --config.file "$1/prometheus.yml" \
    --storage.tsdb.path "$1/data" --web.listen-address "127.0.0.1:$2"' prometheus "$d" "$port" \
    < /dev/null > "$d/prometheus.log" 2>&1 &
  local pid=""
  for _ in $(seq 100); do
    pid=$(pid_of "$d/prometheus.pid")
    [[ -n $pid ]] && break
    sleep 0.05
  done
  [[ -n $pid ]] || die "the server did not start (DIR kept: $d)"
  local deadline=$((SECONDS + ${PROMETHEUS_START_TIMEOUT:-60}))
  # Stops the server that died or ran out of time, showing its log, and says why.
  give_up_unless_alive() {
    if kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); then return; fi
    tail -n 30 "$d/prometheus.log" >&2 2>/dev/null
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$d/prometheus.pid"
    die "$1 (DIR kept: $d)"
  }
  until curl -fsS -m 2 -o /dev/null "http://127.0.0.1:$port/-/ready" 2>/dev/null; do
    give_up_unless_alive "the server did not become ready on 127.0.0.1:$port"
    sleep 0.1
  done
  # Ready, but it starts scraping a few seconds later (when target discovery first reports): wait
  # for a first scrape of every target, so that the series of what a test starts next begin with it.
  local targets=$#
  until [[ $(curl -fsS -m 2 "http://127.0.0.1:$port/api/v1/targets" 2>/dev/null |
    jq '[.data.activeTargets[] | select(.lastScrape | startswith("0001") | not)] | length' 2>/dev/null) == "$targets" ]]; do
    give_up_unless_alive "the server did not scrape its $targets targets"
    sleep 0.2
  done
  if [[ -n ${PROMETHEUS_OWNER_PID:-} ]]; then
    (
      trap '' HUP
      while kill -0 "$PROMETHEUS_OWNER_PID" 2>/dev/null; do sleep 2; done
      [[ -e $d/$MARKER ]] && bash "$SELF" stop "$d" >/dev/null 2>&1
    ) < /dev/null > /dev/null 2>&1 &
    echo $! > "$d/watchdog.pid"
  fi
  say "server up in $d on http://127.0.0.1:$port (targets: $*)"
}

case "${1:-}" in
  install) cmd_install ;;
  start) (($# >= 4)) || usage; cmd_start "$2" "$3" "${@:4}" ;;
  stop) (($# == 2)) || usage; cmd_stop "$2" ;;
  *) usage ;;
esac
