#!/usr/bin/env bash
# The dependency direction of docs/design.md section 2, checked on the sources and on the CMake files.
# Includes: for every file of the library folders, python/, cli/ and bench/, the project headers it
# reaches (directly or through other headers) must belong to the layers that folder may use; the
# orchestrator's client side (types, wire, client) and its users (the rollout worker, the trainer
# adapter, the Python binding) never reach the core, the service or the HTTP server (Beast); the
# simulator reaches of the policy store only the manifests, the pull planner and the relay's cache
# index, and of the rollout worker only its decisions (worker_core.h); bench/ never
# reaches cli/; nothing outside examples/, cli/, tests/ and bench/ reaches examples/; only the HTTP
# plumbing and the servers use Beast.
# Links: for every target of every CMakeLists.txt (add_library, add_executable, pybind11_add_module
# and target_link_libraries with a literal name), the project targets it links, directly or through
# other targets, must be among those its rule below allows (names no CMakeLists.txt defines are
# not followed); every target has a rule, so a new one fails until it gets one; and no target
# outside examples/, cli/, tests/ and bench/ links a target of examples/.
# Usage: tests/check_layering.sh        (from anywhere; exit status 1 names every violation)
set -euo pipefail
cd "$(dirname "$0")/.."

broken=0

# ---- Includes ----------------------------------------------------------------------------------
client='orchestrator/(types|wire|cluster_api|client)[.]h'
core='orchestrator/(types|wire|core|journal|durable_core|measurements)[.]h'
plain='common/(status|logging|byte_io|concurrent|env|file_util|hex|json_fields|json_text|mem_env|mutex|names|parallel|prometheus|units|yaml_fields)[.]h'
libraries='common|sync|policy_store|orchestrator|rollout_worker|trainer_adapter|examples|sim'
# file pattern <TAB> the headers its files may reach (first matching pattern wins).
rules="^common/http_	^common/
^common/	^$plain\$
^sync/	^(common|sync)/
^policy_store/	^(common|sync|policy_store)/
^orchestrator/(types|wire|cluster_api|client)[.]	^(common/(status|logging|byte_io|hex|json_fields|json_text|mutex|names|http_client)[.]h|$client)\$
^orchestrator/(core|snapshot|journal|durable_core|measurements)[.]	^(common/(status|logging|byte_io|env|file_util|json_fields|json_text|mutex|names|prometheus)[.]h|$core)\$
^orchestrator/	^(common|orchestrator)/
^rollout_worker/worker_core[.]	^($plain|orchestrator/(types|wire|cluster_api)[.]h|rollout_worker/worker_core[.]h)\$
^rollout_worker/	^((common|sync|policy_store|rollout_worker)/|$client\$)
^trainer_adapter/	^((common|sync|policy_store|trainer_adapter)/|$client\$)
^python/	^((common|sync|policy_store|trainer_adapter|python)/|$client\$)
^examples/	^(common|sync|policy_store|orchestrator|rollout_worker|trainer_adapter|examples)/
^sim/	^((common|sync|sim)/|orchestrator/(types|wire|cluster_api|core|core_config)[.]h\$|policy_store/(manifest|planner|object_store|cache_index)[.]h\$|rollout_worker/worker_core[.]h\$)
^cli/	^($libraries|cli)/
^bench/	^(($libraries|bench)/|tests/process_stats[.]h\$)"

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
  }' || broken=1

# No file outside the HTTP plumbing (with Asio's and Beast's compiled parts) and the servers may use
# Beast.
while IFS= read -r file; do
  echo "layering: $file uses Beast outside the HTTP servers"
  broken=1
done < <(git grep -l '#include <boost/beast' -- '*.h' '*.cc' |
           grep -vE '^(common/http_server|common/asio_impl|policy_store/store_server|orchestrator/service|bench/|tests/)' || true)

