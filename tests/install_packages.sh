#!/usr/bin/env bash
# Installs the Debian packages named that are not installed yet (apt-get, as root), for the test
# servers the suite starts itself (Ceph, Slurm, Node.js). When apt-get fails for lack of package
# lists (a fresh machine), it runs apt-get update once and tries again.
# Usage: tests/install_packages.sh WHO PACKAGE...   (WHO prefixes its messages)
set -euo pipefail
who=$1
shift
say() { echo "$who: $*" >&2; }
die() { say "$*"; exit 1; }

missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
((${#missing[@]} > 0)) || exit 0
[[ $(id -u) == 0 ]] || die "installing ${missing[*]} needs root"
say "installing ${missing[*]}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=300 -y --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
  if grep -qE 'Unable to locate package|has no installation candidate|Failed to fetch|404 +Not Found' "$log"; then
    say "apt-get install failed for lack of package lists; running apt-get update"
    apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; die "apt-get update failed"; }
    DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=300 -y --no-install-recommends "${missing[@]}" >"$log" 2>&1 ||
      { tail -n 30 "$log" >&2; die "apt-get install ${missing[*]} failed"; }
  else
    tail -n 30 "$log" >&2
    die "apt-get install ${missing[*]} failed"
  fi
fi
say "installed ${missing[*]}"
