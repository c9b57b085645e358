#!/usr/bin/env bash
# End to end: the orchestrator's dashboard (GET /ui) in headless Chromium, against a live `weft run`.
#   - /ui answers 200 text/html without a token, and the page refers to nothing outside itself;
#   - with the viewer token (/ui#token=v) it shows every region and the published versions, and a
#     screenshot of it is taken (printed as SCREENSHOT <path>);
#   - without a token it shows the token form and none of the run's data; with a wrong token, the
#     error and the form, and none of the data;
#   - Chromium can reach the orchestrator alone (every other host name resolves to nothing and
#     every other address goes to a proxy that is not there), and the page asks it for nothing else.
# Usage: dashboard_test.sh WEFT WORKDIR
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
weft=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
work=$(pwd)
source "$here/../test_lib.sh"

if ! command -v chromium > /dev/null; then
  bash "$here/../install_packages.sh" dashboard_test chromium
  command -v chromium > /dev/null || { fail "chromium is not installed and could not be installed"; exit 1; }
fi

# Fixed ports below the ephemeral range, in this test's own slice (see run_test.sh).
base=$((12000 + RANDOM % 2000))
url=http://127.0.0.1:$((base + 1))
run_id=dash-e2e
regions=(near far)
cat > run.yaml <<YAML
run: {id: $run_id, dir: $work/run, time_limit: 240s}
store: {listen: 127.0.0.1:$base}
orchestrator:
  listen: 127.0.0.1:$((base + 1))
  max_staleness: 4
  lease: 10s
  cluster_timeout: 3s
  tick: 50ms
  max_wait: 2s
  tokens: {worker: w, trainer: t, admin: a, viewer: v}
regions:
  - {name: near, relay: 127.0.0.1:$((base + 2)), bandwidth: 50MB, latency: 2ms, workers: 2}
  - {name: far, relay: 127.0.0.1:$((base + 3)), bandwidth: 5MB, latency: 30ms, workers: 2}
worker: {capacity: 2, heartbeat: 300ms}
model: {d_model: 64, layers: 2, heads: 4, d_ff: 256}
task: {digits: 1}
trainer:
  threads: 1
  warmup: {steps: 10, batch: 16}
  steps: 40
  prompts_per_step: 8
  samples_per_prompt: 4
  eval_problems: 20
  min_step_time: 2s    # so that the run is still going while Chromium looks at it; stopped below
YAML

"$weft" run run.yaml > run.out 2>&1 &
run_pid=$!
# Stops the run (SIGTERM: it stops its processes in order and writes its report); 0 if it ended
# within a minute, as an interrupted run or one that had finished on its own.
stop_run() {
  kill -0 $run_pid 2> /dev/null && kill -TERM $run_pid
  for _ in $(seq 1 600); do kill -0 $run_pid 2> /dev/null || break; sleep 0.1; done
  if kill -0 $run_pid 2> /dev/null; then
    kill -KILL $run_pid 2> /dev/null
    wait $run_pid 2> /dev/null
    return 1
  fi
  wait $run_pid
  local rc=$?
  [ $rc -eq 0 ] || { [ $rc -eq 1 ] && grep -q "interrupted" run.out; }
}
trap 'kill -0 $run_pid 2> /dev/null && stop_run' EXIT

status() { curl -sf --max-time 5 -H "Authorization: Bearer $1" "$url/v1/status"; }
latest() { status a | jq -r '.latest_version // -1' 2> /dev/null || echo -1; }
published=false
for _ in $(seq 1 1200); do
  [ "$(latest)" -ge 3 ] 2> /dev/null && { published=true; break; }
  kill -0 $run_pid 2> /dev/null || break
  sleep 0.1
done
if ! $published; then
  fail "the run never published version 3: $(tail -5 run.out)"
  exit 1
