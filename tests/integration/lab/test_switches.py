"""Every switch of the running lab's configuration, in one sequence: the nodes stage converges four
times here, where three test files used to converge it six times (each went back on its own).

The lab serves in multiprocess mode on the fs tier, every node on the fleet's hash seed. The tests
run in this order, each starting from where the one before left the lab:

1. **Another hash seed on one node** (issue #37 item 5): the nodes stage on the last node only with
   its own kvcache_hash_seed names its objects apart. A control first (one seed: the second node
   loads the first node's prompt from the tier and KvcacheCrossInstanceHitsZero is quiet), then,
   with the node reseeded, the nodes keep looking up and storing, nothing loads from the tier, and
   the alert fires in the lab's Prometheus. The node stays reseeded.
2. **The S3 tier** (kvcache_tier=s3 on every node, which also puts the reseeded node back on the
   fleet's seed): each node's LMCache server restarted with its engines in the rolling restart, one
   node at a time; validate.yml against the bucket (every stage passes: the tier listing is the
   bucket's, instance B loads from the bucket what A computed, so the seeds agree again); objects
   deleted behind the first node's server (s3_deleted.py); an S3 outage that opens every server's
   breaker, which closes by itself once the store is back (s3_outage.py, issue #40).
3. **In-process mode** (kvcache_lmcache_mode=inprocess on the fs tier, vLLM's ExampleConnector:
   LMCache's in-process connector does not run on vLLM's CPU build), under a request loop through
   the router: the servers stop in the rolling restart, node by node, after the node's engines;
   no two nodes are down at once and no request fails.
4. **Back** to multiprocess mode on the fs tier (both nodes in one batch, no traffic to keep): the
   router lists every instance as soon as the playbook ends, the servers run, no in-process config
   is left, and the tier serves the second node the first node's prompt again (the fleet's one seed).

A module fixture converges the lab back (step 4's run) if a test stopped before step 4 did, so the
files after this one find the lab as `make lab` left it.

Wall time: about 12 min, 735 s measured (four nodes-stage runs, three of them restarting every engine; a validation
run; the S3 outage's breaker waits; the lab's 1-minute cross-instance window).
"""
import json
import time
import uuid

import pytest

from faultutil import ENV_DIR, HEALTH_TIMEOUT, lab_s3_keys, nodes_stage, run_validate, stage, wait_healthy
from labutil import docker_exec, group_hosts, http, router_workers
from loadloop import RequestLoop
from promutil import alerts, prom, wait_for
from s3_deleted import chat, deleted_objects_scenario, s3_client
from s3_outage import outage_scenario

LOOP_PAUSE = 2.5  # test_rolling_upgrade.py: longer than the 1 s a vLLM CPU worker spins after a step


@pytest.fixture(scope="module")
def lab_back(inventory, instances):
    """Step 4's state: {"run": its nodes-stage process}. If a test stopped before step 4 converged
    the lab back, the teardown does it, so the next test file finds the lab as `make lab` left it."""
    state = {}
    yield state
    if "run" not in state:
        nodes_stage(serial=len(group_hosts(inventory, "kvcache_nodes")))
        wait_healthy([url for (_h, _c, _i, url) in instances], timeout=HEALTH_TIMEOUT)


# -- step 1: another hash seed on one node -----------------------------------------------------

def _l2_hits(monitor):
    result = prom(monitor, "/api/v1/query", 'sum(lmcache_mp_lookup_hit_l2_tokens_total{kvcache_component="lmcache_mp"})')
    return float(result["result"][0]["value"][1]) if result["result"] else 0.0


def _prompt(tag):
    # several of the lab's 256-token chunks
    return "cross-instance alert %s %s " % (tag, uuid.uuid4().hex) + " ".join(
        "sentence %d of a shared system prompt." % i for i in range(120))


def _round_trip(instances, api_key, served, tag):
    """A fresh prompt to the first instance, then (its server has stored the chunks) to the last."""
    url_a, url_b = instances[0][3], instances[-1][3]
    prompt = _prompt(tag)
    chat(url_a, api_key, served, prompt)
    time.sleep(2)  # the first node's server stores the chunks in the tier
    chat(url_b, api_key, served, prompt)


