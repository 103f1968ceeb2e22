"""The two ways the validation reaches the nodes, against the running lab.

- playbooks/validate.yml: a play on the node group runs the node-side part (settings read
  for the cause analysis, stage 1's requests to each node's instances, stage 6's LMCache
  probe) on every node at once; the controller play reads the results from hostvars and
  loops over no node.
- the role alone on the controller (tests/integration/lab/playbooks/validate_on_controller.yml):
  it does the same itself, delegated, one node after another.

Both must give the same report: every node read, every instance answering, the LMCache
chunk stored on one node and loaded bit-exact on the other. Stages 2-5 are left out to
keep the runs short (test_runner.py runs all of them through site.yml).
"""
import os
import re

import pytest

from faultutil import run_validate, stage, wait_healthy
from labutil import ROOT

STAGES = ["-e", '{"validation_stages": ["instances", "lmcache_probe"]}']
CONTROLLER_ONLY = os.path.join(ROOT, "tests", "integration", "lab", "playbooks", "validate_on_controller.yml")
DIAGNOSE_TASK = "TASK [kvcache.offload.validation : Diagnose | Instance env files on the node]"
RECAP_HOST = re.compile(r"^(\S+)\s+: ok=(\d+)", re.MULTILINE)


@pytest.fixture(scope="module")
def instance_urls(hostvars, node_hosts):
    urls = ["http://%s:%d" % (hostvars[h]["ansible_host"], i["port"])
            for h in node_hosts for i in hostvars[h]["vllm_instances"]]
    if not wait_healthy(urls, timeout=60):
        pytest.skip("the lab's instances do not answer /health (is the lab up?)")
    return urls


def _recap(out):
    return dict((host, int(ok)) for host, ok in RECAP_HOST.findall(out.split("PLAY RECAP", 1)[-1]))


def _task_output(out, header):
    """What the (first) task with this header printed, up to the next task."""
    return out.split(header, 1)[1].split("\nTASK [", 1)[0]


def _same_report(report, node_hosts, instance_urls):
    """What both paths must find: every node read, every instance, stage 6 across the nodes."""
    assert sorted(n["host"] for n in report["fleet"]["nodes"]) == sorted(node_hosts)
    assert all(n["reachable"] for n in report["fleet"]["nodes"]), report["fleet"]["nodes"]
    assert all(n.get("lmcache") for n in report["fleet"]["nodes"]), "a node's LMCache config was not read"
    assert len(report["fleet"]["instances"]) == len(instance_urls), report["fleet"]["instances"]
    s1 = stage(report, "instances")
    assert s1["status"] == "pass", s1
    s6 = stage(report, "lmcache_probe")
    assert s6["status"] == "pass", s6
    assert report["result"] == "pass" and report["failed_required"] == []
    return s1, s6


def test_node_play_reads_and_probes_every_node_at_once(tmp_path, node_hosts, instance_urls):
    rc, report, out = run_validate(str(tmp_path), extra=STAGES, tail=None)
    assert rc == 0, out[-4000:]
    assert report is not None, out[-4000:]
    _same_report(report, node_hosts, instance_urls)
    # One task for all nodes (not one per node): the nodes ran it at once, each on itself.
    assert out.count(DIAGNOSE_TASK) == 1, out.count(DIAGNOSE_TASK)
    diagnose = _task_output(out, DIAGNOSE_TASK)
    for host in node_hosts:
        assert re.search(r"^ok: \[%s\]" % re.escape(host), diagnose, re.MULTILINE), "%s did not read itself" % host
        # stage 1's requests go from the controller, on behalf of each node
        assert re.search(r"^ok: \[%s -> localhost" % re.escape(host), out, re.MULTILINE), \
            "no stage 1 request for %s's instances" % host
    recap = _recap(out)
    assert all(recap.get(h, 0) > 0 for h in node_hosts), recap


def test_role_alone_on_the_controller_reads_every_node_itself(tmp_path, node_hosts, instance_urls):
    rc, report, out = run_validate(str(tmp_path), extra=STAGES, playbook=CONTROLLER_ONLY, tail=None)
    assert rc == 0, out[-4000:]
    assert report is not None, out[-4000:]
    _same_report(report, node_hosts, instance_urls)
    # Without the node play the controller reads the nodes one after another.
    assert out.count(DIAGNOSE_TASK) == len(node_hosts), out.count(DIAGNOSE_TASK)
    assert re.search(r"^ok: \[localhost -> %s[](]" % re.escape(node_hosts[0]), _task_output(out, DIAGNOSE_TASK),
                     re.MULTILINE), _task_output(out, DIAGNOSE_TASK)
    recap = _recap(out)
    assert set(recap) == {"localhost"}, recap
