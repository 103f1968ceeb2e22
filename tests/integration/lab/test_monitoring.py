"""The lab's own Prometheus scrapes the platform, and the shipped alert rules fire and resolve in it.

Issue #37 items 1, 5 and 6. lab-monitor runs Debian's Prometheus, installed and configured by the
observability role (observability_prometheus) with the collection's scrape configuration and alert
rules (inventories/lab/host_vars/lab-monitor.yml shortens only their durations and the tier's
threshold). Its API stays on the container's loopback: the tests ask it with `docker exec`.

- Every engine, the router, every node's LMCache server and the pruner are scrape targets and up;
  the LMCache servers and the pruner through the node's metrics proxy (/proxy?module=...), while
  the LMCache server's own HTTP port (its admin API) stays on the node's loopback and the proxy
  serves nothing else.
- The Grafana dashboard's queries name metrics the lab's Prometheus has (those the lab cannot have
  are listed with the reason).
- An engine stopped on one node: KvcacheEngineDown fires for that instance in Prometheus' own
  /api/v1/alerts, and resolves after the engine is started again.
- The shared tier filled past the lab's threshold: the pruner's metrics (its metrics file, served by
  the proxy) make KvcacheTierVolumeAlmostFull fire, and resolve when the space is back.
- One node on another hash seed (KvcacheCrossInstanceHitsZero) is the first switch of
  test_switches.py, which puts the node back on the fleet's seed with its next converge.

Wall time: about 2.5 min (one engine restart on CPU; alert durations of 5-20 s).
"""
import importlib.util
import json
import os
import time

from faultutil import wait_healthy
from labutil import ROOT, container_name, docker_exec, group_hosts, http
from promutil import alerts, prom, targets, wait_for


def test_prometheus_scrapes_every_engine_the_router_the_lmcache_servers_and_the_pruner(
        monitor, inventory, hostvars, instances):
    nodes = group_hosts(inventory, "kvcache_nodes")
    routers = group_hosts(inventory, "kvcache_router")
    want = ({("vllm", inst["name"]) for (_h, _c, inst, _u) in instances}
            | {("lmcache_mp", "%s-lmcache" % n) for n in nodes}
            | {("router", r) for r in routers}
            | {("prune", "%s-prune" % nodes[0])})  # the pruner runs on the first node (kvcache_prune_scope)

    def all_up():
        found = targets(monitor)
        have = {(t["labels"]["kvcache_component"], t["labels"]["kvcache_instance"]): t for t in found}
        return have if set(have) == want and all(t["health"] == "up" for t in have.values()) else None

    have = wait_for("every lab target listed and up in the lab Prometheus", all_up, timeout=120)
    # No GPU in the lab: no DCGM exporter target (kvcache_dcgm_exporter: false there).
    assert not [t for t in targets(monitor) if t["labels"]["kvcache_component"] == "dcgm"]
    for node in nodes:
        proxied = have[("lmcache_mp", "%s-lmcache" % node)]["scrapeUrl"]
        assert proxied == "http://%s:9999/proxy?module=lmcache" % hostvars[node]["ansible_host"], proxied
    assert have[("prune", "%s-prune" % nodes[0])]["scrapeUrl"].endswith("/proxy?module=kvcache_prune")
    # The LMCache servers' own series arrive, labelled like every other target.
    series = prom(monitor, "/api/v1/query", 'count by (kvcache_node) ({job="kvcache-lmcache-mp"})')["result"]
    assert sorted(s["metric"]["kvcache_node"] for s in series) == sorted(nodes), series


