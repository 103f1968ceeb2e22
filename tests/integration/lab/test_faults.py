"""Operational faults in the lab, each under a request loop through the router.

- kill -9 of one instance: the router routes around it, systemd restarts it, and only
  requests in flight at the kill may fail; traffic reaches the instance again afterwards.
- the S3 store down: serving goes on (the lab's engines use the fs tier; an S3-tier
  engine recomputes, LMCache disables S3 after 3 connection failures), and validate.yml,
  pointed at the S3 path, reports the tier unreachable in the S3 stages.

Every step is bounded; the lab is restored in `finally` blocks.
"""
import json
import time

import pytest

from faultutil import (cause, lab_s3_keys, run_validate, s3_probe_config, s3_vars, set_s3_store, stage,
                       wait_healthy, wait_s3)
from labutil import container_name, docker_exec, group_hosts, http, metric
from loadloop import RequestLoop

SUCCESS = "vllm:request_success_total"
RESTART_TIMEOUT = 420


@pytest.fixture(scope="module")
def model(hostvars, node_hosts):
    return hostvars[node_hosts[0]]["kvcache_served_model_name"]


@pytest.fixture(scope="module")
def all_healthy(instances, router_url):
    urls = [url for (host, container, inst, url) in instances]
    if not wait_healthy(urls + [router_url], timeout=120):
        pytest.skip("the lab's instances or router do not answer /health (is the lab up?)")
    return urls


def unit_state(container, unit):
    out = docker_exec(container, "systemctl", "show", "-p", "MainPID", "-p", "NRestarts", "-p", "ActiveState",
                      unit).stdout
    return dict(line.split("=", 1) for line in out.strip().splitlines())


def test_kill_9_of_an_instance_under_load(instances, all_healthy, router_url, api_key, model):
    host, container, inst, url = instances[0]
    unit = "kvcache-vllm@%s.service" % inst["name"]
    before = unit_state(container, unit)
    assert before["ActiveState"] == "active" and int(before["MainPID"]) > 0, before
    loop = RequestLoop(router_url, api_key, model, streams=2).start()
    try:
        assert loop.wait_ok(4, timeout=120), loop.summary()
        t_kill = time.monotonic()
        docker_exec(container, "kill", "-9", before["MainPID"])
        # The router routes around the dead instance: requests sent after the kill succeed.
        assert loop.wait_ok(6, since=t_kill, timeout=120), loop.summary()
        # systemd restarts it, and it answers again.
        deadline = time.monotonic() + RESTART_TIMEOUT
        after = unit_state(container, unit)
        while time.monotonic() < deadline and not (
                int(after["NRestarts"]) > int(before["NRestarts"]) and wait_healthy([url], timeout=5)):
            time.sleep(3)
            after = unit_state(container, unit)
        assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1, (before, after)
        assert after["MainPID"] != before["MainPID"] and after["ActiveState"] == "active", (before, after)
        assert wait_healthy([url], timeout=10), "%s did not answer /health after its restart" % url
        # The router sends traffic to it again (its own success counter grows).
        served = metric(url, SUCCESS, {})
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and metric(url, SUCCESS, {}) <= served:
            time.sleep(2)
        assert metric(url, SUCCESS, {}) > served, "the restarted instance gets no traffic through the router"
    finally:
        loop.stop()
        wait_healthy(all_healthy)
    failed = loop.failed()
    # Only requests in flight at the kill may fail (at most one per stream).
    assert all(r["start"] < t_kill for r in failed), loop.summary()
    assert len(failed) <= loop.streams, loop.summary()
    assert len(loop.ok()) >= 10, loop.summary()


def test_s3_store_down_serving_goes_on_and_validation_names_the_tier(
        tmp_path, inventory, hostvars, all_healthy, router_url, api_key, model):
    s3_host = group_hosts(inventory, "kvcache_s3_store")[0]
    container = container_name(hostvars, s3_host)
    keys = lab_s3_keys()
    assert wait_s3(hostvars, s3_host, keys, "ok") == "ok", "the lab's S3 store is not serving before the test"
    s3_probe_config("present")
    loop = RequestLoop(router_url, api_key, model, streams=1)
    try:
        set_s3_store(container, running=False)
        down = wait_s3(hostvars, s3_host, keys, "refused", timeout=30)
        assert down != "ok", "the S3 store still answers after its stop"
        loop.start()
        rc, report, out = run_validate(str(tmp_path), extra=s3_vars(hostvars, s3_host))
        loop.stop()
    finally:
        loop.stop()
        set_s3_store(container, running=True)
        s3_probe_config("absent")
    assert wait_s3(hostvars, s3_host, keys, "ok") == "ok", "the S3 store did not come back"
    assert wait_healthy(all_healthy, timeout=60)
    # Serving went on while the store was down.
    assert loop.failed() == [] and len(loop.ok()) >= 3, loop.summary()
    # The validation names the tier down in the S3 stages, and fails the run.
    assert report is not None, out
    assert rc != 0
    assert stage(report, "instances")["status"] == "pass"
    for stage_id in ("tier_write", "lmcache_probe"):
        found = stage(report, stage_id)
        assert found["status"] == "fail" and "tier_unreachable" in found["causes"], (found, report["causes"])
    assert cause(report, "tier_unreachable") is not None


