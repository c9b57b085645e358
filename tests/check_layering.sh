#!/usr/bin/env bash
# The dependency direction of docs/design.md, checked on the sources. For every file of a library,
# the project headers it reaches (directly or through other headers) must belong to the layers that
# library may use; the orchestrator's client side (types, wire, client) and its users (the rollout
# worker, the trainer adapter) must never reach the core, the service or the HTTP server (Beast);
# and nothing outside examples/, cli/, tests/ and bench/ may reach examples/.
# Usage: tests/check_layering.sh        (from anywhere; exit status 1 names every violation)
set -euo pipefail
cd "$(dirname "$0")/.."

client='orchestrator/(types|wire|client)[.]h'
core='orchestrator/(types|wire|core|journal|durable_core)[.]h'
plain='common/(status|logging|byte_io|concurrent|file_util|hex|json_fields|json_text|names|parallel|units|yaml_fields)[.]h'
# file pattern <TAB> the headers its files may reach (first matching pattern wins).
rules="^common/http_	^common/
^common/	^$plain\$
^sync/	^(common|sync)/
^policy_store/	^(common|sync|policy_store)/
^orchestrator/(types|wire|client)[.]	^(common/(status|logging|byte_io|hex|json_fields|json_text|names|http_client)[.]h|$client)\$
^orchestrator/(core|snapshot|journal|durable_core)[.]	^(common/(status|logging|byte_io|file_util|json_fields|json_text|names)[.]h|$core)\$
^orchestrator/	^(common|orchestrator)/
^rollout_worker/	^((common|sync|policy_store|rollout_worker)/|$client\$)
^trainer_adapter/	^((common|sync|policy_store|trainer_adapter)/|$client\$)
^examples/	^(common|sync|policy_store|orchestrator|rollout_worker|trainer_adapter|examples)/
^sim/	^((common|sync|policy_store|sim)/|orchestrator/(types|wire|core|core_config)[.]h\$)"

{
  git ls-files | sed 's/^/file /'
  git grep -o '^#include "[^"]*"' -- '*.h' '*.cc' | sed 's/:#include "/ /; s/"$//; s/^/edge /'
  printf '%s\n' "$rules" | sed 's/^/rule /'
} | awk '
  $1 == "file" { exists[$2] = 1; files[++nfiles] = $2; next }
  $1 == "edge" { out[$2] = out[$2] " " $3; next }
  $1 == "rule" { line = substr($0, 6); split(line, part, "\t"); pattern[++nrules] = part[1]; allow[nrules] = part[2]; next }
  function visit(h,    n, list, i) {
    if (h in seen) return
    seen[h] = 1
    reached[++nreached] = h
    n = split(out[h], list, " ")
    for (i = 1; i <= n; ++i) if (list[i] in exists) visit(list[i])
  }
  END {
    violations = 0
    for (f = 1; f <= nfiles; ++f) {
      file = files[f]
      if (file !~ /[.](h|cc)$/) continue
      rule = 0
      for (r = 1; r <= nrules; ++r) if (file ~ pattern[r]) { rule = r; break }
      if (rule == 0) continue
      delete seen; nreached = 0
      n = split(out[file], list, " ")
      for (i = 1; i <= n; ++i) if (list[i] in exists) visit(list[i])
      for (i = 1; i <= nreached; ++i) {
        if (reached[i] !~ allow[rule]) { print "layering: " file " reaches " reached[i]; ++violations }
      }
    }
    exit violations > 0 ? 1 : 0
  }' || { echo "layering: the dependency direction (docs/design.md) is broken"; exit 1; }

# No file outside the HTTP plumbing and the servers may use Beast.
beast=$(git grep -l '#include <boost/beast' -- '*.h' '*.cc' |
          grep -vE '^(common/http_server|policy_store/store_server|orchestrator/service|bench/|tests/)' || true)
if [[ -n $beast ]]; then
  echo "layering: these files use Beast outside the HTTP servers:"$'\n'"$beast"
  exit 1
fi
echo "layering: every library reaches only the layers below it"
