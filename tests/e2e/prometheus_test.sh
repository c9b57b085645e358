#!/usr/bin/env bash
# End to end: a real Prometheus (Debian's 2.42, started by tests/monitoring/prometheus.sh with the
# alerting rules of configs/monitoring) scrapes a running `weft run` (the orchestrator's /metrics
# and each region's relay's, once a second), and what PromQL answers agrees with what the
# orchestrator says of itself (/v1/status) and with the run's report.json:
#   1. plumbing: every target is up; the orchestrator's, a relay's and the store server's /metrics
#      pass `promtool check metrics` without a word; the latest version and the relays' upstream
#      bytes (labelled by region) can be queried; every metric family of the observability
#      additions is exposed, and /v1/status has their fields; the dashboard's and the alerting
#      rules' metrics all exist (tests/monitoring/check_dashboard.sh);
#   2. mid-run: rate() and increase() of delivered trajectories over 30 s agree with the counts
#      /v1/status gave at the window's two ends, and rates over its own window with its `rates`;
#   3. with the trainer stopped (SIGSTOP: no version is announced and nothing is delivered, while
#      the workers finish and sync), exactly: per region and fraction, the publication-to-ready
#      observations count the versions /v1/status shows reached, and histogram_quantile(0.5) lies
#      in the histogram bucket of the median of their ready_*_seconds; delivered, accepted and
#      dropped trajectories per region add up to /v1/status's; the staleness histogram is its
#      `staleness`; trainer wait and publish times are what the trainer reported; the region
#      gauges are its regions'; the relays' upstream bytes are their /v1/stats; every dashboard
#      expression evaluates and every selector in it matches series; every alerting rule
#      evaluates without an error and none fires;
#   4. after the run: the last values scraped agree with report.json (trajectories delivered,
#      delivered_per_s, "publication" and regions[].ready_after_publication, trainer_wait, relays'
#      upstream bytes), and WeftOrchestratorDown goes pending once the orchestrator is gone.
# Prints FIGURE lines with the values compared. A check of a metric family or status field that
# the orchestrator does not expose fails once, naming it, and the checks that need it are skipped.
# Usage: prometheus_test.sh WEFT WORKDIR
set -uo pipefail
weft=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
work=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
monitoring=$(cd "$here/../monitoring" && pwd)
configs=$(cd "$here/../../configs/monitoring" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
work=$(pwd)
source "$here/../test_lib.sh"

# Fixed ports below the ephemeral range (32768 and up), where only listeners bind.
# Its own slice of ports, so that tests run in parallel (ctest -j2) never pick the same ones.
base=$((10000 + RANDOM % 1900))
store_port=$base orchestrator_port=$((base + 1)) near_relay=$((base + 2)) far_relay=$((base + 3))
prometheus_port=$((base + 4))
steps=30            # 31 versions: all within the 32 that /v1/status and the report list
freeze_at=26        # the version at which the trainer is stopped for the exact comparisons
prompts_per_step=8  # trajectory groups per batch
admin=a
cat > run.yaml <<YAML
run: {id: prometheus, dir: $work/run, time_limit: 300s}
store: {listen: 127.0.0.1:$store_port}
orchestrator:
  listen: 127.0.0.1:$orchestrator_port
  max_staleness: 4
  lease: 10s
  cluster_timeout: 5s
  max_in_flight: 128
  tick: 50ms
  max_wait: 2s
  tokens: {worker: w, trainer: t, admin: $admin}
regions:
  - {name: near, relay: 127.0.0.1:$near_relay, bandwidth: 50MB, latency: 2ms, workers: 2}
  - {name: far, relay: 127.0.0.1:$far_relay, bandwidth: 5MB, latency: 30ms, workers: 2}
worker: {capacity: 2, heartbeat: 300ms}
model: {d_model: 64, layers: 2, heads: 4, d_ff: 256}
task: {digits: 1}
trainer:
  threads: 1
  warmup: {steps: 30, batch: 16}
  steps: $steps
  prompts_per_step: $prompts_per_step
  samples_per_prompt: 4
  eval_problems: 50
  stall_after: 120s
  min_step_time: 1500ms    # 30 steps last 45 s at least: a 30 s window fits before the freeze
YAML

run_pid="" sampler_pid="" trainer_pid=""
cleanup() {
  [ -n "$trainer_pid" ] && kill -CONT "$trainer_pid" 2> /dev/null
  [ -n "$sampler_pid" ] && kill "$sampler_pid" 2> /dev/null
  if [ -n "$run_pid" ] && kill -0 "$run_pid" 2> /dev/null; then
    kill -TERM "$run_pid" 2> /dev/null
    wait "$run_pid" 2> /dev/null
  fi
  cp "$work/prometheus/prometheus.log" "$work/prometheus.log" 2> /dev/null
  bash "$monitoring/prometheus.sh" stop "$work/prometheus" > /dev/null 2>&1
}
trap cleanup EXIT

# The checks, in phases: each prints FIGURE and FAIL lines and ends with "RESULT passed failed".
cat > checks.py <<'PY'
import contextlib, io, itertools, json, math, os, re, subprocess, sys, time, urllib.parse, urllib.request

PROM = os.environ["PROM_URL"]
ORCH = os.environ["ORCH_URL"]
ADMIN = os.environ["ADMIN_TOKEN"]
RELAYS = dict(r.split("=", 1) for r in os.environ["RELAYS"].split())  # region -> host:port
PROMPTS = int(os.environ["PROMPTS_PER_STEP"])
REGIONS = sorted(RELAYS)
passed = failed = 0
state_path = "checks-state.json"
state = json.load(open(state_path)) if os.path.exists(state_path) else {}

# The contract's new metric families of the orchestrator, and the buckets of the publication one.
NEW_FAMILIES = {
    "weft_orchestrator_publication_to_ready_seconds": "histogram",
    "weft_orchestrator_publication_missed_clusters_total": "counter",
    "weft_orchestrator_delivered_staleness_versions": "histogram",
    "weft_orchestrator_region_delivered_total": "counter",
    "weft_orchestrator_region_dropped_stale_total": "counter",
    "weft_orchestrator_region_accepted_total": "counter",
    "weft_orchestrator_region_capacity_slots": "gauge",
    "weft_orchestrator_region_busy_slots": "gauge",
    "weft_orchestrator_region_utilisation_ratio": "gauge",
    "weft_orchestrator_region_clusters": "gauge",
    "weft_orchestrator_trainer_wait_seconds": "histogram",
    "weft_orchestrator_publish_seconds": "histogram",
    "weft_orchestrator_engine_pause_seconds": "histogram",
    "weft_orchestrator_region_sync_bytes_total": "counter",
    "weft_orchestrator_cluster_max_pause_seconds": "gauge",
    "weft_orchestrator_cluster_series_omitted": "gauge",
}
PUBLICATION_BOUNDS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, math.inf]
FRACTIONS = {"0.5": "ready_50_seconds", "0.9": "ready_90_seconds", "1": "ready_100_seconds"}


