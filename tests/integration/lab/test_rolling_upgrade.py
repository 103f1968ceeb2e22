"""playbooks/rolling_upgrade.yml in the lab, under a request loop through the router.

The upgrade changes the model (a second tiny model at a new path, same served name), node
by node, in two runs the way an interrupted upgrade is finished: the first is limited to the
first node, the second covers the fleet. In the second run the first node has nothing to
upgrade: it must stay in the router and keep its processes (no drain, no restart), while the
other node is drained and upgraded. Every request of the loop must succeed; afterwards every
instance serves the new model from a new process. conftest.py runs this test after every other lab test: it leaves
the lab on the upgraded model (`make lab` rolls it back, through the same rolling restart;
`make lab-test` removes the lab anyway). Rolling back is the same playbook with the old
model, so it is not run a second time here (the lab runs on two CPU cores).
"""
import json
import subprocess

import pytest

from faultutil import ansible_env, wait_healthy
from labutil import ROOT, docker_exec, http
from loadloop import RequestLoop

PLAYBOOK_TIMEOUT = 1500


def upgrade(*extra, limit=None):
    proc = subprocess.run(
        ["ansible-playbook", "playbooks/rolling_upgrade.yml"] + [a for e in extra for a in ("-e", e)]
        + (["--limit", limit] if limit else []),
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


def test_rolling_model_upgrade_loses_no_request(instances, hostvars, router_url, api_key):
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
    loop = RequestLoop(router_url, api_key, served, streams=1, pause=0.5).start()
    try:
        assert loop.wait_ok(3, timeout=120), loop.summary()
        change = ("kvcache_model=%s" % new_model, "kvcache_served_model_name=%s" % served)
        others = [h for (h, _c, _i, _u) in instances if h != node]
        first_rc, first_out = upgrade(*change, limit=",".join(["all"] + ["!%s" % h for h in others]))
        assert first_rc == 0, first_out[-4000:]
        pids_first = main_pids(instances)
        rc, out = upgrade(*change)
        assert rc == 0, out[-4000:]
        count_after_upgrade = len(loop.ok())
        assert loop.wait_ok(count_after_upgrade + 3, timeout=120), loop.summary()
    finally:
        loop.stop()
        wait_healthy(urls, timeout=300)
    upgraded = dict((url, served_root(url, api_key)) for url in urls)
    assert upgraded == dict((url, new_model) for url in urls), upgraded
    # every instance was restarted (a new process), one node at a time: the first node in the
    # limited run, the others in the fleet run, which left the first node alone
    upgraded_pids = main_pids(instances)
    assert all(upgraded_pids[url] != pids[url] for url in urls), (pids, upgraded_pids)
    for (host, _c, _i, url) in instances:
        if host == node:
            assert pids_first[url] != pids[url] and upgraded_pids[url] == pids_first[url], (host, pids, pids_first)
        else:
            assert pids_first[url] == pids[url], "the run limited to %s restarted %s" % (node, host)
    assert "Nothing to upgrade on %s" % node in out, out[-4000:]
    assert "changed: [%s" % node not in _task_output(out, "Take this node's instances out of the router"), out[-4000:]
    for host in others:
        assert "Nothing to upgrade on %s" % host not in out
        assert "changed: [%s" % host in _task_output(out, "Take this node's instances out of the router"), out[-4000:]
    # no request through the router failed during the upgrade
    assert loop.failed() == [], loop.summary()
    assert len(loop.ok()) >= 10, loop.summary()
    assert "Draining" in out and "Take this node's instances out of the router" in out
