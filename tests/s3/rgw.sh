#!/usr/bin/env bash
# A throw-away single-node Ceph RADOS Gateway (S3 server) for tests, from Debian's Ceph 16.2 (Pacific).
#
#   tests/s3/rgw.sh install                  apt-get installs ceph-mon, ceph-osd and radosgw if missing
#   tests/s3/rgw.sh start DIR PORT [BUCKET]  a fresh cluster under DIR serving S3 on http://127.0.0.1:PORT
#   tests/s3/rgw.sh stop DIR                 kills that cluster's daemons (waiting for them) and removes DIR
#
# The cluster: one monitor (no manager: radosgw doesn't need one; only manager commands such as `ceph df`
# hang), one OSD, one radosgw. Everything listens on 127.0.0.1 only: the monitor on one msgr2 port that the
# kernel picks free (or RGW_MON_PORT), the OSD on four ports, the first free ones in 6800-7300 (7400-7900
# when PORT lies in 6800-7300), radosgw on PORT. So clusters started in parallel with different DIR and
# PORT don't collide. An S3 user exists with access key WEFTTESTKEY and secret key WEFTTESTSECRET
# (DIR/s3.env exports them as AWS_* variables); BUCKET, when given, is created. URLs are path-style
# (http://127.0.0.1:PORT/BUCKET/KEY), any region name works in the SigV4 scope, and every signed request
# needs an x-amz-content-sha256 header (curl 7.88's --aws-sigv4 doesn't add one: pass
# -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD').
#
# Storage: RGW_OSD_STORE=memstore (default) keeps the data in the OSD's memory: nothing on disk, ready in
# about 2.5 s, but the OSD's resident memory is about twice the data stored (garbage included: radosgw
# frees overwritten and deleted data after about a minute here). RGW_OSD_STORE=bluestore puts it in a
# sparse file DIR/osd/block instead: about 70 MB resident whatever the data, ready in about 6 s.
# RGW_STORE_BYTES (default 2 GiB) caps the data. A full OSD doesn't fail writes: PUTs hang until space is
# freed, so size it with room to spare (the cap is checked every few seconds and can be overshot).
# RGW_START_TIMEOUT (default 120 s) bounds start.
#
# The daemons run as the calling user (root), detached from the caller's stdin/stdout/stderr; their pids
# are in DIR/pids and their logs in DIR/log. With RGW_OWNER_PID=PID in the environment, start also leaves a
# watchdog that stops the cluster once PID is gone (for test scripts that may die before calling stop).
# On failure start prints the tail of the logs, kills what it started and keeps DIR for a look.
set -euo pipefail

readonly PACKAGES=(ceph-mon ceph-osd radosgw)
readonly TOOLS=(ceph ceph-authtool monmaptool ceph-mon ceph-osd radosgw radosgw-admin)
readonly ACCESS_KEY=WEFTTESTKEY SECRET_KEY=WEFTTESTSECRET
readonly MARKER=.rgw-sh-cluster  # in DIR: stop and start only ever delete a DIR that has it

say() { echo "rgw: $*" >&2; }
die() { say "$*"; exit 1; }
usage() { die "usage: $0 install | start DIR PORT [BUCKET] | stop DIR"; }

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

cmd_install() {
  bash "$(dirname "${BASH_SOURCE[0]}")/../install_packages.sh" rgw "${PACKAGES[@]}"
}

# ---------------------------------------------------------------------------------------------------------
# Processes