fi
status a > status.json && ok || fail "GET /v1/status with the admin token failed"
status v > /dev/null && ok || fail "GET /v1/status with the viewer token failed"
# What must never show without a valid token: the run id, the regions and the clusters.
mapfile -t clusters < <(jq -r '.clusters[].id' status.json 2> /dev/null)
secrets=("$run_id" "${regions[@]}" "${clusters[@]}")
[ ${#secrets[@]} -gt 3 ] && ok || fail "no clusters in the status: $(head -c 300 status.json)"

# The page: served without a token, as HTML, holding no data, and self-contained.
code=$(curl -s --max-time 5 -D ui.headers -o page.html -w '%{http_code}' "$url/ui")
[ "$code" = 200 ] && ok || fail "GET /ui without a token answered $code"
grep -qi '^content-type: *text/html' ui.headers && ok || fail "GET /ui is not text/html: $(cat ui.headers)"
grep -q 'id="regions"' page.html && ok || fail "GET /ui is not the dashboard: $(head -c 300 page.html)"
for s in "$run_id" "${clusters[@]}"; do
  grep -qw -- "$s" page.html && fail "the page as served holds the run's data: '$s'"
done
q="[\"']?[[:space:]]*"
if grep -Eion "https?://|(src|href|action|formaction|poster|srcset|xlink:href)[[:space:]]*=[[:space:]]*$q//|url\($q//|@import|import[[:space:]]*\(|^[[:space:]]*import[[:space:]]|<link[[:space:]]|<script[^>]*[[:space:]]src[[:space:]]*=" \
    page.html > urls.txt; then
  fail "the page refers to something outside itself: $(head -5 urls.txt)"
else
  ok
fi

# Headless Chromium that can reach the orchestrator alone. chrome NAME URL ARGS...: writes NAME.html
# (the DOM once the page has run for 8 s of virtual time) unless ARGS take a screenshot instead.
export HOME=$work/home
mkdir -p "$HOME"
chrome() {
  local name=$1 page=$2
  shift 2
  timeout 120 chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
    --disable-sync --disable-background-networking --disable-component-update \
    --user-data-dir="$work/chromium-$name" \
    --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" --proxy-server=127.0.0.1:9 \
    --virtual-time-budget=8000 "$@" "$page" > "$name.html" 2> "$name.err"
}
# What a dumped DOM shows, as JSON: each element with an id (hidden, itself or by an ancestor, and
# its text), the data-region values under #regions, the data-version values under #timeline, the
# data-cluster values, and the text and attribute values outside scripts and styles.
cat > dom_facts.py <<'PY'
import json, sys
from html.parser import HTMLParser
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
class Facts(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.ids = [], {}
        self.out = {"regions": [], "versions": [], "clusters": [], "text": "", "attributes": []}
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        up = self.stack[-1] if self.stack else {"hidden": False, "ids": (), "code": False}
        hidden = "hidden" in a or up["hidden"]
        ids = up["ids"] + ((a["id"],) if a.get("id") else ())
        code = tag in ("script", "style", "template") or up["code"]
        if a.get("id"):
            self.ids[a["id"]] = {"hidden": hidden, "text": ""}
        if not code:
            self.out["attributes"] += [v for k, v in attrs if v and k not in ("class", "style")]
            if "data-region" in a and "regions" in ids: self.out["regions"].append(a["data-region"])
            if "data-version" in a and "timeline" in ids: self.out["versions"].append(a["data-version"])
            if "data-cluster" in a: self.out["clusters"].append(a["data-cluster"])
        if tag not in VOID:
            self.stack.append({"tag": tag, "hidden": hidden, "ids": ids, "code": code})
    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()["tag"] == tag: break
    def handle_data(self, data):
        if not self.stack or self.stack[-1]["code"]: return
        for i in self.stack[-1]["ids"]: self.ids[i]["text"] += data
        self.out["text"] += data + "\n"  # a break between nodes, so that words stay apart
f = Facts()
f.feed(open(sys.argv[1], encoding="utf-8").read())
f.out["ids"] = f.ids
json.dump(f.out, sys.stdout)
PY
facts() { python3 dom_facts.py "$1.html" > "$1.json" 2> "$1.facts.err" || echo '{}' > "$1.json"; }
# fact NAME 'jq expression' 'what it means'
fact() {
  if [ "$(jq -r "$2" "$1.json" 2> /dev/null)" = true ]; then ok; else fail "$1: $3 ($2)"; fi
}
# shows_nothing NAME: none of the run's data in the page.
shows_nothing() {
  fact "$1" '(.regions + .versions + .clusters) == []' "no region, version or cluster rows"
  local s
  jq -r '.text, .attributes[]' "$1.json" > "$1.txt" 2> /dev/null
  for s in "${secrets[@]}"; do
    grep -qw -- "$s" "$1.txt" && fail "$1: the page shows '$s'"
  done
}

# 1. With the viewer token. Every request the page made (Chromium's net log: the requests the
#    orchestrator's origin initiated) went to the orchestrator.
chrome viewer "$url/ui#token=v" --dump-dom --log-net-log="$work/viewer.netlog.json" ||
  fail "chromium failed on the dashboard: $(tail -3 viewer.err)"
facts viewer
jq -r --arg origin "$url" '.constants.logEventTypes.URL_REQUEST_START_JOB as $start
  | .events[] | select(.type == $start and .params.initiator == $origin) | .params.url' \
  viewer.netlog.json > requests.txt 2> /dev/null || fail "chromium wrote no readable net log"
grep -qx "$url/v1/status" requests.txt && ok || fail "the page never requested $url/v1/status"
grep -v "^$url/" requests.txt > elsewhere.txt && fail "the page made requests elsewhere: $(head -3 elsewhere.txt)"
for r in "${regions[@]}"; do
  fact viewer "[.regions[] | select(. == \"$r\")] | length == 1" "region $r shown once in #regions"
done
fact viewer '.regions | length == 2' "exactly the two regions"
fact viewer '.versions | length >= 1' "at least one version row in #timeline"
fact viewer '.clusters | length >= 4' "the clusters table"
fact viewer ".ids.run.text == \"$run_id\"" "the run id"
fact viewer '.ids.alerts != null and .ids.alerts.hidden == false' "#alerts shown"
fact viewer '.ids.error.hidden and .ids.login.hidden' "no error and no token form"
chrome screenshot "$url/ui#token=v" --hide-scrollbars --window-size=1400,1000 \
  --screenshot="$work/dashboard.png" || fail "chromium failed to take a screenshot: $(tail -3 screenshot.err)"
size=$(stat -c %s dashboard.png 2> /dev/null || echo 0)
if [ "$(head -c 4 dashboard.png 2> /dev/null | tail -c 3)" = PNG ] && [ "$size" -gt 40000 ]; then
  ok
  echo "SCREENSHOT $work/dashboard.png"
else
  fail "the screenshot is missing or nearly blank ($size bytes)"
fi

# 2. Without a token: the form, nothing else.
chrome none "$url/ui" --dump-dom || fail "chromium failed on the page without a token: $(tail -3 none.err)"
facts none
fact none '.ids.login.hidden == false' "#login shown"
fact none '.ids.dash.hidden' "the data section hidden"
shows_nothing none

# 3. With a wrong token: the error and the form, nothing else.
chrome wrong "$url/ui#token=not-a-token" --dump-dom || fail "chromium failed with a wrong token: $(tail -3 wrong.err)"
facts wrong
fact wrong '.ids.error.hidden == false and (.ids.error.text | test("401|403"))' "#error shown, with the status"
fact wrong '.ids.login.hidden == false' "#login shown"
shows_nothing wrong

# The run, still going all along (so that the page was looking at a live orchestrator), is stopped.
kill -0 $run_pid 2> /dev/null && ok || fail "the run ended before the checks were done: $(tail -5 run.out)"
stop_run && ok || fail "weft run did not stop cleanly on SIGTERM: $(tail -5 run.out)"
curl -s --max-time 2 "$url/ui" > /dev/null && fail "the orchestrator still answers after the run stopped"

if [ "$failed" -gt 0 ]; then
  echo "--- weft run's output"; grep -v '^\[' run.out | tail -20
  for n in viewer none wrong; do
    echo "--- $n: $(jq -c '.ids | with_entries(.value.text |= .[:120])' $n.json 2> /dev/null)"
  done
fi
echo "dashboard e2e: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
