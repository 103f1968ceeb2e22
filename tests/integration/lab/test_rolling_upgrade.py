"""playbooks/rolling_upgrade.yml in the lab, under a request loop through the router.

The upgrade changes the model (a second tiny model at a new path, same served name), node
by node. Every request of the loop must succeed; afterwards every instance serves the new
model from a new process. Then the same upgrade runs again (both nodes in one batch, without
the loop, to keep it short): with nothing to upgrade, no node may be drained or restarted,
and the run must change nothing. conftest.py runs this test after every other lab test: it leaves
the lab on the upgraded model (`make lab` rolls it back, through the same rolling restart;
`make lab-test` removes the lab anyway). Rolling back is the same playbook with the old
model, so it is not run a second time here (the lab runs on two CPU cores).
"""
import json
import re
import subprocess

import pytest

from faultutil import ansible_env, wait_healthy
from labutil import ROOT, docker_exec, http
from loadloop import RequestLoop

PLAYBOOK_TIMEOUT = 1500
LOOP_PAUSE = 2.5


def upgrade(*extra):
    proc = subprocess.run(
        ["ansible-playbook", "playbooks/rolling_upgrade.yml"] + [a for e in extra for a in ("-e", e)],
        cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=PLAYBOOK_TIMEOUT, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _task_output(out, name):
    """The lines the playbook printed for every run of task `name` (one per batch)."""
    lines, keep = [], False
    for line in out.splitlines():
        if line.startswith("TASK ["):
            keep = name in line
        elif keep:
            lines.append(line)
    return "\n".join(lines)


def served_root(url, key):
    status, text = http(url + "/v1/models", key=key, timeout=10)
    assert status == 200, text[:300]
    return json.loads(text)["data"][0]["root"]


def main_pids(instances):
    return dict((url, docker_exec(container, "systemctl", "show", "-p", "MainPID", "--value",
                                  "kvcache-vllm@%s.service" % inst["name"]).stdout.strip())
                for (host, container, inst, url) in instances)


def test_rolling_model_upgrade_loses_no_request(instances, hostvars, router_url, api_key, client_key):
    urls = [url for (host, container, inst, url) in instances]
    if not wait_healthy(urls + [router_url], timeout=120):
        pytest.skip("the lab's instances or router do not answer /health (is the lab up?)")
    node = instances[0][0]
    model = hostvars[node]["kvcache_model"]
    served = hostvars[node]["kvcache_served_model_name"]
    new_model = model.rstrip("/") + "-upgrade"
    assert all(served_root(url, api_key) == model for url in urls)
    pids = main_pids(instances)
    # One stream with a pause between requests: steady traffic, and CPU left for the upgrade.
    # The pause is longer than the 1 s a vLLM worker spins (sched_yield) after each step
    # before it sleeps (vllm shm_broadcast SpinCondition): at 0.5 s the serving node's worker
    # held a core at 100% and the other node's engine took 6 min instead of 40 s to start.
    loop = RequestLoop(router_url, client_key, served, streams=1, pause=LOOP_PAUSE).start()
    try:
        assert loop.wait_ok(3, timeout=120), loop.summary()
        change = ("kvcache_model=%s" % new_model, "kvcache_served_model_name=%s" % served)
        rc, out = upgrade(*change)
        assert rc == 0, out[-4000:]
        count_after_upgrade = len(loop.ok())
        assert loop.wait_ok(count_after_upgrade + 3, timeout=120), loop.summary()
    finally:
        loop.stop()
        wait_healthy(urls, timeout=300)
    pids_upgraded = main_pids(instances)
    # The same upgrade again, both nodes in one batch (no traffic: nothing may be drained).
    noop_rc, noop_out = upgrade(*change, "kvcache_upgrade_serial=%d" % len(set(h for (h, _c, _i, _u) in instances)))
    assert noop_rc == 0, noop_out[-4000:]
    upgraded = dict((url, served_root(url, api_key)) for url in urls)
    assert upgraded == dict((url, new_model) for url in urls), upgraded
    # every instance was restarted (a new process), one node at a time
    upgraded_pids = main_pids(instances)
    assert all(pids_upgraded[url] != pids[url] for url in urls), (pids, pids_upgraded)
    assert "Draining" in out and "Take this node's instances out of the router" in out
    # the rerun with nothing to upgrade drained nothing, restarted nothing, changed nothing
    assert upgraded_pids == pids_upgraded, (pids_upgraded, upgraded_pids)
    drains = _task_output(noop_out, "Take this node's instances out of the router")
    for host in sorted(set(h for (h, _c, _i, _u) in instances)):
        assert "Nothing to upgrade on %s" % host in noop_out, noop_out[-4000:]
        assert "changed: [%s" % host not in drains, drains
        assert re.search(r"^%s\s+: ok=\d+\s+changed=0\s" % re.escape(host), noop_out, re.M), noop_out[-3000:]
    # no request through the router failed during the upgrade
    assert loop.failed() == [], loop.summary()
    assert len(loop.ok()) >= 10, loop.summary()
