#!/usr/bin/env bash
# Checks the monitoring configuration in configs/monitoring against what weft's servers expose:
#   1. every PromQL expression of the Grafana dashboard (grafana-dashboard.json, its panels'
#      targets), with the template variables given values ($region: .*, $__rate_interval and
#      $__interval: 1m, $__range: 1h), parses: they are written as recording rules to a temporary
#      rules file for `promtool check rules`; alerts.yml passes `promtool check rules` and
#      prometheus.yml `promtool check config`;
#   2. every metric that those expressions, the template variables' queries
#      (label_values(METRIC, LABEL)) and the alerting rules name is a metric family of the
#      METRICS_FILEs (their `# TYPE` lines: the Prometheus text of the orchestrator's and a
#      relay's /metrics), a histogram's through its _bucket, _sum and _count series (Prometheus's
#      own series, such as up, need no family);
#   3. with --query URL (a Prometheus that scrapes those servers): every expression evaluates there
#      without an error, and every series selector in the dashboard and the rules matches series.
# Each failure names the panel (or alert) and the metric. The configuration checked is that of
# the source tree; DASHBOARD=FILE, ALERTS=FILE and PROMETHEUS_CONFIG=FILE check others.
# Usage: check_dashboard.sh [--query URL] METRICS_FILE...
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
monitoring=$here/../../configs/monitoring
query=""
if [[ ${1:-} == --query ]]; then
  query=${2:?usage: check_dashboard.sh [--query URL] METRICS_FILE...}
  shift 2