def ok():
    global passed
    passed += 1


def fail(message):
    global failed
    failed += 1
    print(f"FAIL: {message}", flush=True)


def check(condition, message):
    ok() if condition else fail(message)
    return condition


def figure(text):
    print(f"FIGURE {text}", flush=True)


def get(url, token=None, timeout=10):
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return r.read().decode()


def status():
    return json.loads(get(ORCH + "/v1/status", ADMIN))


class QueryError(Exception):
    pass


def prom(query, at=None):
    """The result list of an instant query (at a unix time, or now)."""
    params = {"query": query}
    if at is not None:
        params["time"] = f"{at:.3f}"
    try:
        answer = json.loads(get(PROM + "/api/v1/query?" + urllib.parse.urlencode(params)))
    except urllib.error.HTTPError as e:
        answer = json.loads(e.read().decode() or "{}")
    if answer.get("status") != "success":
        raise QueryError(f"{query}: {answer.get('error')}")
    return answer["data"]["result"]


def by(result, label):
    """{label value: float value} of an instant vector."""
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


def scalar(result):
    if len(result) != 1:
        raise QueryError(f"expected one series, got {len(result)}")
    return float(result[0]["value"][1])


def families(text):
    return {m.group(1): m.group(2)
            for m in re.finditer(r"^#\s*TYPE\s+(\S+)\s+(\S+)", text, re.M)}


def near(a, b, tolerance):
    return a is not None and b is not None and abs(a - b) <= tolerance


# --- What the orchestrator exposes; a missing family or field fails once and skips what needs it.
exposed = state.get("families", {})


def need(family):
    kind, want = exposed.get(family), NEW_FAMILIES.get(family)
    if kind is not None and (want is None or kind == want):
        return True
    if family not in state.setdefault("missing_reported", []):
        state["missing_reported"].append(family)
        if kind is None:
            fail(f"the orchestrator's /metrics has no {want or ''} family {family} (checks that "
                 f"need it skipped)")
        else:
            fail(f"the orchestrator's {family} is a {kind}, not a {want}")
    return False


def need_field(obj, path, where="/v1/status"):
    """obj at the dotted path, or None (failing once for that path)."""
    value = obj
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            if path not in state.setdefault("missing_reported", []):
                state["missing_reported"].append(path)
                fail(f"{where} has no field {path} (checks that need it skipped)")
            return None
        value = value[key]
    return value


# --- Histogram buckets: the range of values histogram_quantile can give for a given median.
def bucket_of(value):
    for i, upper in enumerate(PUBLICATION_BOUNDS):
        if value <= upper:
            lower = PUBLICATION_BOUNDS[i - 1] if i > 0 else 0.0
            return lower, upper if upper != math.inf else PUBLICATION_BOUNDS[-2]
    raise ValueError(value)


def quantile_range(values, eps=0.002):
    """[low, high] that histogram_quantile(0.5) over these observations falls in: the bounds of
    the bucket of the ceil(n/2)-th smallest (widened to the neighbouring bucket where that value
    is within eps of a bound: the status rounds what the histogram observed exactly)."""
    v = sorted(values)
    m = v[math.ceil(len(v) / 2) - 1]
    low = min(bucket_of(max(m - eps, 0))[0], bucket_of(m)[0])
    high = max(bucket_of(m + eps)[1], bucket_of(m)[1])
    return low, high


def fmt_range(r):
    return f"({r[0]:g}, {r[1]:g}]"