def test_a_node_on_another_hash_seed_fires_the_cross_instance_alert(
        monitor, hostvars, instances, api_key, lab_back):
    (host_a, _ca, _ia, _ua), (host_b, _cb, _ib, url_b) = instances[0], instances[-1]
    assert host_a != host_b, "the lab's first and last instances must be on two nodes"
    served = hostvars[host_a]["kvcache_served_model_name"]

    # Control: one seed, a prompt of the first node loaded by the second one from the tier.
    before = _l2_hits(monitor)
    _round_trip(instances, api_key, served, "control")
    wait_for("the second node's L2 hits in the lab Prometheus", lambda: _l2_hits(monitor) > before, timeout=60)
    wait_for("KvcacheCrossInstanceHitsZero quiet while the tier serves hits",
             lambda: not alerts(monitor, "KvcacheCrossInstanceHitsZero", state="firing"), timeout=60)

    seed = str(100000000 + int(time.time()) % 800000000)
    out = nodes_stage("kvcache_hash_seed=%s" % seed, limit=host_b)
    assert out.returncode == 0, out.stdout[-3000:]
    assert wait_healthy([url_b], timeout=420), "%s did not come back on its new seed" % host_b

    def fired():
        _round_trip(instances, api_key, served, "reseeded")
        return alerts(monitor, "KvcacheCrossInstanceHitsZero")

    # The window (1 minute in the lab) must first forget the control's hits.
    found = wait_for("KvcacheCrossInstanceHitsZero firing with %s on another seed" % host_b, fired,
                     timeout=420, every=15)
    assert found[0]["labels"]["severity"] == "warning", found


# -- step 2: the S3 tier ---------------------------------------------------------------------

def _restarts(out):
    """(task headers, hosts reported changed) of the rolling play's server restart task."""
    headers, hosts, keep = 0, [], False
    for line in out.splitlines():
        if line.startswith("TASK ["):
            keep = "Restart the marked LMCache server" in line
            headers += keep
        elif keep and line.startswith("changed: ["):
            hosts.append(line[len("changed: ["):].split("]")[0])
    return headers, sorted(hosts)


def test_the_lab_serves_and_validates_on_the_s3_tier(tmp_path, inventory, hostvars, instances, api_key, lab_back):
    urls = [url for (_host, _container, _inst, url) in instances]
    s3_host = group_hosts(inventory, "kvcache_s3_store")[0]
    bucket = hostvars[s3_host].get("kvcache_s3_bucket") or hostvars[instances[0][0]]["kvcache_s3_bucket"]
    served = hostvars[instances[0][0]]["kvcache_served_model_name"]
    # the fleet's seed for every node again (step 1 left the last node on its own)
    to_s3 = nodes_stage("kvcache_tier=s3")
    assert to_s3.returncode == 0, to_s3.stdout[-4000:] + to_s3.stderr[-2000:]
    assert wait_healthy(urls), "an instance did not answer after the switch to the s3 tier"
    rc, report, out = run_validate(str(tmp_path), extra=[
        "-e", "kvcache_tier=s3",
        # the controller is not in the lab's /etc/hosts: it lists the bucket by address
        "-e", "validation_s3_endpoint=http://%s:8333" % hostvars[s3_host]["ansible_host"]])
    deleted = deleted_objects_scenario(
        instances[0], s3_client(hostvars, s3_host, lab_s3_keys()), bucket, api_key, served, wait_healthy,
        uuid.uuid4().hex[:8])
    outage = outage_scenario(instances, hostvars, s3_host, lab_s3_keys(), s3_client(hostvars, s3_host, lab_s3_keys()),
                             bucket, api_key, served)

    # The servers' L2 changed: each node's server (and its engines, PartOf) restarted by the
    # rolling restart, one node per batch (serial 1), never in the first play on every node.
    nodes = sorted(group_hosts(inventory, "kvcache_nodes"))
    assert _restarts(to_s3.stdout) == (len(nodes), nodes), to_s3.stdout[-4000:]
    assert "RUNNING HANDLER [kvcache.offload.lmcache" not in to_s3.stdout
    assert report is not None, out
    assert rc == 0 and report["result"] == "pass", [(s["id"], s["status"], s["reason"]) for s in report["stages"]]
    # stage 7 (gds_path) is skipped with its reason in the lab, every other stage passes
    statuses = dict((s["id"], s["status"]) for s in report["stages"])
    assert statuses == dict((sid, "skipped" if sid == "gds_path" else "pass") for sid in statuses), statuses
    assert len(statuses) == 8, statuses
    write = stage(report, "tier_write")
    assert write["details"]["listed_on"] == "controller" and bucket in str(write["details"]["tier"]), write["details"]
    assert write["numbers"]["objects_added"] > 0
    cross = stage(report, "cross_instance")["numbers"]
    assert cross["external_kv_tokens"] > 0, cross
    # LMCache's own server on B's node loaded the chunks from its L2, the bucket: the same seed again
    assert cross["lmcache_l2_hit_tokens"] > 0, cross
    rows = stage(report, "lmcache_probe")["details"]["results"]
    # the collection's half-open adapter (lmcache_s3_retry_after_seconds), through LMCache's plugin adapter
    assert {r["connector"] for r in rows} == {"RecoveringS3L2Adapter"}, rows
    assert all(n["lmcache"]["remote_storage_plugins"] == ["s3"] for n in report["fleet"]["nodes"]), report["fleet"]["nodes"]

    # Objects deleted behind the first node's server (the expiration rule's doing), its engine
    # restarted and its L1 cleared: the server still had their sizes cached (it stored them), so
    # it tried to load every one of them from L2 (prefetch failures, one per deleted chunk), loaded
    # none and reported no hit to vLLM, which loaded nothing and recomputed the prompt (the answer
    # is the cold one); the server then stored the chunks again. Measured 2026-12-02: 9 chunks
    # stored, 9 prefetch failures, 0 L2 hit tokens, 0 external tokens, 9 objects back. A deleted
    # object is a miss that heals, never KV the server does not have.
    assert deleted["stored"], deleted
    assert deleted["left_after_delete"] == [], deleted
    assert deleted["engine_healthy"] and deleted["server_kept"], deleted
    assert deleted["l1_cleared"].get("status") == "ok", deleted
    assert deleted["again_answer"] == deleted["cold_answer"], deleted
    assert deleted["server"]["lmcache_mp_lookup_requested_tokens"] > 0, deleted
    assert deleted["server"]["lmcache_mp_l2_prefetch_failure_chunks"] == len(deleted["stored"]), deleted
    assert deleted["server"]["lmcache_mp_l2_prefetch_load_completed_chunks"] == 0, deleted
    assert deleted["server"]["lmcache_mp_lookup_hit_l2_tokens"] == 0, deleted
    assert deleted["external_kv_tokens"] == 0, deleted
    assert deleted["restored"] == deleted["stored"], deleted

    # An S3 outage long enough to open every server's circuit breaker (3 failed stores), then the
    # store back: every server's adapter closes again by itself (the half-open adapter tries S3
    # lmcache_s3_retry_after_seconds after it tripped), new KV reaches the bucket, and no server
    # was restarted. With LMCache 0.5.6's own adapter no breaker ever closes (issue #40).
    containers = sorted({c for (_h, c, _i, _u) in instances})
    assert sorted(outage["tripped_after"]) == containers, outage
    assert outage["store_back"] == "ok", outage
    assert sorted(outage["recovered_after"]) == containers, outage
    assert all(v <= 30 + 60 for v in outage["recovered_after"].values()), outage
    assert all(status == 200 for status in outage["requests_down"] + outage["requests_back"]), outage
    assert outage["objects_added_after"] >= 2 * len(containers), outage
    assert outage["pids_after"] == outage["pids_before"], outage


