# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Grafana dashboard shipped in roles/observability/files queries only real metrics.

Every PromQL expression (panel targets and template variables) parses with Prometheus's own
parser (promtool, with Grafana's variables replaced), may reference only series names in
tests/unit/fixtures/observability/metric_names.json, which was extracted from the released
packages (see its provenance and extract_metric_names.py), and only the labels the scrape
configuration adds or the sources declare.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import re
import subprocess

import pytest
import yaml

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DASHBOARD = os.path.join(ROOT, "roles", "observability", "files", "kvcache-dashboard.json")
NAMES = os.path.join(ROOT, "tests", "unit", "fixtures", "observability", "metric_names.json")
PROMTOOL = os.environ.get("KVCACHE_PROMTOOL") or os.path.join(ROOT, "build", "tools", "promtool")
# What Grafana puts in place of its variables before Prometheus sees a query.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$node": ".+",
                     "${node}": ".+"}

PROMQL_WORDS = {
    # aggregation operators, keywords and set operators
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset",
}
FUNCTION_CALL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\s*\(")
IDENT = re.compile(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)")


def metric_names(expr):
    """Series names an expression selects (a small PromQL scanner, enough for dashboards)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)              # string literals
    text = re.sub(r"\{[^}]*\}", "", text)                        # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)                       # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in IDENT.finditer(text):
        word = match.group(1)
        rest = text[match.end():]
        if re.match(r"\s*\(", rest) or word in PROMQL_WORDS or word.startswith("$"):
            continue
        names.add(word)
    return names


def expressions(dashboard):
    for panel in dashboard["panels"]:
        for sub in [panel] + panel.get("panels", []):
            for target in sub.get("targets", []):
                yield sub["title"], target["expr"]
    for var in dashboard["templating"]["list"]:
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            inner = re.match(r"label_values\((.*),\s*[a-zA-Z_]+\)$", query)
            yield "variable " + var["name"], inner.group(1) if inner else query


@pytest.fixture(scope="module")
def dashboard():
    with open(DASHBOARD) as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def known():
    with open(NAMES) as handle:
        data = json.load(handle)
    assert set(data["provenance"]) >= set(data["metrics"])
    return {name: source for source, names in data["metrics"].items() for name in names}


def test_scanner_finds_names_not_functions_labels_or_keywords():
    expr = ('histogram_quantile(0.95, sum by (le, kvcache_instance) (rate(vllm:time_to_first_token_seconds_bucket'
            '{kvcache_node=~"$node", x="a b"}[$__rate_interval]))) / on (job) group_left up or vector(0)')
    assert metric_names(expr) == {"vllm:time_to_first_token_seconds_bucket", "up"}


def as_prometheus_sees_it(expr):
    for variable in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(variable, GRAFANA_VARIABLES[variable])
    assert "$" not in expr, "a Grafana variable the test does not know: %r" % expr
    return expr


def test_every_expression_parses_with_prometheus(dashboard, tmp_path):
    """Issue #37 item 6: Prometheus's own parser (promtool check rules on one recording rule per
    expression), not only the name scanner above. A broken query fails here with promtool's
    message and the panel's title."""
    assert os.access(PROMTOOL, os.X_OK), "no promtool at %s: `make unit` fetches it (scripts/promtool.sh)" % PROMTOOL
    found = list(expressions(dashboard))
    rules = [{"record": "kvcache_dashboard:query_%d" % i, "expr": as_prometheus_sees_it(expr)}
             for i, (_title, expr) in enumerate(found)]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    titles = "; ".join("query_%d = %s" % (i, title) for i, (title, _e) in enumerate(found))
    assert proc.returncode == 0, "%s%s\n(%s)" % (proc.stdout, proc.stderr, titles)
    assert "SUCCESS: %d rules found" % len(rules) in proc.stdout


def test_a_broken_query_fails_the_parse(tmp_path):
    """The check can fail: promtool refuses an unbalanced expression."""
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [
        {"record": "kvcache_dashboard:broken", "expr": as_prometheus_sees_it("sum(rate(up[$__rate_interval])")}]}]}))
    proc = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode != 0 and "unclosed left parenthesis" in proc.stdout + proc.stderr


def test_every_expression_uses_only_metrics_from_the_released_sources(dashboard, known):
    unknown = []
    count = 0
    for title, expr in expressions(dashboard):
        names = metric_names(expr)
        assert names, "%s: no metric in %r" % (title, expr)
        count += 1
        unknown += ["%s: %s" % (title, n) for n in sorted(names) if n not in known]
    assert not unknown, "metrics not in metric_names.json: %s" % unknown
    assert count >= 20


def test_the_dashboard_covers_what_the_issue_asks_for(dashboard, known):
    used = set()
    for _title, expr in expressions(dashboard):
        used |= metric_names(expr)
    wanted = {
        "time to first token": {"vllm:time_to_first_token_seconds_bucket"},
        "GPU hit rate": {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"},
        "external hit rate": {"vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total"},
        "LMCache hit rate": {"lmcache:num_hit_tokens_total", "lmcache:num_requested_tokens_total"},
        "tier usage": {"vllm:kv_cache_usage_perc", "lmcache:remote_cache_usage"},
        "remote bytes": {"lmcache:num_remote_read_bytes_total", "lmcache:num_remote_write_bytes_total"},
        "healthy backends": {"vllm_router_worker_health", "vllm:healthy_pods_total"},
    }
    for what, names in wanted.items():
        assert names <= used, "%s: %s missing" % (what, names - used)
    # Every component the scrape configuration covers has at least one panel.
    sources = {known[n] for n in used}
    assert {"vllm", "lmcache", "lmcache_mp", "vllm_router", "production_stack"} <= sources


def test_label_filters_use_the_scrape_labels(dashboard):
    labels = set()
    for _title, expr in expressions(dashboard):
        for matchers in re.findall(r"\{([^}]*)\}", expr):
            labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!=|!~|=)", matchers))
    assert labels <= {"kvcache_component", "kvcache_node", "kvcache_instance"}


def test_dashboard_is_importable(dashboard):
    assert dashboard["uid"] == "kvcache-offload" and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "node"]