# Pids of the processes that belong to the cluster in $1: those recorded in DIR/pids (still running the
# command recorded with them) and anything still running with "-c DIR/ceph.conf" in its command line
# (daemons, and ceph or radosgw-admin calls that hang).
cluster_pids() {
  local d=$1 f pid want cmd
  {
    if [[ -d $d/pids ]]; then
      for f in "$d"/pids/*; do
        [[ -f $f ]] || continue
        read -r pid want <"$f" || true
        [[ $pid =~ ^[0-9]+$ ]] || continue
        cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || continue
        [[ $cmd == *"$want"* && $cmd == *"$d"* ]] && echo "$pid"
      done
    fi
    for f in /proc/[0-9]*/cmdline; do
      cmd=$(tr '\0' ' ' 2>/dev/null <"$f") || continue
      if [[ $cmd == *" -c $d/ceph.conf "* ]]; then
        pid=${f#/proc/}
        echo "${pid%/cmdline}"
      fi
    done
  } | sort -un | { grep -vxE "$$|$BASHPID" || true; }
}

alive() {  # alive PID: true while PID exists and isn't a zombie
  local state
  state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}

# Kills every process of the cluster in $1 with SIGKILL (its data is thrown away anyway; a memstore OSD
# would write all its data to disk on SIGTERM) and waits until they are gone.
kill_cluster() {
  local d=$1 pids pid left round i
  for round in 1 2 3; do
    pids=$(cluster_pids "$d")
    [[ -z $pids ]] && return 0
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      left=
      for pid in $pids; do alive "$pid" && left+=" $pid"; done
      [[ -z $left ]] && break
      sleep 0.1
    done
    [[ -n $left ]] && say "still running after SIGKILL (round $round):$left"
  done
  pids=$(cluster_pids "$d")
  for pid in $pids; do alive "$pid" && die "could not stop pid $pid of $d"; done
  return 0
}

# launch NAME COMMAND...: runs COMMAND in the background, detached from our stdin/stdout/stderr and from
# every other descriptor we hold (a test harness waiting for EOF on a pipe must not wait on the daemons),
# output appended to DIR/log/NAME.out, its pid recorded in DIR/pids/NAME.
launch() {
  local name=$1
  shift
  (
    for fd in "/proc/$BASHPID/fd/"*; do
      fd=${fd##*/}
      ((fd > 2)) && { eval "exec $fd>&-" 2>/dev/null || true; }
    done
    cd /
    ulimit -c 0
    # glibc's malloc would otherwise keep freed multi-MB buffers (its mmap threshold grows up to 32 MiB),
    # so memory that memstore and radosgw free would never go back to the system.
    export MALLOC_MMAP_THRESHOLD_=131072
    exec "$@"
  ) </dev/null >>"$D/log/$name.out" 2>&1 &
  echo "$! $1" >"$D/pids/$name"
  disown $!  # no "Killed" notice from bash when stop or a failed start kills it
}

pid_of() { local pid _; read -r pid _ <"$D/pids/$1"; echo "$pid"; }

# ---------------------------------------------------------------------------------------------------------
# start

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ceph_cli() { timeout 30 ceph -c "$D/ceph.conf" --connect-timeout "${CONNECT_TIMEOUT:-20}" "$@"; }

write_conf() {
  local fsid=$1 mon_port=$2 asok osd_ports store
  asok="admin socket = $D/run/\$name.asok"
  # A unix socket path has at most 107 bytes; without the admin sockets nothing here is missing.
  ((${#D} > 70)) && asok="admin socket ="
  osd_ports="ms bind port min = 6800
ms bind port max = 7300"
  ((PORT >= 6800 && PORT <= 7300)) && osd_ports="ms bind port min = 7400
ms bind port max = 7900"
  if [[ $OSD_STORE == bluestore ]]; then
    store="osd objectstore = bluestore
bluestore block create = true
bluestore block size = $STORE_BYTES
osd memory target = 939524096"
  else
    store="osd objectstore = memstore
memstore device bytes = $STORE_BYTES"
  fi
  cat >"$D/ceph.conf" <<EOF
# Written by tests/s3/rgw.sh: a throw-away single-node cluster.
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$mon_port]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind msgr2 = true
ms bind retry count = 1
ms bind retry delay = 1
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = $D/run
$asok
log file = $D/log/\$name.log
log to stderr = false
err to stderr = true
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 2
mon data avail crit = 1
# Each pool that radosgw creates is a few osdmap changes; the monitor commits them every 1 s by default.
paxos propose interval = 0.05

[mon.a]
mon data = $D/mon

[osd.0]
osd data = $D/osd
keyring = $D/osd/keyring
$store
$osd_ports

[client]
keyring = $D/admin.keyring
log file = $D/log/client.log
admin socket =

[client.rgw.a]
keyring = $D/rgw/keyring
rgw data = $D/rgw
log file = $D/log/\$name.log
$asok
rgw frontends = beast endpoint=127.0.0.1:$PORT
rgw enable usage log = false
rgw dynamic resharding = false
# Overwritten and deleted data is freed after a minute (default: two hours), so memstore gets it back.
rgw gc obj min wait = 60
rgw gc processor period = 60
EOF
}

# Prints the tails of the logs that explain a failed start: those of the step that failed ($STEP), and the
# stderr of the other daemons.
show_logs() {
  local f files=()
  case $STEP in
    mon) files=(mon-mkfs.out mon.out mon.a.log) ;;
    osd) files=(osd-mkfs.out osd.out osd.0.log mon.out client.err) ;;
    user) files=(user-create.out client.log osd.out mon.out) ;;
    rgw | bucket) files=(rgw.out client.rgw.a.log create-bucket.out osd.out mon.out) ;;
    *) files=(mon.out osd.out rgw.out) ;;
  esac
  for f in "${files[@]}"; do
    [[ -s $D/log/$f ]] || continue
    echo "----- $D/log/$f (last 12 lines)" >&2
    tail -n 12 "$D/log/$f" | grep -v '^$' >&2 || true
  done
}

