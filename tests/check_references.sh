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

while IFS= read -r file; do
  dir=$(dirname "$file")
  # Paths of the project.
  while IFS= read -r path; do
    [[ -e $path || -e $dir/$path ]] || report "$file cites $path, which does not exist"
  done < <(grep -ohE "\\b($folders)/[A-Za-z0-9_/.-]+\\.(h|cc|md|sh|yaml|py)\\b" "$file" | sort -u)
  # Documents by name, their numbered sections and their headings.
  while IFS= read -r doc; do
    [[ -e docs/$doc || -e $doc ]] || report "$file cites $doc, which is not in docs/"
  done < <(grep -ohE '\b[A-Za-z_]+\.md\b' "$file" | grep -v '^README.md$' | sort -u)
  while IFS= read -r cite; do
    doc=$(sed -E 's/^([a-z_]+\.md).*/\1/' <<< "$cite")
    section=$(grep -oE '[0-9]+(\.[0-9]+)*$' <<< "$cite")
    [[ -e docs/$doc ]] || continue
    grep -qE "^#+ ${section//./\\.}(\.| )" "docs/$doc" || report "$file cites $doc section $section, which it does not have"
  done < <(grep -ohE '\b[a-z_]+\.md,? sections? [0-9]+(\.[0-9]+)*' "$file" | sort -u)
  while IFS= read -r cite; do
    doc=$(sed -E 's/^([a-z_]+\.md).*/\1/' <<< "$cite")
    heading=$(sed -E 's/^[^"]*"([^"]+)".*/\1/' <<< "$cite")
    [[ -e docs/$doc ]] || continue
    grep -E '^#+ ' "docs/$doc" | grep -qF "$heading" ||
      report "$file cites the heading \"$heading\" of $doc, which it does not have"
  done < <(grep -ohE '\b[a-z_]+\.md[,]? \(?"[^"]+"' "$file" | sort -u)
done < <(git ls-files | grep -vE '\.(bin)$|^tests/check_references\.sh$')

if ((problems > 0)); then
  echo "references: $problems dangling"
  exit 1
fi
echo "references: every cited file, document, section and heading exists"