def reached(versions, region, field):
    """The ready_*_seconds values of versions whose population in the region was > 0."""
    out = []
    for v in versions:
        r = v.get("regions", {}).get(region)
        if r and r.get("population", 0) > 0 and r.get(field) is not None:
            out.append(float(r[field]))
    return out


def delivered_of(s):
    t = s["trajectories"]
    return t["delivered_fresh"] + t["delivered_stale"]


# =========================================================================================
def phase_plumbing():
    global exposed
    # Every target up.
    deadline = time.time() + 20
    while True:
        targets = json.loads(get(PROM + "/api/v1/targets"))["data"]["activeTargets"]
        health = {(t["labels"]["job"], t["labels"].get("region", "")): (t["health"], t["lastError"])
                  for t in targets}
        if len(health) == 1 + len(REGIONS) and all(h == "up" for h, _ in health.values()):
            break
        if time.time() > deadline:
            break
        time.sleep(0.5)
    check(len(health) == 1 + len(REGIONS) and all(h == "up" for h, _ in health.values()),
          f"Prometheus's targets are not all up: {health}")
    # promtool check metrics on each server's /metrics, which must say nothing at all.
    texts = {"orchestrator": get(ORCH + "/metrics"),
             "relay": get("http://" + RELAYS[REGIONS[0]] + "/metrics"),
             "store": get(os.environ["STORE_URL"] + "/metrics")}
    for name, text in texts.items():
        with open(f"{name}.metrics", "w") as f:
            f.write(text)
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                           text=True)
        said = (r.stdout + r.stderr).strip()
        check(r.returncode == 0 and not said,
              f"promtool check metrics on the {name}'s /metrics (exit {r.returncode}): {said}")
    exposed = families(texts["orchestrator"])
    state["families"] = exposed
    # Metrics that exist today can be queried, with the relays' region labels.
    s = status()
    latest = scalar(prom('weft_orchestrator_latest_version{job="weft-orchestrator"}'))
    check(near(latest, s["latest_version"], 2),
          f"weft_orchestrator_latest_version is {latest}, /v1/status says {s['latest_version']}")
    upstream = by(prom('weft_relay_upstream_bytes_total{job="weft-relay"}'), "region")
    check(sorted(upstream) == REGIONS and all(b > 0 for b in upstream.values()),
          f"weft_relay_upstream_bytes_total by region: {upstream} (want {REGIONS}, each > 0)")
    figure(f"plumbing: latest version {latest:g} (status {s['latest_version']}), relay upstream "
           f"bytes {upstream}")
    # The observability additions: every new family, and the status fields.
    for family in NEW_FAMILIES:
        need(family)
    for field in ("versions", "trainer", "rates", "staleness"):
        need_field(s, field)
    for region in REGIONS:
        for field in ("capacity", "busy", "utilisation", "accepted", "delivered", "dropped_stale",
                      "sync"):
            need_field(s, f"regions.{region}.{field}")


# =========================================================================================
def extrapolated_increase(points, start, end):
    """increase() as Prometheus 2.42 computes it from the (time, value) samples of a counter in
    the window (start, end]: the difference between the last and the first, extrapolated towards
    the window's ends (to an end less than 1.1 sample intervals away, else half an interval)."""
    (t0, v0), (t1, v1) = points[0], points[-1]
    delta, sampled = v1 - v0, t1 - t0
    to_start, to_end = t0 - start, end - t1
    average = sampled / (len(points) - 1)
    if delta > 0 and v0 >= 0:
        to_start = min(to_start, sampled * v0 / delta)
    interval = sampled
    interval += to_start if to_start < average * 1.1 else average / 2
    interval += to_end if to_end < average * 1.1 else average / 2
    return delta * interval / sampled


def phase_live():
    samples = [json.loads(l) for l in open("samples.jsonl") if l.strip()]
    at = time.time() - 2  # scraped by now
    window = 30
    raw = prom(f"weft_orchestrator_trajectories_delivered_total[{window}s]", at)
    scraped = [(float(t), float(v)) for t, v in raw[0]["values"]] if raw else []
    with open("live-window.json", "w") as f:  # both sides' samples, for a look
        json.dump({"at": at, "prometheus": scraped,
                   "status": [x for x in samples if at - window - 2 <= x["t"] <= at + 2]}, f)
    if not check(len(scraped) >= window // 2, f"only {len(scraped)} scrapes of the orchestrator "
                                              f"in the {window} s before the freeze"):
        return

    def status_at(t):  # the status sample nearest to t
        return min(samples, key=lambda x: abs(x["t"] - t))["delivered"]

    # The orchestrator's own counts at the instants Prometheus scraped, through the same
    # arithmetic; they can differ by a batch at each end (the status page was read up to a
    # quarter second away from the scrape).
    expected = extrapolated_increase([(t, status_at(t)) for t, _ in scraped], at - window, at)
    factor = expected / max(status_at(scraped[-1][0]) - status_at(scraped[0][0]), 1)
    plain = status_at(at) - status_at(at - window)
    rate = scalar(prom(f"rate(weft_orchestrator_trajectories_delivered_total[{window}s])", at))
    increase = scalar(prom(f"increase(weft_orchestrator_trajectories_delivered_total[{window}s])", at))
    tolerance = 2 * PROMPTS * max(factor, 1) + 0.01
    figure(f"delivered over {window} s: increase() {increase:.1f}, rate() {rate:.3f}/s; from "
           f"/v1/status's counts at the scrapes {expected:.1f} ({expected / window:.3f}/s); "
           f"/v1/status's count over the window {plain}")
    check(expected > 0, f"no trajectory delivered in the {window} s before the freeze")
    check(near(increase, expected, tolerance),
          f"increase(weft_orchestrator_trajectories_delivered_total[{window}s]) is {increase:.1f}, "
          f"/v1/status's counts give {expected:.1f}")
    check(near(rate, expected / window, tolerance / window),
          f"rate(weft_orchestrator_trajectories_delivered_total[{window}s]) is {rate:.3f}, "
          f"/v1/status's counts give {expected / window:.3f}/s")
    # The status page's own rates, over its window, against Prometheus's over the same.
    s = status()
    rates = need_field(s, "rates")
    if rates is None:
        return
    w = round(float(rates["window_seconds"]))  # (PromQL durations are whole units)
    for field, counter in (("delivered_per_s", "weft_orchestrator_trajectories_delivered_total"),
                           ("accepted_per_s", "weft_orchestrator_submissions_accepted_total"),
                           ("leases_per_s", "weft_orchestrator_leases_granted_total")):
        theirs = float(rates[field])
        mine = scalar(prom(f"rate({counter}[{w:g}s])", time.time() - 1))
        figure(f"{field}: /v1/status {theirs:.3f} over {w:g} s, Prometheus rate() {mine:.3f}")
        check(near(theirs, mine, max(0.5 * mine, 2 * PROMPTS / w)),
              f"/v1/status rates.{field} is {theirs:.3f}, rate({counter}[{w:g}s]) {mine:.3f}")


