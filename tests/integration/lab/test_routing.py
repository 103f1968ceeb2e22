"""Validation stage 8 (routing) on the lab: the lab's policy and a cache-aware one (#22 item 2).

validate.yml with stages [instances, routing] under the lab's router policy (round_robin in
inventories/lab/group_vars/kvcache_router/lab.yml): the stage passes (cache-blind, informational)
with every request attributed to an instance. Then ONLY the router is reconverged with
-e router_policy=cache_aware (playbooks/router.yml) and the stage must show >= 90 % of repeat turns
on an instance already holding the session's prefix, above the round-robin run's ratio. The
module fixture's finalizer reconverges the router without the override, so later tests see the
lab's policy again (the last test checks that on the router's unit).
"""
import subprocess

import pytest

from faultutil import ansible_env, run_validate, stage, wait_healthy
from labutil import ROOT, container_name, docker_exec, group_hosts

STAGES = ["-e", '{"validation_stages": ["instances", "routing"]}']
# Set by the last test once it restored the lab's policy, so the finalizer does not run the play twice.
RESTORED = {"done": False}
ROUTER_TIMEOUT = 600
ROUTER_UNIT = "kvcache-router.service"


def _router_play(extra=()):
    proc = subprocess.run(["ansible-playbook", "playbooks/router.yml"] + list(extra), cwd=ROOT, env=ansible_env(),
                          capture_output=True, text=True, timeout=ROUTER_TIMEOUT, check=False)
    return proc.returncode, (proc.stdout + proc.stderr)[-4000:]


def _exec_start(hostvars, router):
    unit = docker_exec(container_name(hostvars, router), "systemctl", "cat", ROUTER_UNIT).stdout
    return [line for line in unit.splitlines() if line.startswith("ExecStart=")]


@pytest.fixture(scope="module")
def router_host(inventory):
    routers = group_hosts(inventory, "kvcache_router")
    assert routers, "the lab inventory has no router"
    return routers[0]


@pytest.fixture(scope="module")
def lab_policy(hostvars, router_host):
    policy = hostvars[router_host].get("router_policy")
    assert policy, "the lab inventory sets router_policy for its vllm_router"
    return policy


@pytest.fixture(scope="module")
def lab_report(tmp_path_factory, instances, router_url, hostvars, router_host, lab_policy):
    urls = [i[3] for i in instances] + [router_url]
    if not wait_healthy(urls, timeout=120):
        pytest.skip("the lab's instances or router do not answer /health (is the lab up?)")
    if not any("--policy %s " % lab_policy in line + " " for line in _exec_start(hostvars, router_host)):
        # An interrupted run of this file left another policy: converge the lab's first.
        rc, out = _router_play()
        assert rc == 0, out
        assert wait_healthy([router_url], timeout=120)
    rc, report, out = run_validate(str(tmp_path_factory.mktemp("routing-lab")), extra=STAGES)
    assert rc == 0 and report is not None, out
    return report


@pytest.fixture(scope="module")
def cache_aware_report(request, tmp_path_factory, lab_report, router_url):  # pylint: disable=unused-argument
    def restore():
        if RESTORED["done"]:
            return
        rc, out = _router_play()
        assert rc == 0, "restoring the lab's router policy failed:\n" + out

    request.addfinalizer(restore)
    rc, out = _router_play(["-e", "router_policy=cache_aware"])
    assert rc == 0, out
    assert wait_healthy([router_url], timeout=120)
    # The inventory still says the lab's policy: the stage judges the policy it is told the router runs.
    rc, report, out = run_validate(str(tmp_path_factory.mktemp("routing-ca")),
                                   extra=STAGES + ["-e", "router_policy=cache_aware"])
    assert rc == 0 and report is not None, out
    return report


def test_the_stage_passes_under_the_labs_policy(lab_report, lab_policy, instances):
    routing = stage(lab_report, "routing")
    assert routing["status"] == "pass", routing
    nums = routing["numbers"]
    assert nums["policy"] == lab_policy
    assert nums["instances"] == len(instances)
    assert nums["sessions"] == 4 and nums["requests"] == 16 and nums["repeat_turns"] == 12
    assert nums["failed"] == 0 and nums["unattributed"] == 0
    # Every request was attributed to one instance of the fleet, and its prefix to a source.
    labels = {"%s/%s" % (i[0], i[2]["name"]) for i in instances}
    for row in routing["details"]["requests"]:
        assert row["served_by"] in labels, row
        assert row["source"] in ("gpu_prefix_cache", "shared_tier", "recomputed"), row
    assert routing["details"]["backends_differ"] == {"extra": [], "missing": []}
    assert "informational" in routing["reason"]


def test_round_robin_spreads_the_sessions_over_the_instances(lab_report, lab_policy):
    if lab_policy != "round_robin":
        pytest.skip("the lab runs %s" % lab_policy)
    routing = stage(lab_report, "routing")
    for sess in routing["details"]["sessions"]:
        assert len(sess["instances_used"]) == 2, sess
    assert routing["numbers"]["first_repeat_holding_ratio"] < 0.5


def test_a_cache_aware_policy_keeps_repeat_turns_on_the_holding_instance(
        cache_aware_report, lab_report, router_host, hostvars):
    assert any("--policy cache_aware" in line for line in _exec_start(hostvars, router_host))
    routing = stage(cache_aware_report, "routing")
    assert routing["status"] == "pass", routing
    nums = routing["numbers"]
    assert nums["policy"] == "cache_aware" and nums["required_ratio"] == 0.9
    assert nums["holding_ratio"] >= 0.9, routing["reason"]
    assert nums["gpu_prefix_cache_turns"] >= 0.9 * nums["repeat_turns"]
    lab_ratio = stage(lab_report, "routing")["numbers"]["holding_ratio"]
    assert lab_ratio < nums["holding_ratio"], (lab_ratio, nums["holding_ratio"])


def test_the_labs_policy_is_restored(cache_aware_report, router_host, hostvars, lab_policy, router_url):  # pylint: disable=unused-argument
    """The fixture's finalizer restores the policy in any case; here it is done and checked."""
    rc, out = _router_play()
    assert rc == 0, out
    RESTORED["done"] = True
    assert wait_healthy([router_url], timeout=120)
    assert any("--policy %s" % lab_policy in line for line in _exec_start(hostvars, router_host))