def test_the_proxy_serves_only_the_metrics_and_the_lmcache_admin_api_stays_on_loopback(inventory, hostvars):
    node = group_hosts(inventory, "kvcache_nodes")[0]
    address = hostvars[node]["ansible_host"]
    # The controller is a fleet caller of the proxy (kvcache_firewall lets it in, as the monitoring hosts).
    status, text = http("http://%s:9999/proxy?module=lmcache" % address, timeout=20)
    assert status == 200 and "lmcache_mp_" in text, (status, text[:300])
    for path in ("/proxy?module=nosuch", "/proxy?module=lmcache/../openapi.json", "/proxy"):
        status, _text = http("http://%s:9999%s" % (address, path), timeout=20)
        assert status in (400, 404), (path, status)
    # LMCache's own paths (its health, its admin API's schema) get the proxy's index of its modules,
    # never the server's answer (which the node itself still gets on its loopback).
    container = container_name(hostvars, node)
    own = docker_exec(container, "python3", "-c", "import urllib.request; print(urllib.request.urlopen("
                      "'http://127.0.0.1:8080/openapi.json', timeout=10).read().decode())").stdout
    assert "LMCache HTTP API" in own, own[:200]
    for path in ("/healthcheck", "/openapi.json", "/cache/objects"):
        status, text = http("http://%s:9999%s" % (address, path), timeout=20)
        assert "LMCache HTTP API" not in text and '"status"' not in text and "Exporters" in text, (path, status, text[:200])
    # The server's HTTP port (metrics and its admin API) listens on the node's loopback only.
    listening = docker_exec(container, "ss", "-Hltn", "sport", "= :8080").stdout.split()
    assert listening and all(word.startswith("127.0.0.1:") for word in listening if word.endswith(":8080")), listening


# Dashboard metrics the lab cannot have, and why (the lab runs LMCache's multiprocess server and
# vllm_router on CPU; these come from the other modes and the production-stack router).
# Counters a client creates with the first failure they count (the released sources register them
# with labels): a healthy lab has none, and the test does not break the lab to make them.
_FAILURES_ONLY = {
    "vllm_router_request_errors_total": "vllm-router counts an error per route and status as it happens",
    "lmcache_mp_l2_prefetch_failure_chunks_total": "LMCache counts a failed prefetch per reason as it happens",
}
_NOT_IN_THE_LAB = {
    "lmcache:": "in-process LMCache's metrics (kvcache_lmcache_mode inprocess, GDS); the lab runs the multiprocess server",
    "vllm:healthy_pods_total": "the production-stack router's; the lab runs vllm_router",
    "vllm:num_incoming_requests_total": "the production-stack router's",
    "vllm:request_errors_total": "the production-stack router's",
}


