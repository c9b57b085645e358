#!/usr/bin/env bash
# Every reference in the code and the docs leads somewhere: a path of the project names a file that
# exists (from the repository's root or from the citing file's folder), a document cited by name
# is in docs/, and a cited section ("formats.md section 7.1") or heading (docs/api.md, "Relay")
# is one of that document's headings.
# Usage: tests/check_references.sh        (from anywhere; exit status 1 names every dangling one)
set -euo pipefail
cd "$(dirname "$0")/.."

problems=0
report() { echo "references: $1"; problems=$((problems + 1)); }
folders='common|sync|policy_store|orchestrator|rollout_worker|trainer_adapter|examples|sim|cli|tests|bench|docs|configs'
mapfile -t files < <(git ls-files | grep -vE '\.(bin)$|^tests/check_references\.sh$')

# Each kind of reference is found by one grep over every file ("FILE:REFERENCE" lines, each once),
# and each document's headings are read once.
matches() { printf '%s\0' "${files[@]}" | xargs -0 grep -oHE "$1" | sort -u || true; }
declare -A headings
for doc in docs/*.md; do headings[${doc#docs/}]=$(grep -E '^#+ ' "$doc" || true); done

# Paths of the project.
while IFS=: read -r file path; do
  [[ $file == */* ]] && dir=${file%/*} || dir=.
  [[ -e $path || -e $dir/$path ]] || report "$file cites $path, which does not exist"
done < <(matches "\\b($folders)/[A-Za-z0-9_/.-]+\\.(h|cc|md|sh|yaml|py)\\b")
# Documents by name.
while IFS=: read -r file doc; do
  [[ $doc == README.md || -e docs/$doc || -e $doc ]] || report "$file cites $doc, which is not in docs/"
done < <(matches '\b[A-Za-z_]+\.md\b')
# Their numbered sections.
while IFS=: read -r file cite; do
  [[ $cite =~ ^([a-z_]+\.md).*[^0-9.]([0-9]+(\.[0-9]+)*)$ ]] || continue
  doc=${BASH_REMATCH[1]} section=${BASH_REMATCH[2]}
  [[ -e docs/$doc ]] || continue
  grep -qE "^#+ ${section//./\\.}(\.| )" <<< "${headings[$doc]}" ||
    report "$file cites $doc section $section, which it does not have"
done < <(matches '\b[a-z_]+\.md,? sections? [0-9]+(\.[0-9]+)*')
# Their headings.
while IFS=: read -r file cite; do
  [[ $cite =~ ^([a-z_]+\.md)[^\"]*\"([^\"]+)\" ]] || continue
  doc=${BASH_REMATCH[1]} heading=${BASH_REMATCH[2]}
  [[ -e docs/$doc ]] || continue
  grep -qF "$heading" <<< "${headings[$doc]}" ||
    report "$file cites the heading \"$heading\" of $doc, which it does not have"
done < <(matches '\b[a-z_]+\.md[,]? \(?"[^"]+"')

if ((problems > 0)); then
  echo "references: $problems dangling"
  exit 1
fi
echo "references: every cited file, document, section and heading exists"