# -- step 3: in-process mode, under traffic ----------------------------------------------------

def _engine_window(container, name):
    """(stopped, started) of the engine's last stop and start, in the kernel's monotonic microseconds."""
    out = docker_exec(container, "systemctl", "show", "-p", "InactiveEnterTimestampMonotonic",
                      "-p", "ActiveEnterTimestampMonotonic", "kvcache-vllm@%s.service" % name).stdout
    props = dict(line.split("=", 1) for line in out.strip().splitlines())
    return int(props["InactiveEnterTimestampMonotonic"]), int(props["ActiveEnterTimestampMonotonic"])


def _server(container):
    return [docker_exec(container, "systemctl", verb, "kvcache-lmcache.service", check=False).stdout.strip()
            for verb in ("is-active", "is-enabled")]


def _kv_config(container, name):
    env = docker_exec(container, "cat", "%s/%s.env" % (ENV_DIR, name)).stdout
    return [line for line in env.splitlines() if line.startswith("VLLM_KV_TRANSFER_CONFIG=")][0]


def test_a_mode_switch_restarts_the_fleet_node_by_node(instances, router_url, client_key, hostvars, lab_back):
    """The servers must not stop at the converge: stopping one stops its engines (PartOf=), and the
    converge runs on every node at once. They stop in the rolling restart, node by node, after the
    node's engines (roles/lmcache/tasks/restart_server.yml), and the engines start again in-process.
    Measured with systemd's own monotonic timestamps (the containers share the kernel's clock): each
    engine's down window, from its stop to its start, must not overlap another node's, and no request
    through the router may fail: each node leaves the router before its engines stop and rejoins it
    after (playbooks/tasks/router_drain.yml)."""
    urls = [url for (_host, _container, _inst, url) in instances]
    assert wait_healthy(urls + [router_url], timeout=120), "the lab's instances or router do not answer /health"
    nodes = sorted(set(container for (_host, container, _inst, _url) in instances))
    assert all(_server(c) == ["active", "enabled"] for c in nodes), [_server(c) for c in nodes]
    before = dict((url, _engine_window(container, inst["name"])) for (_h, container, inst, url) in instances)
    served = hostvars[instances[0][0]]["kvcache_served_model_name"]
    loop = RequestLoop(router_url, client_key, served, streams=1, pause=LOOP_PAUSE).start()
    try:
        assert loop.wait_ok(3, timeout=120), loop.summary()
        served_before = len(loop.ok())
        out = nodes_stage("kvcache_lmcache_mode=inprocess", "vllm_kv_connector=example_shared_storage")
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
        after = len(loop.ok())
        assert loop.wait_ok(after + 3, timeout=180), loop.summary()
    finally:
        loop.stop()
        wait_healthy(urls, timeout=420)
    windows = dict((url, _engine_window(container, inst["name"])) for (_h, container, inst, url) in instances)
    servers = [_server(c) for c in nodes]
    configs = [_kv_config(container, inst["name"]) for (_h, container, inst, _u) in instances]
    # every engine restarted during the switch, into the in-process connector
    assert all(windows[url][0] > before[url][1] and windows[url][1] > windows[url][0] for url in urls), (before, windows)
    assert all("ExampleConnector" in config for config in configs), configs
    # the servers stopped and were disabled, in the rolling restart
    assert servers == [["inactive", "disabled"]] * len(nodes), servers
    assert "Stop and disable the LMCache server that in-process mode does not use" in out.stdout
    # never two nodes down at once: the nodes' down windows (first stop to last start) do not overlap
    by_node = {}
    for (_h, container, _inst, url) in instances:
        by_node.setdefault(container, []).append(windows[url])
    spans = sorted((min(w[0] for w in ws), max(w[1] for w in ws)) for ws in by_node.values())
    assert len(spans) >= 2, by_node
    for (_stop_a, start_a), (stop_b, _start_b) in zip(spans, spans[1:]):
        assert start_a < stop_b, "engines down at the same time: %s" % windows
    # every node left the router before its engines stopped and rejoined it after, so no
    # request failed. Before nodes.yml drained (stop 31): 15 of 52 requests got 500/503 "No
    # available workers (all circuits open or unhealthy)": the next node restarted while the
    # router still kept the first one out (health checks, circuit breaker).
    assert "Take this node's instances out of the router" in out.stdout
    assert loop.failed() == [], loop.summary()
    assert after > served_before, loop.summary()