fi
(($# > 0)) || { echo "usage: check_dashboard.sh [--query URL] METRICS_FILE..." >&2; exit 2; }
for f in "$@"; do [[ -r $f ]] || { echo "check_dashboard: cannot read $f" >&2; exit 2; }; done
command -v promtool > /dev/null || bash "$here/prometheus.sh" install
command -v promtool > /dev/null || { echo "check_dashboard: promtool is not installed" >&2; exit 1; }

/usr/bin/python3 - "${DASHBOARD:-$monitoring/grafana-dashboard.json}" "${ALERTS:-$monitoring/alerts.yml}" \
  "${PROMETHEUS_CONFIG:-$monitoring/prometheus.yml}" "$query" "$@" <<'PY'
import json, os, re, subprocess, sys, tempfile, urllib.parse, urllib.request

import yaml

dashboard_path, alerts_path, config_path, query_url, *metrics_files = sys.argv[1:]
passed = failed = 0


def ok():
    global passed
    passed += 1


def fail(message):
    global failed
    failed += 1
    print(f"FAIL: {message}")


# Values for Grafana's template variables, as Prometheus sees the expressions.
VARIABLES = {"region": ".*", "__rate_interval": "1m", "__interval": "1m", "__range": "1h",
             "__range_s": "3600", "__interval_ms": "60000"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def substitute(expr, where):
    unknown = []

    def value(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in VARIABLES:
            unknown.append(name)
            return m.group(0)
        return VARIABLES[name]

    text = VARIABLE.sub(value, expr)
    for name in unknown:
        fail(f"{where}: unknown template variable ${name} in {expr!r}")
    return text


# --- PromQL: the metric names and series selectors of an expression (a tokenizer, no parser).
TOKEN = re.compile(r"""
    (?P<space>\s+) | (?P<comment>\#[^\n]*) |
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`) |
    (?P<labels>\{(?:[^{}"']|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')*\}) |
    (?P<range>\[[^\]]*\]) |
    (?P<number>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)(?:ms|s|m|h|d|w|y)*) |
    (?P<name>[A-Za-z_:][A-Za-z0-9_:]*) |
    (?P<other>.)""", re.X | re.S)
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "atan2", "inf", "nan", "start", "end"}
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile"}


def selectors(expr):
    """(metric name or None, full selector text) for each series selector in expr."""
    tokens = [(m.lastgroup, m.group()) for m in TOKEN.finditer(expr)
              if m.lastgroup not in ("space", "comment")]
    out = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else (None, "")
        if kind == "name" and text.lower() in LABEL_LISTS:
            i += 1
            if tokens[i:i + 1] and tokens[i][1] == "(":  # skip the label list
                while i < len(tokens) and tokens[i][1] != ")":
                    i += 1
            i += 1
            continue
        if kind == "name" and i > 0 and tokens[i - 1][1] == "$":  # an unknown variable
            i += 1
            continue
        if kind == "name" and text in AGGREGATIONS and following[1].lower() in ("by", "without"):
            i += 1
            continue
        if kind == "name" and text.lower() not in KEYWORDS and following[1] != "(":
            if following[0] == "labels":
                out.append((text, text + following[1]))
                i += 2
                continue
            out.append((text, text))
        elif kind == "labels":
            named = re.search(r"""__name__\s*=\s*["']([A-Za-z_:][A-Za-z0-9_:]*)["']""", text)
            out.append((named.group(1) if named else None, text))
        i += 1
    return out


# --- The metric families the servers expose.
families = {}
for path in metrics_files:
    with open(path) as f:
        for line in f:
            m = re.match(r"#\s*TYPE\s+([A-Za-z_:][A-Za-z0-9_:]*)\s+(\w+)", line)
            if m:
                families[m.group(1)] = m.group(2)
if not families:
    fail(f"no '# TYPE' line in {' '.join(metrics_files)}: not Prometheus /metrics text")
# Series Prometheus makes itself, for every target and for alerting rules.
BUILTIN = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added",
           "scrape_samples_post_metric_relabeling", "ALERTS", "ALERTS_FOR_STATE"}


def check_name(name, where):
    if name is None:
        return
    if name in BUILTIN:
        return ok()
    kind = families.get(name)
    if kind == "histogram":
        return fail(f"{where}: {name} is a histogram; select {name}_bucket, _sum or _count")
    if kind is not None:
        return ok()
    for suffix, kinds in (("_bucket", ("histogram",)), ("_sum", ("histogram", "summary")),
                          ("_count", ("histogram", "summary"))):
        if name.endswith(suffix) and families.get(name[: -len(suffix)]) in kinds:
            return ok()
    fail(f"{where}: metric {name} is not exposed (no family of that name, nor a histogram with "
         f"such a series, among the '# TYPE' lines of the metrics files)")


def promtool(*args):
    r = subprocess.run(["promtool", *args], capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


# --- The dashboard's expressions.
with open(dashboard_path) as f:
    dashboard = json.load(f)


def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


expressions = []  # (where, expression as Prometheus sees it)
for p in all_panels(dashboard.get("panels", [])):
    for t in p.get("targets", []):
        if "expr" not in t:
            continue
        where = f"panel '{p.get('title', p.get('id'))}' ({t.get('refId', '?')})"
        expr = t["expr"].strip()
        if not expr:
            fail(f"{where}: empty expression")
            continue
        expressions.append((where, substitute(expr, where)))
if not expressions:
    fail(f"no panel of {dashboard_path} has an expression")
for v in dashboard.get("templating", {}).get("list", []):
    if v.get("type") != "query":
        continue
    q = v.get("query")
    q = q.get("query", "") if isinstance(q, dict) else (q or "")
    where = f"variable ${v.get('name')}"
    m = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*", q)
    if not m:
        fail(f"{where}: expected label_values(METRIC, LABEL), not {q!r}")
        continue
    for name, _ in selectors(substitute(m.group(1), where)):
        check_name(name, where)

# 1. They parse: all as recording rules of one file; where promtool refuses it, each on its own,
#    to name the panels.
def rules_file(items):
    rules = [{"record": f"dashboard:expr_{i}", "expr": expr} for i, (_, expr) in enumerate(items)]
    f = tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False)
    yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, sort_keys=False)
    f.close()
    return f.name


path = rules_file(expressions)
try:
    code, output = promtool("check", "rules", path)
finally:
    os.unlink(path)
if code == 0:
    ok()
else:
    named = False
    for where, expr in expressions:
        one = rules_file([(where, expr)])
        try:
            c, out = promtool("check", "rules", one)
        finally:
            os.unlink(one)
        if c != 0:
            named = True
            fail(f"{where}: promtool check rules refuses {expr!r}: "
                 + " ".join(l.strip() for l in out.splitlines() if l.strip() and "Checking" not in l))
    if not named:
        fail(f"promtool check rules refuses the dashboard's expressions: {output}")

# 2. The metrics they name exist.
for where, expr in expressions:
    for name, _ in selectors(expr):
        check_name(name, where)

# The alerting rules and the scrape configuration.
code, output = promtool("check", "rules", alerts_path)
if code == 0:
    ok()
else:
    fail(f"promtool check rules {alerts_path}: {output}")
code, output = promtool("check", "config", config_path)
if code == 0:
    ok()
else:
    fail(f"promtool check config {config_path}: {output}")
alert_expressions = []
with open(alerts_path) as f:
    for group in (yaml.safe_load(f) or {}).get("groups", []):
        for rule in group.get("rules", []):
            where = f"rule '{rule.get('alert') or rule.get('record')}' of {os.path.basename(alerts_path)}"
            alert_expressions.append((where, str(rule.get("expr", ""))))
            for name, _ in selectors(str(rule.get("expr", ""))):
                check_name(name, where)

# 3. Against a live Prometheus.
def instant(q):
    url = query_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return json.load(e)
        except Exception:
            return {"status": "error", "error": f"HTTP {e.code}"}
    except Exception as e:
        return {"status": "error", "error": str(e)}


if query_url:
    for where, expr in expressions + alert_expressions:
        answer = instant(expr)
        if answer.get("status") != "success":
            fail(f"{where}: Prometheus cannot evaluate {expr!r}: {answer.get('error')}")
        else:
            ok()
        for name, selector in selectors(expr):
            answer = instant(f"count({selector})")
            if answer.get("status") != "success":
                fail(f"{where}: Prometheus cannot evaluate count({selector}): {answer.get('error')}")
            elif not answer["data"]["result"]:
                fail(f"{where}: no series match {selector} (metric {name}) in Prometheus")
            else:
                ok()

print(f"check_dashboard: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