FILLER_PREFIX = "fault-filler-"


def _tier_usage(container, path):
    """{entry name: bytes} of the tier's top-level entries, and the total."""
    out = docker_exec(container, "du", "-s", "-b", "--apparent-size", "--", *(
        docker_exec(container, "find", path, "-mindepth", "1", "-maxdepth", "1").stdout.split())).stdout
    sizes = dict((line.split("\t")[1].rsplit("/", 1)[-1], int(line.split("\t")[0])) for line in out.splitlines())
    return sizes, sum(sizes.values())


def test_tier_over_its_budget_is_pruned_oldest_first_and_serving_goes_on(
        hostvars, node_hosts, all_healthy, router_url, api_key, model):
    """The shared tier grows past kvcache_prune_max_bytes: the pruner's own systemd service
    brings it back under, least recently used first, leaves young entries alone, logs what
    it removed, and the instances keep serving.

    The lab's tier is a directory on the controller's disk, so "full" is the size watermark
    (max_bytes), the one the pruner enforces on any file system; the free-space watermark
    (min_free_percent) is the same code path with statvfs and is unit-tested.
    """
    host = node_hosts[0]
    container = container_name(hostvars, host)
    config = json.loads(docker_exec(container, "cat", "/etc/kvcache/prune.json").stdout)
    path, budget, grace = config["path"], int(config["max_bytes"]), int(config["grace_seconds"])
    assert budget > 0 and config["unit"] == "directory", config
    assert grace <= 120, "the lab's pruning grace period is %d s: too long for this test" % grace
    user = hostvars[host].get("kvcache_service_user", "kvcache")
    piece = 128 * 1024 * 1024
    old_count = (budget // piece) + 3          # more than the budget on their own
    names = ["%s%02d" % (FILLER_PREFIX, i) for i in range(old_count)]
    young = FILLER_PREFIX + "young"
    summary_file = config.get("summary_file") or "/var/log/kvcache-prune/summary.jsonl"
    # The timer (every 15 min) must not run the pruner in the middle of the test: this test
    # starts the service itself, and counts its summary lines.
    docker_exec(container, "systemctl", "stop", "kvcache-prune.timer")
    docker_exec(container, "bash", "-c", "for i in $(seq 60); do systemctl is-active -q kvcache-prune.service || exit 0;"
                " sleep 1; done; exit 1", timeout=90)
    lines_before = len(docker_exec(container, "cat", summary_file, check=False).stdout.splitlines())
    try:
        for age, name in enumerate(names):
            entry = "%s/%s" % (path, name)
            docker_exec(container, "runuser", "-u", user, "--", "mkdir", "-p", entry)
            docker_exec(container, "runuser", "-u", user, "--", "fallocate", "-l", str(piece), entry + "/layer.bin")
            # older names were used longer ago: filler-00 is the least recently used
            stamp = "%d minutes ago" % (600 - age)
            docker_exec(container, "touch", "-d", stamp, entry + "/layer.bin", entry)
        total = _tier_usage(container, path)[1]
        assert total > budget, "the filler did not take the tier over its budget (%d <= %d)" % (total, budget)
        time.sleep(grace + 2)  # creation set ctime to now: the pruner protects entries younger than grace
        docker_exec(container, "runuser", "-u", user, "--", "mkdir", "-p", "%s/%s" % (path, young))
        docker_exec(container, "runuser", "-u", user, "--", "fallocate", "-l", str(piece // 4),
                    "%s/%s/layer.bin" % (path, young))
        run = docker_exec(container, "systemctl", "start", "kvcache-prune.service", timeout=300, check=False)
        state = docker_exec(container, "systemctl", "show", "-p", "Result", "-p", "ExecMainStatus",
                            "kvcache-prune.service").stdout
        after, total_after = _tier_usage(container, path)
        summary = docker_exec(container, "cat", summary_file, check=False).stdout.splitlines()
        status, text = http(
            router_url + "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 2},
            key=api_key, timeout=120)
    finally:
        docker_exec(container, "bash", "-c", "rm -rf -- %s/%s*" % (path, FILLER_PREFIX), check=False)
        docker_exec(container, "systemctl", "start", "kvcache-prune.timer", check=False)
    assert docker_exec(container, "systemctl", "is-active", "kvcache-prune.timer", check=False).stdout.strip() == "active"
    assert run.returncode == 0 and "ExecMainStatus=0" in state, (run.stderr, state)
    assert total_after <= budget, "the tier holds %d bytes after the pruner, budget %d" % (total_after, budget)
    removed = [n for n in names if n not in after]
    kept = [n for n in names if n in after]
    assert removed, "the pruner removed no filler"
    # least recently used first: every removed filler is older than every kept one
    assert not kept or max(names.index(n) for n in removed) < min(names.index(n) for n in kept), (removed, kept)
    assert young in after, "the pruner removed an entry younger than its grace period"
    assert len(summary) == lines_before + 1, summary[-2:]
    last = json.loads(summary[-1])
    assert last["removed_entries"] == len(removed) and last["removed_bytes"] >= len(removed) * piece, last
    assert last["watermark_met"] is True and not last.get("dry_run"), last
    assert status == 200, text[:300]
    assert wait_healthy(all_healthy, timeout=30)