def _dashboard_scanner():
    """The dashboard's PromQL scanner and its query walk: the ones the unit tests check the names with."""
    path = os.path.join(ROOT, "tests", "unit", "roles", "test_observability_dashboard.py")
    spec = importlib.util.spec_from_file_location("kvcache_dashboard_scanner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dashboard_names_metrics_the_lab_prometheus_has(monitor, router_url, client_key, hostvars, node_hosts):
    # Traffic first, so that the engines' and the router's request series exist.
    model = hostvars[node_hosts[0]]["kvcache_served_model_name"]
    for number in range(3):
        status, text = http(router_url.rstrip("/") + "/v1/chat/completions",
                            {"model": model, "max_tokens": 4,
                             "messages": [{"role": "user", "content": "monitoring test %d: what is a cache?" % number}]},
                            key=client_key, timeout=120)
        assert status == 200, text[:300]
    scanner = _dashboard_scanner()
    with open(scanner.DASHBOARD, encoding="utf-8") as handle:
        dashboard = json.load(handle)
    wanted = {}
    for title, expr in scanner.expressions(dashboard):
        for name in scanner.metric_names(expr):
            if not any(name.startswith(prefix) for prefix in _NOT_IN_THE_LAB) and name not in _FAILURES_ONLY:
                wanted.setdefault(name, title)
    assert len(wanted) >= 10, wanted

    def missing():
        present = set(prom(monitor, "/api/v1/label/__name__/values"))
        return {name: title for name, title in wanted.items() if name not in present}

    # Histograms and request counters appear with the first request: a scrape interval or two after
    # the traffic above.
    deadline = time.monotonic() + 60
    gone = missing()
    while gone and time.monotonic() < deadline:
        time.sleep(5)
        gone = missing()
    assert not gone, "dashboard panels name metrics the lab's Prometheus does not have: %s" % gone


def test_an_engine_down_fires_its_alert_which_resolves_after_the_restart(monitor, instances):
    host, container, inst, url = instances[-1]
    unit = "kvcache-vllm@%s.service" % inst["name"]
    # an earlier test's restarts resolve within a scrape and an evaluation (5 s each in the lab)
    wait_for("no engine down before the test", lambda: not alerts(monitor, "KvcacheEngineDown"), timeout=90)
    docker_exec(container, "systemctl", "stop", unit, timeout=120)
    try:
        fired = wait_for("KvcacheEngineDown firing for %s" % inst["name"],
                         lambda: alerts(monitor, "KvcacheEngineDown", kvcache_instance=inst["name"]), timeout=90)
        assert fired[0]["labels"]["kvcache_node"] == host and fired[0]["labels"]["severity"] == "critical", fired
    finally:
        docker_exec(container, "systemctl", "start", unit, timeout=300)
    assert wait_healthy([url], timeout=300), "%s did not come back" % unit
    wait_for("KvcacheEngineDown resolved after the restart",
             lambda: not alerts(monitor, "KvcacheEngineDown", state="firing")
             and not alerts(monitor, "KvcacheEngineDown", state="pending"), timeout=90)


def test_a_filling_tier_fires_its_alert_which_resolves_when_space_is_back(monitor, inventory, hostvars):
    node = group_hosts(inventory, "kvcache_nodes")[0]  # the node that prunes
    container = container_name(hostvars, node)
    config = json.loads(docker_exec(container, "cat", "/etc/kvcache/prune.json").stdout)
    path = config["path"]

    def prune():
        docker_exec(container, "systemctl", "start", "kvcache-prune.service", timeout=300)

    # A baseline below the threshold: an earlier test (test_faults) leaves the tier as full as the
    # pruner's watermarks allow. LMCache's chunk files are a cache (a removed one is a miss on every
    # node, as after the pruner); the pruner's run then reports the emptied volume.
    docker_exec(container, "find", path, "-maxdepth", "2", "-type", "f", "-name", "*.data", "-delete")
    prune()
    wait_for("KvcacheTierVolumeAlmostFull quiet on the emptied tier",
             lambda: not alerts(monitor, "KvcacheTierVolumeAlmostFull", state="firing")
             and not alerts(monitor, "KvcacheTierVolumeAlmostFull", state="pending"), timeout=90)
    size, avail = (int(x) for x in docker_exec(container, "stat", "-f", "-c", "%b %a", path).stdout.split())
    block = int(docker_exec(container, "stat", "-f", "-c", "%S", path).stdout)
    ratio = float(hostvars[[h for h in group_hosts(inventory, "kvcache_monitoring") if h != "localhost"][0]]
                  ["observability_alert_tier_min_free_ratio"])
    # Leave a tenth of the volume less free than the threshold; the filler's name is one the pruner
    # never removes (*.tmp: kvcache_prune_exclude), so the pruner reports the fill and keeps it.
    fill = int(avail * block - size * block * (ratio - 0.1))
    assert fill > 0, (size, avail, ratio)
    filler = path + "/monitoring-test-filler.tmp"
    docker_exec(container, "fallocate", "-l", str(fill), filler)
    try:
        prune()
        fired = wait_for("KvcacheTierVolumeAlmostFull firing",
                         lambda: alerts(monitor, "KvcacheTierVolumeAlmostFull"), timeout=90)
        assert fired[0]["labels"]["kvcache_node"] == node and fired[0]["labels"]["path"] == path, fired
    finally:
        docker_exec(container, "rm", "-f", filler)
    prune()
    wait_for("KvcacheTierVolumeAlmostFull resolved",
             lambda: not alerts(monitor, "KvcacheTierVolumeAlmostFull", state="firing")
             and not alerts(monitor, "KvcacheTierVolumeAlmostFull", state="pending"), timeout=90)
