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
- One node on another hash seed through the inventory: KvcacheCrossInstanceHitsZero fires (after a
  control where the same traffic loads from the tier and the alert is quiet), and the node is put
  back on the fleet's seed.

Wall time: about 9 min (three engine restarts on CPU, two nodes-stage runs on one node, the lab's
2-minute cross-instance window; alert durations of 5-20 s).
"""
import importlib.util
import json
import os
import time
import uuid

import pytest

from faultutil import nodes_stage, wait_healthy
from labutil import ROOT, container_name, docker_exec, group_hosts, http

# Runs inside lab-monitor: GET one Prometheus API path, print the JSON.
_PROM_GET = ("import sys, urllib.request, urllib.parse\n"
             "url = 'http://127.0.0.1:9090' + sys.argv[1]\n"
             "if len(sys.argv) > 2: url += '?' + urllib.parse.urlencode({'query': sys.argv[2]})\n"
             "print(urllib.request.urlopen(url, timeout=20).read().decode())\n")


@pytest.fixture(scope="module")
def monitor(inventory, hostvars):
    hosts = [h for h in group_hosts(inventory, "kvcache_monitoring") if h != "localhost"]
    assert hosts, "the lab inventory has no monitoring host of its own (lab-monitor)"
    return container_name(hostvars, hosts[0])


def prom(monitor, path, query=None):
    argv = ["python3", "-c", _PROM_GET, path] + ([query] if query else [])
    body = json.loads(docker_exec(monitor, *argv, timeout=60).stdout)
    assert body["status"] == "success", body
    return body["data"]


def wait_for(what, probe, timeout, every=3):
    """Poll probe() until it returns something true; return it, or fail naming what and the last value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    pytest.fail("%s within %d s; last: %r" % (what, timeout, last))


def alerts(monitor, name, state="firing", **labels):
    return [a for a in prom(monitor, "/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == name and a["state"] == state
            and all(a["labels"].get(k) == v for k, v in labels.items())]


def targets(monitor):
    return [t for t in prom(monitor, "/api/v1/targets")["activeTargets"] if t["labels"].get("kvcache_component")]


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


def _l2_hits(monitor):
    result = prom(monitor, "/api/v1/query", 'sum(lmcache_mp_lookup_hit_l2_tokens_total{kvcache_component="lmcache_mp"})')
    return float(result["result"][0]["value"][1]) if result["result"] else 0.0


def _ask(url, key, model, prompt):
    status, text = http(url + "/v1/chat/completions",
                        {"model": model, "max_tokens": 1, "temperature": 0,
                         "messages": [{"role": "user", "content": prompt}]}, key=key, timeout=180)
    assert status == 200, text[:300]


def _prompt(tag):
    # several of the lab's 256-token chunks
    return "cross-instance alert %s %s " % (tag, uuid.uuid4().hex) + " ".join(
        "sentence %d of a shared system prompt." % i for i in range(120))


def test_a_node_on_another_hash_seed_fires_the_cross_instance_alert(monitor, inventory, instances, api_key):
    """Issue #37 item 5: one node on another hash seed, through the inventory (the nodes stage on
    that node with its own kvcache_hash_seed), names its objects apart: the nodes keep looking up
    and storing, no node loads anything from the tier, and KvcacheCrossInstanceHitsZero fires. A
    control first: with one seed, the same traffic loads from the tier and the alert is quiet."""
    (host_a, _ca, _ia, url_a), (host_b, _cb, _ib, url_b) = instances[0], instances[-1]
    assert host_a != host_b, "the lab's first and last instances must be on two nodes"
    served = inventory["_meta"]["hostvars"][host_a]["kvcache_served_model_name"]

    def round_trip(tag):
        prompt = _prompt(tag)
        _ask(url_a, api_key, served, prompt)
        time.sleep(2)  # the first node's server stores the chunks in the tier
        _ask(url_b, api_key, served, prompt)

    # Control: one seed, a prompt of the first node loaded by the second one from the tier.
    before = _l2_hits(monitor)
    round_trip("control")
    wait_for("the second node's L2 hits in the lab Prometheus", lambda: _l2_hits(monitor) > before, timeout=60)
    wait_for("KvcacheCrossInstanceHitsZero quiet while the tier serves hits",
             lambda: not alerts(monitor, "KvcacheCrossInstanceHitsZero", state="firing"), timeout=60)

    seed = str(100000000 + int(time.time()) % 800000000)
    try:
        out = nodes_stage("kvcache_hash_seed=%s" % seed, limit=host_b)
        assert out.returncode == 0, out.stdout[-3000:]
        assert wait_healthy([url_b], timeout=420), "%s did not come back on its new seed" % host_b

        def fired():
            round_trip("reseeded")
            return alerts(monitor, "KvcacheCrossInstanceHitsZero")

        # The window (2 minutes in the lab) must first forget the control's hits.
        found = wait_for("KvcacheCrossInstanceHitsZero firing with %s on another seed" % host_b, fired,
                         timeout=420, every=15)
        assert found[0]["labels"]["severity"] == "warning", found
    finally:
        back = nodes_stage(limit=host_b)
    assert back.returncode == 0, back.stdout[-3000:]
    assert wait_healthy([url_b], timeout=420)
    # The fleet's one seed again: the tier serves the second node the first node's prompts.
    before = _l2_hits(monitor)
    round_trip("restored")
    wait_for("L2 hits again on the fleet's one seed", lambda: _l2_hits(monitor) > before, timeout=60)