# =========================================================================================
def settled(s):
    """What must not move for the frozen comparisons."""
    versions = [(v["version"], sorted((r, x.get("ready"), x.get("ready_100_seconds"))
                                      for r, x in v.get("regions", {}).items()))
                for v in s.get("versions", [])]
    return json.dumps([s["latest_version"], s["trajectories"], s["jobs"], s["leases"]["granted"],
                       {r: x.get("sync", {}).get("bytes_downloaded") for r, x in s["regions"].items()},
                       s.get("trainer"), versions], sort_keys=True)


def phase_settle():
    """Waits (30 s at most) until nothing moves: two status pages 1 s apart the same, and the latest
    version reached by every cluster of its population."""
    deadline = time.time() + 30
    last = None
    while time.time() < deadline:
        s = status()
        key = settled(s)
        versions = s.get("versions") or []
        full = all(x.get("population", 0) == 0 or x.get("ready_100_seconds") is not None
                   for x in (versions[-1]["regions"].values() if versions else []))
        if key == last and full:
            figure(f"settled at version {s['latest_version']} with {delivered_of(s)} trajectories "
                   f"delivered")
            return ok()
        last = key
        time.sleep(1)
    fail("with the trainer stopped, /v1/status did not stop moving within 30 s")


def phase_frozen():
    """The comparisons, again (3 tries) where /v1/status moved while they ran."""
    global passed, failed, state
    for attempt in range(3):
        counts, saved = (passed, failed), json.dumps(state)
        output = io.StringIO()
        before = status()
        with contextlib.redirect_stdout(output):
            try:
                frozen_checks(before)
            except QueryError as e:
                fail(f"a query failed: {e}")
        moved = settled(status()) != settled(before)
        if not moved or attempt == 2:
            sys.stdout.write(output.getvalue())
            check(not moved, "/v1/status kept moving with the trainer stopped")
            return
        print(f"(/v1/status moved during the comparisons; again)", flush=True)
        (passed, failed), state = counts, json.loads(saved)
        time.sleep(3)


