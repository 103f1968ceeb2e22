# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The alert rules the observability role writes (issue #37 item 2).

The template is rendered with the role's defaults, then:
- promtool (Debian's prometheus package, extracted by scripts/promtool.sh; `make unit` fetches it)
  accepts the file (`promtool check rules`) and passes its unit tests
  (tests/unit/fixtures/observability/alerts-test.yml: each alert fires on its fault after its
  `for`, and healthy series fire nothing);
- the same tests fail when a threshold is moved (the tests can fail);
- every series an alert selects is a real one (the released packages' names,
  metric_names.json, and the DCGM exporter's default counters, dcgm_metric_names.json), with
  only the labels the scrape configuration adds;
- the scrape configuration lists the rules file, and leaves it out with alerts off.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import shutil
import subprocess

import pytest
import yaml

from test_engine_units import render
from test_observability_dashboard import metric_names

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures", "observability")
PROMTOOL = os.environ.get("KVCACHE_PROMTOOL") or os.path.join(ROOT, "build", "tools", "promtool")
ALERTS = {"KvcacheEngineDown", "KvcacheRouterDown", "KvcacheRouterBackendUnhealthy", "KvcacheRouterBackendMissing",
          "KvcacheTimeToFirstTokenHigh", "KvcacheTierLoadFailures", "KvcacheTierStoreFailures",
          "KvcacheRemoteTierErrors", "KvcacheCrossInstanceHitsZero", "KvcacheGpuXidError", "KvcacheGpuRowRemapFailure",
          "KvcacheGpuUncorrectableMemoryErrors", "KvcacheTierVolumeAlmostFull", "KvcacheTierPrunerWatermarkMissed",
          "KvcacheTierPrunerErrors", "KvcacheTierPrunerNotRunning", "KvcacheGpuMetricsDown"}
PRUNER = os.path.join(ROOT, "roles", "kvcache_prune", "files", "kvcache_prune.py")


def pruner_metric_names():
    """The gauges the fs tier's pruner writes (roles/kvcache_prune, its METRICS table)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("kvcache_prune_metrics", PRUNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [name for name, _help, _source in module.METRICS]


def _rules(**overrides):
    return "\n".join(render("observability", "alerts-kvcache.yml.j2", **overrides)) + "\n"


def _promtool(tmp_path, *argv):
    assert os.access(PROMTOOL, os.X_OK), "no promtool at %s: `make unit` fetches it (scripts/promtool.sh)" % PROMTOOL
    return subprocess.run([PROMTOOL] + list(argv), cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
                          check=False)


def _unit_tests(tmp_path, rules):
    (tmp_path / "alerts-kvcache.yml").write_text(rules)
    shutil.copy(os.path.join(FIXTURES, "alerts-test.yml"), str(tmp_path / "alerts-test.yml"))
    return _promtool(tmp_path, "test", "rules", "alerts-test.yml")


def test_promtool_accepts_the_rules_and_every_alert_has_a_test(tmp_path):
    (tmp_path / "alerts-kvcache.yml").write_text(_rules())
    proc = _promtool(tmp_path, "check", "rules", "alerts-kvcache.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: %d rules found" % len(ALERTS) in proc.stdout, proc.stdout
    with open(os.path.join(FIXTURES, "alerts-test.yml")) as handle:
        tests = yaml.safe_load(handle)["tests"]
    tested = {t["alertname"] for case in tests for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == ALERTS


def test_each_alert_fires_on_its_fault_and_not_on_healthy_series(tmp_path):
    proc = _unit_tests(tmp_path, _rules())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.parametrize("overrides, alert", [
    ({"observability_alert_ttft_p95_seconds": 10.0}, "KvcacheTimeToFirstTokenHigh"),
    ({"observability_alert_down_for": "10m"}, "KvcacheEngineDown"),
    ({"observability_alert_tier_store_failures": 1000}, "KvcacheTierStoreFailures"),
    ({"observability_alert_tier_min_free_ratio": 0.01}, "KvcacheTierVolumeAlmostFull"),
    ({"observability_alert_prune_stale_seconds": 10800}, "KvcacheTierPrunerNotRunning"),
], ids=["ttft-threshold", "down-for", "store-failures", "tier-free-ratio", "prune-stale"])
def test_the_unit_tests_fail_when_a_setting_moves(tmp_path, overrides, alert):
    proc = _unit_tests(tmp_path, _rules(**overrides))
    assert proc.returncode != 0 and "alertname: %s" % alert in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_every_alert_selects_real_series_with_the_scrape_labels():
    known = {}
    for name in ("metric_names.json", "dcgm_metric_names.json"):
        with open(os.path.join(FIXTURES, name)) as handle:
            data = json.load(handle)
        assert set(data["provenance"]) >= set(data["metrics"])
        known.update({metric: source for source, names in data["metrics"].items() for metric in names})
    known.update({metric: "kvcache_prune" for metric in pruner_metric_names()})
    rules = [rule for group in yaml.safe_load(_rules())["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} == ALERTS
    sources = set()
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        unknown = sorted(n for n in names if n not in known)
        assert not unknown, "%s selects series no component exposes: %s" % (rule["alert"], unknown)
        sources |= {known[n] for n in names}
        assert set(rule["labels"]) == {"severity"} and rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"]
    assert sources >= {"prometheus", "vllm", "lmcache", "lmcache_mp", "vllm_router", "production_stack", "dcgm", "kvcache_prune"}


def test_the_scrape_configuration_lists_the_rules_file_only_with_alerts_on():
    on = yaml.safe_load("\n".join(render("observability", "scrape-kvcache.yml.j2", __observability_components=[])))
    assert on["rule_files"] == ["/etc/prometheus/kvcache/alerts-kvcache.yml"]
    off = yaml.safe_load("\n".join(render("observability", "scrape-kvcache.yml.j2", __observability_components=[],
                                          observability_alert_rules=False)))
    assert "rule_files" not in off