on_start_exit() {
  local rc=$?
  ((rc == 0)) && return 0
  trap - EXIT
  say "start failed (exit $rc); logs under $D/log"
  show_logs
  kill_cluster "$D" || true
  exit "$rc"
}

deadline_left() { awk -v t="$T0" -v n="$(now)" -v l="$TIMEOUT" 'BEGIN { exit !(n - t < l) }'; }

# wait_until WHAT DAEMON COMMAND...: runs COMMAND every 0.2 s until it succeeds; fails if DAEMON exits or the
# start's time runs out.
wait_until() {
  local what=$1 daemon=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    alive "$(pid_of "$daemon")" || die "$daemon exited while waiting for $what"
    deadline_left || die "timed out (${TIMEOUT}s) waiting for $what"
    sleep 0.2
  done
}

osd_up() { ceph_cli osd stat 2>/dev/null | grep -q ' 1 up'; }

start_mon() {
  local fsid=$1 attempt mon_port
  for attempt in 1 2 3; do
    mon_port=${RGW_MON_PORT:-$(free_port)}
    write_conf "$fsid" "$mon_port"
    rm -rf "$D/mon" && mkdir -p "$D/mon"
    monmaptool --create --addv a "[v2:127.0.0.1:$mon_port]" --fsid "$fsid" "$D/monmap" >/dev/null
    ceph-mon -c "$D/ceph.conf" --mkfs -i a --monmap "$D/monmap" --keyring "$D/mon.keyring" >>"$D/log/mon-mkfs.out" 2>&1 ||
      die "ceph-mon --mkfs failed"
    launch mon ceph-mon -c "$D/ceph.conf" -f -i a
    while ! CONNECT_TIMEOUT=2 ceph_cli mon stat >/dev/null 2>&1; do
      if ! alive "$(pid_of mon)"; then
        say "ceph-mon on port $mon_port exited (attempt $attempt)"
        break
      fi
      deadline_left || die "timed out waiting for ceph-mon"
      sleep 0.2
    done
    alive "$(pid_of mon)" && { MON_PORT=$mon_port; return 0; }
    [[ -n ${RGW_MON_PORT:-} ]] && break
  done
  die "ceph-mon did not start"
}