# -- step 4: back to multiprocess mode on the fs tier ------------------------------------------

def test_the_lab_goes_back_to_multiprocess_mode_on_the_fs_tier(monitor, inventory, hostvars, instances, api_key,
                                                               router_url, lab_back):
    urls = [url for (_host, _container, _inst, url) in instances]
    nodes = sorted(set(container for (_host, container, _inst, _url) in instances))
    # both nodes in one batch: no traffic to keep serving here, it saves a node's restart time
    back = lab_back["run"] = nodes_stage(serial=len(group_hosts(inventory, "kvcache_nodes")))
    healthy_again = wait_healthy(urls, timeout=HEALTH_TIMEOUT)
    assert back.returncode == 0, back.stdout[-4000:] + back.stderr[-2000:]
    assert healthy_again, "an instance did not answer after the switch back"
    assert "RUNNING HANDLER [kvcache.offload.lmcache" not in back.stdout
    # the router has every instance back as soon as the playbook ends (stop 31's CI: the router
    # still answered 503, one instance out, in the next test after the switch back)
    assert http(router_url + "/health")[0] == 200
    # (the worker API is on the router host's loopback only: read it there)
    status, text = router_workers(inventory, hostvars)
    assert status == 200 and sorted(json.loads(text)["urls"]) == sorted(urls), text
    assert all(_server(c) == ["active", "enabled"] for c in nodes), [_server(c) for c in nodes]
    assert all("LMCacheMPConnector" in _kv_config(container, inst["name"])
               for (_h, container, inst, _u) in instances)
    # and no in-process lmcache-config.yaml left behind
    left = [c for c in nodes if docker_exec(c, "test", "-e", "/etc/kvcache/lmcache-config.yaml", check=False).returncode == 0]
    assert left == [], "in-process lmcache-config.yaml left on %s" % left
    # The fleet's one seed on the fs tier: the tier serves the second node the first node's prompt.
    before = _l2_hits(monitor)
    _round_trip(instances, api_key, hostvars[instances[0][0]]["kvcache_served_model_name"], "restored")
    wait_for("L2 hits again on the fleet's one seed", lambda: _l2_hits(monitor) > before, timeout=60)