def frozen_checks(s):
    global passed, failed
    mark = (passed, failed)
    # Counters that exist today: exactly what the status page says.
    delivered = delivered_of(s)
    for metric, theirs in (("weft_orchestrator_trajectories_delivered_total", delivered),
                           ("weft_orchestrator_submissions_accepted_total", s["trajectories"]["accepted"]),
                           ("weft_orchestrator_leases_granted_total", s["leases"]["granted"]),
                           ("weft_orchestrator_latest_version", s["latest_version"])):
        mine = scalar(prom(metric))
        check(mine == theirs, f"{metric} is {mine:g}, /v1/status says {theirs}")
    figure(f"frozen at version {s['latest_version']}: delivered {delivered}, accepted "
           f"{s['trajectories']['accepted']}, leases {s['leases']['granted']}")
    # The relays' WAN bytes, and the region's workers' downloads.
    upstream = by(prom("weft_relay_upstream_bytes_total"), "region")
    sync = by(prom("weft_orchestrator_region_sync_bytes_total"), "region") \
        if need("weft_orchestrator_region_sync_bytes_total") else {}
    state["frozen_upstream"] = upstream
    for region in REGIONS:
        stats = json.loads(get("http://" + RELAYS[region] + "/v1/stats"))
        check(upstream.get(region) == stats["upstream_bytes"],
              f"weft_relay_upstream_bytes_total{{region=\"{region}\"}} is {upstream.get(region)}, "
              f"the relay's /v1/stats says {stats['upstream_bytes']}")
        theirs = s["regions"][region]["sync"]["bytes_downloaded"]
        if sync:
            check(sync.get(region) == theirs,
                  f"weft_orchestrator_region_sync_bytes_total{{region=\"{region}\"}} is "
                  f"{sync.get(region)}, /v1/status regions.{region}.sync.bytes_downloaded {theirs}")
        figure(f"weight bytes {region}: workers downloaded {sync.get(region, 'n/a')} "
               f"(/v1/status {theirs}), relay fetched over the WAN {upstream.get(region)}")

    # Publication to ready, per region and fraction, against the versions list.
    versions = need_field(s, "versions")
    if versions is not None and need("weft_orchestrator_publication_to_ready_seconds"):
        complete = bool(versions) and versions[0]["version"] == 0
        check(complete, f"/v1/status's versions start at {versions[0]['version'] if versions else None}"
                        f", not 0: cannot compare every observation")
        for fraction, field in FRACTIONS.items():
            counts = by(prom(f'sum by (region) (weft_orchestrator_publication_to_ready_seconds_count'
                             f'{{fraction="{fraction}"}})'), "region")
            q = by(prom(f'histogram_quantile(0.5, sum by (le, region) (weft_orchestrator_publication'
                        f'_to_ready_seconds_bucket{{fraction="{fraction}"}}))'), "region")
            for region in REGIONS:
                values = reached(versions, region, field)
                check(counts.get(region) == len(values),
                      f"{region}, fraction {fraction}: Prometheus counts {counts.get(region)} "
                      f"observations, /v1/status has {len(values)} versions with {field}")
                if not values:
                    fail(f"{region}: no version has {field} in /v1/status")
                    continue
                rank = math.ceil(len(values) / 2)  # the observation histogram_quantile(0.5) finds
                median = sorted(values)[rank - 1]
                bounds = quantile_range(values)
                mine = q.get(region)
                figure(f"publication to {fraction} ready, {region}: histogram_quantile(0.5) "
                       f"{mine if mine is None else f'{mine:.3f}'} s; /v1/status's median (the "
                       f"{rank}th of {len(values)} versions) {median:.3f} s, bucket {fmt_range(bounds)}")
                check(mine is not None and bounds[0] <= mine <= bounds[1],
                      f"{region}, fraction {fraction}: histogram_quantile(0.5) is {mine}, outside "
                      f"{fmt_range(bounds)}, the bucket of /v1/status's median {median:.3f}")
        missed = by(prom("weft_orchestrator_publication_missed_clusters_total"), "region") \
            if need("weft_orchestrator_publication_missed_clusters_total") else None
        if missed is not None:
            for region in REGIONS:
                theirs = sum(v["regions"].get(region, {}).get("missed") or 0 for v in versions)
                check(missed.get(region) == theirs,
                      f"weft_orchestrator_publication_missed_clusters_total{{region=\"{region}\"}} "
                      f"is {missed.get(region)}, the versions' missed add up to {theirs}")

    # Per region: delivered, accepted, dropped; their sums are the totals.
    for family, field, total in (("weft_orchestrator_region_delivered_total", "delivered", delivered),
                                 ("weft_orchestrator_region_accepted_total", "accepted",
                                  s["trajectories"]["accepted"]),
                                 ("weft_orchestrator_region_dropped_stale_total", "dropped_stale",
                                  s["trajectories"]["dropped_stale"])):
        if not need(family):
            continue
        mine = by(prom(family), "region")
        check(sum(mine.values()) == total,
              f"{family} adds up to {sum(mine.values()):g}, /v1/status's total is {total}")
        for region in REGIONS:
            theirs = need_field(s, f"regions.{region}.{field}")
            if theirs is not None:
                check(mine.get(region) == theirs,
                      f"{family}{{region=\"{region}\"}} is {mine.get(region)}, /v1/status "
                      f"regions.{region}.{field} {theirs}")
    # Region gauges.
    for family, field in (("weft_orchestrator_region_capacity_slots", "capacity"),
                          ("weft_orchestrator_region_busy_slots", "busy"),
                          ("weft_orchestrator_region_utilisation_ratio", "utilisation")):
        if not need(family):
            continue
        mine = by(prom(family), "region")
        for region in REGIONS:
            theirs = need_field(s, f"regions.{region}.{field}")
            if theirs is not None:
                check(near(mine.get(region), float(theirs), 1e-6),
                      f"{family}{{region=\"{region}\"}} is {mine.get(region)}, /v1/status "
                      f"regions.{region}.{field} {theirs}")
    if need("weft_orchestrator_region_clusters"):
        ready = by(prom('weft_orchestrator_region_clusters{state="ready"}'), "region")
        for region in REGIONS:
            check(ready.get(region) == s["regions"][region]["ready"],
                  f"weft_orchestrator_region_clusters{{region=\"{region}\",state=\"ready\"}} is "
                  f"{ready.get(region)}, /v1/status regions.{region}.ready "
                  f"{s['regions'][region]['ready']}")
    if need("weft_orchestrator_cluster_series_omitted"):
        omitted = scalar(prom("weft_orchestrator_cluster_series_omitted"))
        check(omitted == 0, f"weft_orchestrator_cluster_series_omitted is {omitted} with 4 clusters")

    # Staleness of delivered groups: the histogram is the status page's counts.
    staleness = need_field(s, "staleness")
    if staleness is not None and need("weft_orchestrator_delivered_staleness_versions"):
        buckets = by(prom("sum by (le) (weft_orchestrator_delivered_staleness_versions_bucket)"), "le")
        count = scalar(prom("sum(weft_orchestrator_delivered_staleness_versions_count)"))
        check(count == delivered and sum(staleness.values()) == delivered,
              f"delivered groups: staleness histogram counts {count:g}, /v1/status staleness "
              f"{sum(staleness.values())}, delivered {delivered}")
        for le, n in sorted(buckets.items(), key=lambda x: float(x[0])):
            theirs = sum(c for lag, c in staleness.items() if int(lag) <= float(le))
            check(n == theirs, f"staleness bucket le={le}: {n:g}, /v1/status has {theirs} at or below")
        figure(f"staleness of delivered groups: {staleness}")

    # The trainer's waits and publishes.
    trainer = need_field(s, "trainer")
    for family, count_field, sum_field in (
            ("weft_orchestrator_trainer_wait_seconds", "steps_reported", "wait_seconds_total"),
            ("weft_orchestrator_publish_seconds", "publishes_reported", "publish_seconds_total")):
        if trainer is None or not need(family):
            continue
        count = scalar(prom(f"{family}_count"))
        total = scalar(prom(f"{family}_sum"))
        check(count == trainer[count_field],
              f"{family}_count is {count:g}, /v1/status trainer.{count_field} {trainer[count_field]}")
        check(near(total, float(trainer[sum_field]), 1e-3 + 1e-6 * total),
              f"{family}_sum is {total}, /v1/status trainer.{sum_field} {trainer[sum_field]}")
        figure(f"{family}: {count:g} observations, {total:.3f} s in all")
        if count_field == "steps_reported":
            state["frozen_steps_reported"] = count

    # The alerting rules: all evaluated without an error, none firing in a healthy run.
    groups = json.loads(get(PROM + "/api/v1/rules"))["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    check(len(rules) > 0, "Prometheus loaded no alerting rules")
    for r in rules:
        check(r.get("health") == "ok", f"alerting rule {r['name']}: health {r.get('health')}, "
                                       f"{r.get('lastError')}")
        check(r.get("state") != "firing", f"alerting rule {r['name']} fires in a healthy run")
    print(f"(frozen comparisons: {passed - mark[0]} passed, {failed - mark[1]} failed)", flush=True)


# =========================================================================================
def phase_final():
    report = json.load(open("run/report.json"))
    # The last scrape of the orchestrator, and the first.
    series = prom("weft_orchestrator_trajectories_delivered_total[10m]")
    if not check(len(series) == 1 and series[0]["values"], "no scraped trajectories delivered"):
        return
    values = series[0]["values"]
    last_at, last = values[-1][0], float(values[-1][1])
    ups = prom('up{job="weft-orchestrator"}[10m]')
    first_at = min(float(t) for t, v in ups[0]["values"] if v == "1") if ups else values[0][0]
    t = report["orchestrator"]["trajectories"]
    total = t["delivered_fresh"] + t["delivered_stale"]
    figure(f"trajectories delivered: report {total}, last scraped {last:g}")
    check(last <= total and total - last <= PROMPTS,
          f"the last scraped weft_orchestrator_trajectories_delivered_total is {last:g}, the "
          f"report's delivered_fresh + delivered_stale {total}")
    per_s = need_field(report, "delivered_per_s", "report.json")
    if per_s is not None:
        mine = last / (last_at - first_at) if last_at > first_at else 0
        figure(f"delivered per second: report {per_s:.3f}, Prometheus (last value over the time "
               f"scraped) {mine:.3f}, report total over its seconds {total / report['seconds']:.3f}")
        check(near(per_s, mine, 0.25 * mine), f"report delivered_per_s {per_s:.3f}, Prometheus "
                                              f"{mine:.3f}")

    # Publication: the report's list against the last histograms scraped.
    publication = need_field(report, "publication", "report.json")
    regions = need_field(report, "regions", "report.json")
    if publication is not None:
        check(len(publication) == min(32, report["versions_published"]) and publication
              and publication[-1]["version"] == report["versions_published"] - 1,
              f"report publication lists {len(publication)} versions ending at "
              f"{publication[-1]['version'] if publication else None}; {report['versions_published']}"
              f" were published")
    if publication is not None and need("weft_orchestrator_publication_to_ready_seconds"):
        counts = by(prom('sum by (region) (last_over_time(weft_orchestrator_publication_to_ready'
                         '_seconds_count{fraction="1"}[10m]))'), "region")
        q = by(prom('histogram_quantile(0.5, sum by (le, region) (last_over_time(weft_orchestrator_'
                    'publication_to_ready_seconds_bucket{fraction="1"}[10m])))'), "region")
        for region in REGIONS:
            # Observed by the last scrape: surely those reached half a second before it; maybe
            # those reached around it.
            sure, maybe = [], []
            for v in publication:
                r = v["regions"].get(region)
                if not r or r.get("population", 0) == 0 or r.get("ready_100_seconds") is None:
                    continue
                when = v["announced_at"] + r["ready_100_seconds"]
                (sure if when <= last_at - 0.5 else maybe).append(r["ready_100_seconds"])
            low, high = math.inf, -math.inf
            for k in range(len(maybe) + 1 if len(maybe) <= 4 else 0):
                for extra in itertools.combinations(maybe, k):
                    if sure or extra:
                        b = quantile_range(sure + list(extra))
                        low, high = min(low, b[0]), max(high, b[1])
            if len(maybe) > 4:
                low, high = quantile_range(sure + maybe)
            mine, n = q.get(region), counts.get(region)
            figure(f"publication to 100% ready, {region}, end of run: histogram_quantile(0.5) "
                   f"{mine if mine is None else f'{mine:.3f}'} s over {n} observations; the "
                   f"report's versions: {len(sure)} reached before the last scrape, {len(maybe)} "
                   f"around it; bucket {fmt_range((low, high))}")
            check(n is not None and len(sure) <= n <= len(sure) + len(maybe),
                  f"{region}: the last scrape counts {n} observations, the report's publication "
                  f"{len(sure)} (+{len(maybe)} around the last scrape)")
            check(mine is not None and low <= mine <= high,
                  f"{region}: histogram_quantile(0.5) at the end is {mine}, outside "
                  f"{fmt_range((low, high))}")
    if publication is not None and regions is not None:
        for region in REGIONS:
            mine = [x for x in regions if x.get("name") == region]
            if not check(len(mine) == 1, f"report regions[] has no entry named {region}"):
                continue
            ready = need_field(mine[0], "ready_after_publication", f"report regions[{region}]")
            if ready is None:
                continue
            population = [v["regions"][region] for v in publication
                          if v["regions"].get(region, {}).get("population", 0) > 0]
            never = [x for x in population if x.get("ready_100_seconds") is None]
            check(ready["versions"] == len(population),
                  f"{region}: ready_after_publication.versions is {ready['versions']}, the "
                  f"publication list has {len(population)} versions with a population")
            check(ready["versions_never_fully_ready"] == len(never),
                  f"{region}: versions_never_fully_ready is {ready['versions_never_fully_ready']}, "
                  f"the publication list has {len(never)}")
            # The median over versions, a never-reached one counting as infinite: between the two
            # middle values (whichever of them, or their mean, the report takes), null if infinite.
            values = sorted(math.inf if x.get("ready_100_seconds") is None
                            else float(x["ready_100_seconds"]) for x in population)
            if not values:
                continue
            lo, hi = values[(len(values) - 1) // 2], values[len(values) // 2]
            p100 = ready["p100_median"]
            figure(f"report p100_median {region}: {p100}, middle of the publication list's "
                   f"{len(values)} versions: {lo} .. {hi}")
            if p100 is None:
                check(hi == math.inf, f"{region}: p100_median is null, but the median is {lo} .. {hi}")
            else:
                check(lo - 1e-3 <= p100 <= hi + 1e-3,
                      f"{region}: p100_median {p100} is not the median ({lo} .. {hi}) of the "
                      f"publication list")

    # The trainer's waits: one per step.
    wait = need_field(report, "trainer_wait", "report.json")
    if wait is not None:
        check(wait["steps"] == report["steps"] and len(wait["per_step"]) == wait["steps"],
              f"trainer_wait: {wait['steps']} steps, {len(wait['per_step'])} per step, the run "
              f"{report['steps']} steps")
        check(near(sum(wait["per_step"]), wait["total_seconds"], 1e-3 + 1e-6 * wait["total_seconds"]),
              f"trainer_wait: per_step adds up to {sum(wait['per_step'])}, total_seconds "
              f"{wait['total_seconds']}")
        if need("weft_orchestrator_trainer_wait_seconds"):
            n = scalar(prom("last_over_time(weft_orchestrator_trainer_wait_seconds_count[10m])"))
            figure(f"trainer wait: report {wait['steps']} steps, {wait['total_seconds']:.3f} s; "
                   f"last scraped count {n:g}")
            check(wait["steps"] - 1 <= n <= wait["steps"],
                  f"the last scraped trainer wait count is {n:g}, the report has {wait['steps']} steps")

    # The relays' WAN bytes: the last scraped, between the frozen ones and the report's.
    upstream = by(prom("last_over_time(weft_relay_upstream_bytes_total[10m])"), "region")
    for region in REGIONS:
        theirs = report["relays"][region]["upstream_bytes"]
        frozen = state.get("frozen_upstream", {}).get(region, 0)
        figure(f"relay WAN bytes {region}: report {theirs}, last scraped {upstream.get(region)}")
        check(upstream.get(region) is not None and frozen <= upstream[region] <= theirs,
              f"{region}: the last scraped weft_relay_upstream_bytes_total is {upstream.get(region)}"
              f", not between {frozen} (frozen) and the report's {theirs}")

    # The orchestrator is gone: its alert goes pending.
    deadline = time.time() + 20
    pending = []
    while time.time() < deadline:
        pending = prom('ALERTS{alertname="WeftOrchestratorDown"}')
        if pending:
            break
        time.sleep(1)
    check(pending and pending[0]["metric"]["alertstate"] in ("pending", "firing"),
          "WeftOrchestratorDown did not go pending within 20 s of the orchestrator stopping")


# =========================================================================================
try:
    {"plumbing": phase_plumbing, "live": phase_live, "settle": phase_settle,
     "frozen": phase_frozen, "final": phase_final}[sys.argv[1]]()
except QueryError as e:
    fail(f"a query failed: {e}")
except Exception as e:  # a status page or report without what the checks read
    fail(f"{sys.argv[1]} checks stopped: {type(e).__name__}: {e}")
json.dump(state, open(state_path, "w"))
print(f"RESULT {passed} {failed}")
PY
export PROM_URL=http://127.0.0.1:$prometheus_port ORCH_URL=http://127.0.0.1:$orchestrator_port
export STORE_URL=http://127.0.0.1:$store_port ADMIN_TOKEN=$admin PROMPTS_PER_STEP=$prompts_per_step
export RELAYS="near=127.0.0.1:$near_relay far=127.0.0.1:$far_relay"
# checks PHASE: runs that phase of checks.py, adding its counts to this script's.
checks() {
  /usr/bin/python3 checks.py "$1" > "checks-$1.out" 2>&1
  grep -v '^RESULT' "checks-$1.out"
  local result
  result=$(grep '^RESULT' "checks-$1.out" | tail -1)
  if [ -z "$result" ]; then
    fail "the $1 checks did not finish: $(tail -5 "checks-$1.out")"
    return
  fi
  set -- $result
  passed=$((passed + $2)) failed=$((failed + $3))
}
latest() { tail -1 samples.jsonl 2> /dev/null | jq -r '.latest // -1' 2> /dev/null || echo -1; }
wait_version() {  # wait_version V SECONDS
  local deadline=$((SECONDS + $2))
  until [ "$(latest)" -ge "$1" ] 2> /dev/null; do
    kill -0 $run_pid 2> /dev/null || return 1
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

PROMETHEUS_OWNER_PID=$$ PROMETHEUS_RULE_FILES="$configs/alerts.yml" bash "$monitoring/prometheus.sh" \
  start "$work/prometheus" $prometheus_port 127.0.0.1:$orchestrator_port \
  near=127.0.0.1:$near_relay far=127.0.0.1:$far_relay 2> prometheus-start.err ||
  { echo "FAIL: Prometheus did not start: $(cat prometheus-start.err)"; exit 1; }

"$weft" run run.yaml > run.out 2>&1 &
run_pid=$!
for _ in $(seq 300); do
  curl -fsS -m 1 -o /dev/null "$ORCH_URL/livez" 2> /dev/null && break
  kill -0 $run_pid 2> /dev/null || break
  sleep 0.1
done
# The status page twice a second (the time taken as the middle of the request), for the rates.
(
  while :; do
    t0=$(date +%s.%N)
    page=$(curl -fsS -m 2 -H "Authorization: Bearer $admin" "$ORCH_URL/v1/status" 2> /dev/null) &&
      t1=$(date +%s.%N) && jq -c --arg t0 "$t0" --arg t1 "$t1" \
        '{t: ((($t0 | tonumber) + ($t1 | tonumber)) / 2), latest: .latest_version,
          delivered: (.trajectories.delivered_fresh + .trajectories.delivered_stale)}' <<< "$page" >> samples.jsonl
    sleep 0.5
  done
) &
sampler_pid=$!

# 1. Plumbing.
if wait_version 2 120; then ok; else fail "the run did not reach version 2: $(tail -5 run.out)"; fi
checks plumbing
if bash "$monitoring/check_dashboard.sh" orchestrator.metrics relay.metrics > check-dashboard.out 2>&1; then
  ok
else
  fail "the dashboard or the alerting rules name metrics the servers do not expose:"
  grep -v '^check_dashboard:' check-dashboard.out | head -40
fi

# 2. Mid-run rates.
if wait_version $freeze_at 180; then ok; else fail "the run did not reach version $freeze_at: $(tail -5 run.out)"; fi
checks live

# 3. Frozen: the trainer stopped, nothing moves.
trainer_pid=$(pgrep -f -- "train --config $work/run.yaml" | head -1)
if [ -n "$trainer_pid" ] && kill -STOP "$trainer_pid"; then
  ok
  checks settle
  sleep 3  # two more scrapes and rule evaluations
  checks frozen
  curl -fsS "$ORCH_URL/metrics" > orchestrator.metrics && curl -fsS "http://127.0.0.1:$near_relay/metrics" > relay.metrics
  if bash "$monitoring/check_dashboard.sh" --query "$PROM_URL" orchestrator.metrics relay.metrics > check-dashboard-live.out 2>&1; then
    ok
  else
    fail "the dashboard's or the alerting rules' expressions do not evaluate, or match no series, in Prometheus:"
    grep -v '^check_dashboard:' check-dashboard-live.out | head -40
  fi
  kill -CONT "$trainer_pid"
  trainer_pid=""
else
  fail "no trainer process to stop"
fi

# 4. The end of the run.
if wait $run_pid; then ok; else fail "weft run failed: $(tail -20 run.out)"; fi
run_pid=""
kill "$sampler_pid" 2> /dev/null
sampler_pid=""
if [ "$(jq -r '.completed and .steps == '$steps' and .digest_mismatches == 0' run/report.json 2> /dev/null)" = true ]; then
  ok
else
  fail "the run did not complete every step without digest mismatches: $(tail -5 run.out)"
fi
checks final

if [ "$failed" -gt 0 ]; then
  echo "--- weft run's output"; grep -v '^\[' run.out | tail -20
  echo "--- Prometheus's log"; tail -20 "$work/prometheus/prometheus.log" 2> /dev/null
fi
echo "prometheus e2e: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