# ---- Links -------------------------------------------------------------------------------------
# folder/target (folder/* for every target of a folder) <TAB> the project targets it may link,
# directly or through others (folder/* for every target of a folder, * for any, - for none).
common_http='weft_common weft_common_http'
store="$common_http weft_sync weft_policy_store"
wire='weft_common weft_orchestrator_wire'
client="$wire weft_common_http weft_orchestrator_client"
core="$wire weft_orchestrator_core weft_orchestrator_core_config"
library_folders='common/* sync/* policy_store/* orchestrator/* rollout_worker/* trainer_adapter/* examples/* sim/*'
link_rules="common/weft_common	-
common/weft_common_http	weft_common
sync/weft_sync	weft_common
sync/weft_sync_unchecked	weft_common
policy_store/weft_policy_store	$common_http weft_sync
orchestrator/weft_orchestrator_wire	weft_common
orchestrator/weft_orchestrator_client	$wire weft_common_http
orchestrator/weft_orchestrator_core	$wire
orchestrator/weft_orchestrator_core_config	$wire weft_orchestrator_core
orchestrator/weft_orchestrator_service	$core weft_common_http
rollout_worker/weft_worker_core	$wire
rollout_worker/weft_rollout_worker	$store $client weft_worker_core
trainer_adapter/weft_trainer_adapter	$store $client
python/weft_python	$store $client weft_trainer_adapter
examples/weft_examples	$store $client weft_worker_core weft_rollout_worker weft_trainer_adapter
sim/weft_sim	$store $core weft_worker_core
cli/*	$library_folders
bench/*	$library_folders
tests/*	*"

{
  printf '%s\n' "$link_rules" | sed 's/^/rule	/'
  git ls-files | grep -E '(^|/)CMakeLists[.]txt$' | while IFS= read -r list; do
    if [[ -f $list ]]; then sed "s|^|cmake	$list	|" "$list"; fi
  done
} | awk -F '\t' '
  $1 == "rule" { key[++nrules] = $2; allowed[nrules] = " " $3 " "; next }
  $1 == "cmake" {
    # Comments (# outside quotes) go; the lines of a file are joined, so calls may span lines.
    line = substr($0, length($1 $2) + 3); quoted = 0
    for (i = 1; i <= length(line); ++i) {
      c = substr(line, i, 1)
      if (c == "\"") quoted = !quoted
      else if (c == "#" && !quoted) { line = substr(line, 1, i - 1); break }
    }
    if (!($2 in text)) lists[++nlists] = $2
    text[$2] = text[$2] " " line
    next
  }
  function folder_of(list,    d) { d = list; sub(/\/?CMakeLists[.]txt$/, "", d); return d == "" ? "." : d }
  function in_folder(d, f) { return d == f || substr(d, 1, length(f) + 1) == f "/" }
  # Whether the allowed list (" a b dir/* ") admits target t.
  function admits(list, t,    n, item, i) {
    if (index(list, " * ") || index(list, " " t " ")) return 1
    n = split(list, item, " ")
    for (i = 1; i <= n; ++i)
      if (item[i] ~ /\/[*]$/ && in_folder(dir[t], substr(item[i], 1, length(item[i]) - 2))) return 1
    return 0
  }
  function visit(t,    n, list, i) {
    n = split(links[t], list, " ")
    for (i = 1; i <= n; ++i) {
      if (!(list[i] in dir) || list[i] in seen) continue
      seen[list[i]] = 1; parent[list[i]] = t; reached[++nreached] = list[i]
      visit(list[i])
    }
  }
  END {
    keyword = " PUBLIC PRIVATE INTERFACE LINK_PUBLIC LINK_PRIVATE LINK_INTERFACE_LIBRARIES debug optimized general "
    for (l = 1; l <= nlists; ++l) {
      s = text[lists[l]]; folder = folder_of(lists[l])
      while (match(tolower(s), /(^|[^a-z0-9_])(add_library|add_executable|pybind11_add_module|target_link_libraries)[ \t]*\([^)]*\)/)) {
        call = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
        sub(/^[^A-Za-z0-9_]/, "", call)
        command = tolower(substr(call, 1, index(call, "(") - 1)); sub(/[ \t]+$/, "", command)
        args = substr(call, index(call, "(") + 1); sub(/\)$/, "", args); gsub(/"/, "", args)
        n = split(args, arg, " ")
        if (n == 0 || arg[1] ~ /[$]/) continue
        if (command != "target_link_libraries") {
          if (arg[2] == "IMPORTED") continue
          if (arg[1] in dir) { print "layering: target " arg[1] " is defined twice (" where[arg[1]] ", " lists[l] ")"; ++violations }
          else targets[++ntargets] = arg[1]
          dir[arg[1]] = folder; where[arg[1]] = lists[l]
          if (arg[2] == "ALIAS") links[arg[1]] = links[arg[1]] " " arg[3]
          continue
        }
        for (i = 2; i <= n; ++i) {
          dep = arg[i]; gsub(/^(\$<[^:>]*:)+|>+$/, "", dep)
          if (dep != "" && !index(keyword, " " dep " ")) links[arg[1]] = links[arg[1]] " " dep
        }
      }
    }
    for (t in links) if (!(t in dir)) { print "layering: target_link_libraries names " t ", which no CMakeLists.txt defines"; ++violations }
    for (j = 1; j <= ntargets; ++j) {
      t = targets[j]; rule = 0
      for (r = 1; r <= nrules; ++r) {
        k = key[r]
        if (k ~ /\/[*]$/ ? in_folder(dir[t], substr(k, 1, length(k) - 2)) : k == dir[t] "/" t) { rule = r; break }
      }
      if (rule == 0) { print "layering: target " t " (" where[t] ") has no link rule in tests/check_layering.sh"; ++violations; continue }
      delete seen; delete parent; nreached = 0
      visit(t)
      for (i = 1; i <= nreached; ++i) {
        m = reached[i]
        if (admits(allowed[rule], m) &&
            !(in_folder(dir[m], "examples") && dir[t] !~ /^(examples|cli|tests|bench)(\/|$)/)) continue
        via = ""
        for (p = parent[m]; p != t; p = parent[p]) via = p (via == "" ? "" : ", " via)
        print "layering: target " t " (" where[t] ") links " m (via == "" ? "" : " through " via); ++violations
      }
    }
    exit violations > 0 ? 1 : 0
  }' || broken=1

if ((broken)); then
  echo "layering: the dependency direction of docs/design.md section 2 is broken"
  exit 1
fi
echo "layering: every file reaches and every target links only the layers below it"