cmd_start() {
  (($# == 2 || $# == 3)) || usage
  local dir=$1 bucket=${3:-} t_mon t_osd t_user fsid osd_uuid code
  PORT=$2
  if ! [[ $PORT =~ ^[0-9]+$ ]] || ((PORT < 1 || PORT > 65535)); then die "bad PORT '$PORT'"; fi
  [[ $dir != *[[:space:]]* ]] || die "DIR must not contain white space"
  local t
  for t in "${TOOLS[@]}"; do command -v "$t" >/dev/null || die "$t is missing: run '$0 install' first"; done
  STORE_BYTES=${RGW_STORE_BYTES:-2147483648}
  OSD_STORE=${RGW_OSD_STORE:-memstore}
  [[ $OSD_STORE == memstore || $OSD_STORE == bluestore ]] || die "RGW_OSD_STORE must be memstore or bluestore"
  TIMEOUT=${RGW_START_TIMEOUT:-120}
  T0=$(now)
  STEP=setup

  D=$(realpath -m -- "$dir")
  [[ $D != / ]] || die "DIR must not be /"
  if [[ -e $D ]]; then
    if [[ -f $D/$MARKER ]]; then
      kill_cluster "$D"
      rm -rf -- "$D"
    elif [[ -n $(ls -A -- "$D") ]]; then
      die "$D exists, is not empty and holds no cluster of this script: refusing to use it"
    fi
  fi
  listening "$PORT" && die "something already listens on 127.0.0.1:$PORT"
  mkdir -p "$D"/{mon,osd,rgw,run,log,pids}
  touch "$D/$MARKER"
  trap on_start_exit EXIT
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 143' TERM

  # Keys: every entity's key and caps go into the monitor's keyring before mkfs, so its auth database
  # starts with them.
  ceph-authtool --create-keyring "$D/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$D/admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool --create-keyring "$D/osd/keyring" --gen-key -n osd.0 \
    --cap mon 'allow profile osd' --cap osd 'allow *' --cap mgr 'allow profile osd' >/dev/null
  ceph-authtool --create-keyring "$D/rgw/keyring" --gen-key -n client.rgw.a \
    --cap mon 'allow rw' --cap osd 'allow rwx' --cap mgr 'allow rw' >/dev/null
  local k
  for k in admin.keyring osd/keyring rgw/keyring; do
    ceph-authtool "$D/mon.keyring" --import-keyring "$D/$k" >/dev/null
  done

  fsid=$(cat /proc/sys/kernel/random/uuid)
  STEP=mon
  start_mon "$fsid"
  t_mon=$(elapsed "$T0")

  STEP=osd
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  [[ $(ceph_cli osd new "$osd_uuid" 2>>"$D/log/client.err") == 0 ]] || die "ceph osd new did not give osd.0"
  ceph-osd -c "$D/ceph.conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$D/log/osd-mkfs.out" 2>&1 || die "ceph-osd --mkfs failed"
  launch osd ceph-osd -c "$D/ceph.conf" -f -i 0
  wait_until "osd.0 to come up" osd osd_up
  t_osd=$(elapsed "$T0")

  STEP=user
  # radosgw-admin before radosgw: it creates the default realm/zone and the pools it needs, and a
  # radosgw starting at the same moment would race it for the default zone.
  timeout 90 radosgw-admin -c "$D/ceph.conf" user create --uid=weft --display-name=weft \
    --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >"$D/log/user-create.out" 2>&1 ||
    die "radosgw-admin user create failed"
  t_user=$(elapsed "$T0")

  STEP=rgw
  launch rgw radosgw -c "$D/ceph.conf" -f -n client.rgw.a
  wait_until "radosgw to answer on 127.0.0.1:$PORT" rgw \
    curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/"

  if [[ -n $bucket ]]; then
    STEP=bucket
    code=$(curl -s -o "$D/log/create-bucket.out" -w '%{http_code}' --max-time 30 -X PUT \
      --aws-sigv4 "aws:amz:us-east-1:s3" --user "$ACCESS_KEY:$SECRET_KEY" \
      -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "http://127.0.0.1:$PORT/$bucket") || true
    [[ $code == 200 ]] || die "creating bucket $bucket: HTTP $code $(cat "$D/log/create-bucket.out" 2>/dev/null)"
  fi

  if [[ -n ${RGW_OWNER_PID:-} ]]; then
    [[ $RGW_OWNER_PID =~ ^[0-9]+$ ]] || die "bad RGW_OWNER_PID '$RGW_OWNER_PID'"
    # shellcheck disable=SC2016
    launch watchdog bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" stop "$3"' \
      rgw-watchdog "$RGW_OWNER_PID" "$(realpath "$0")" "$D"
  fi

  cat >"$D/s3.env" <<EOF
# source this: the S3 endpoint and credentials of the cluster in $D
export AWS_ENDPOINT_URL_S3=http://127.0.0.1:$PORT
export AWS_ACCESS_KEY_ID=$ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$SECRET_KEY
export AWS_REGION=us-east-1
EOF
  trap - EXIT HUP INT TERM
  echo "mon 127.0.0.1:$MON_PORT up at ${t_mon}s, osd at ${t_osd}s, user at ${t_user}s" >"$D/log/start-times"
  echo "rgw: http://127.0.0.1:$PORT ready in $(elapsed "$T0") s"
}

cmd_stop() {
  (($# == 1)) || usage
  D=$(realpath -m -- "$1")
  [[ -e $D ]] || return 0
  [[ -f $D/$MARKER ]] || die "$D holds no cluster of this script: not touching it"
  kill_cluster "$D"
  rm -rf -- "$D"
}

unset CEPH_ARGS CEPH_CONF
(($# >= 1)) || usage
case $1 in
  install) shift; (($# == 0)) || usage; cmd_install ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) usage ;;
esac
