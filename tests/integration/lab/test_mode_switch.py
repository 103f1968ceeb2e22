"""A switch of kvcache_lmcache_mode on the running lab, under a request loop through the router.

The lab serves in multiprocess mode: every engine is bound to its node's LMCache server
(PartOf=). The nodes stage converges again with kvcache_lmcache_mode=inprocess (and vLLM's
ExampleConnector: LMCache's in-process connector does not run on vLLM's CPU build). The servers
must not stop at the converge: stopping one stops its engines, and the converge runs on every
node at once. They stop in the rolling restart, node by node, after the node's engines
(roles/lmcache/tasks/restart_server.yml), and the engines start again in-process. Measured with
systemd's own monotonic timestamps (the containers share the kernel's clock): each engine's
down window, from its stop to its start, must not overlap another node's, and no request
through the router may fail: each node leaves the router before its engines stop and rejoins
it after (playbooks/tasks/router_drain.yml). Then the lab goes back to multiprocess mode (both
nodes in one batch, no loop), after which the router must list every instance at once.

On the old lmcache role (in-process mode stopped the server at the converge, on every node at
once) the windows would overlap; that run was not made (session time), so this is by
construction, not measured.
"""
import json

import pytest

from faultutil import ENV_DIR, nodes_stage, wait_healthy
from labutil import docker_exec, group_hosts, http, router_workers
from loadloop import RequestLoop

LOOP_PAUSE = 2.5  # test_rolling_upgrade.py: longer than the 1 s a vLLM CPU worker spins after a step


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


def test_a_mode_switch_restarts_the_fleet_node_by_node(inventory, instances, router_url, client_key, hostvars):
    urls = [url for (_host, _container, _inst, url) in instances]
    if not wait_healthy(urls + [router_url], timeout=120):
        pytest.skip("the lab's instances or router do not answer /health (is the lab up?)")
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
    try:
        windows = dict((url, _engine_window(container, inst["name"])) for (_h, container, inst, url) in instances)
        servers = [_server(c) for c in nodes]
        configs = [_kv_config(container, inst["name"]) for (_h, container, inst, _u) in instances]
    finally:
        back = nodes_stage(serial=len(group_hosts(inventory, "kvcache_nodes")))
        healthy_again = wait_healthy(urls, timeout=420)
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
    # back to multiprocess mode: servers running and enabled, engines through LMCache's MP connector
    assert back.returncode == 0, back.stdout[-4000:] + back.stderr[-2000:]
    assert healthy_again, "an instance did not answer after the switch back"
    # and the router has every instance back as soon as the playbook ends (stop 31's CI: the
    # router still answered 503, one instance out, in the next test after the switch back)
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
