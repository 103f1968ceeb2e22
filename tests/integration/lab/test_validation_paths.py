"""The ways the validation reaches the nodes, against the running lab.

- playbooks/validate.yml: a play on the node group runs the node-side part (settings read
  for the cause analysis, stage 1's requests to each node's instances, stage 6's LMCache
  probe) on every node at once; the controller play reads the results from hostvars and
  reaches no node itself.
- the role alone on the controller (tests/integration/lab/playbooks/validate_on_controller.yml):
  it does the same itself, delegated, one node after another.
- validate.yml with a --limit that leaves a node out: the node play does nothing, the
  controller does it all (the node left out is still validated, as before the node play).
- two validations in one playbook run (validate_twice.yml): the second does not reuse the
  node play's results.

Every way must give a passing report with every node read, every instance answering, and
the LMCache chunk stored on one node and loaded bit-exact on the other; the node play and
the controller alone must agree on instances, storing node and loading nodes. Stages 2-5
are left out to keep the runs short (test_runner.py runs all of them through site.yml).
"""
import glob
import json
import os
import re

import pytest

from faultutil import run_validate, stage, wait_healthy
from labutil import ROOT

STAGES = ["-e", '{"validation_stages": ["instances", "lmcache_probe"]}']
PLAYBOOKS = os.path.join(ROOT, "tests", "integration", "lab", "playbooks")
TASK = "TASK [kvcache.offload.validation : %s]"
DIAGNOSE_TASK = TASK % "Diagnose | Instance env files on the node"
PROBE_TASK = TASK % "Stage 6 | LMCache storage probe on the node (%s)"


@pytest.fixture(scope="module")
def instance_urls(hostvars, node_hosts):
    urls = ["http://%s:%d" % (hostvars[h]["ansible_host"], i["port"])
            for h in node_hosts for i in hostvars[h]["vllm_instances"]]
    if not wait_healthy(urls, timeout=60):
        pytest.skip("the lab's instances do not answer /health (is the lab up?)")
    return urls


@pytest.fixture(scope="module")
def node_play(tmp_path_factory, instance_urls):  # pylint: disable=unused-argument
    return _run(tmp_path_factory.mktemp("node-play"))


@pytest.fixture(scope="module")
def controller_alone(tmp_path_factory, instance_urls):  # pylint: disable=unused-argument
    return _run(tmp_path_factory.mktemp("controller"), playbook=os.path.join(PLAYBOOKS, "validate_on_controller.yml"))


def _run(report_dir, playbook="playbooks/validate.yml", extra=()):
    rc, report, out = run_validate(str(report_dir), extra=STAGES + list(extra), playbook=playbook, tail=None)
    assert rc == 0, out[-4000:]
    assert report is not None, out[-4000:]
    return report, out


def _task_outputs(out, header):
    """What each task with this header printed, up to the next task."""
    return [part.split("\nTASK [", 1)[0] for part in out.split(header)[1:]]


def _ran_on(out, header):
    """The hosts a task ran on, as the callback labels them ('lab-node1', 'localhost -> lab-node1')."""
    return sorted(set(re.findall(r"^ok: \[([^\]]+?)(?:\(\S+\))?\]", "".join(_task_outputs(out, header)), re.MULTILINE)))


def _check_report(report, node_hosts, instance_urls):
    """What every way must find: every node read, every instance, stage 6 across the nodes."""
    assert sorted(n["host"] for n in report["fleet"]["nodes"]) == sorted(node_hosts)
    assert all(n["reachable"] for n in report["fleet"]["nodes"]), report["fleet"]["nodes"]
    assert all(n.get("lmcache") for n in report["fleet"]["nodes"]), "a node's LMCache config was not read"
    assert len(report["fleet"]["instances"]) == len(instance_urls), report["fleet"]["instances"]
    assert stage(report, "instances")["status"] == "pass", stage(report, "instances")
    assert stage(report, "lmcache_probe")["status"] == "pass", stage(report, "lmcache_probe")
    assert report["result"] == "pass" and report["failed_required"] == []


def _probe_hosts(report):
    """(storing node, [loading nodes]) of stage 6, from the report's details."""
    rows = stage(report, "lmcache_probe")["details"]["results"]
    stores = [r["host"] for r in rows if r["action"] == "store"]
    assert len(stores) == 1, rows
    return stores[0], sorted(r["host"] for r in rows if r["action"] == "load")


def test_node_play_reads_and_probes_every_node_at_once(node_play, node_hosts, instance_urls):
    report, out = node_play
    _check_report(report, node_hosts, instance_urls)
    # One task for all nodes (not one per node), each node on itself; nothing from the controller.
    assert out.count(DIAGNOSE_TASK) == 1, out.count(DIAGNOSE_TASK)
    assert _ran_on(out, DIAGNOSE_TASK) == sorted(node_hosts)
    assert "ok: [localhost -> " not in out, "the controller reached a node itself"
    # stage 1's requests go from the controller, on behalf of each node, every node in one task
    requests = TASK % "Stage 1 | An authenticated completion from every instance"
    assert out.count(requests) == 1 and _ran_on(out, requests) == sorted(h + " -> localhost" for h in node_hosts)
    # stage 6: stored on one node, loaded on the others, each on itself
    store, loads = _probe_hosts(report)
    assert _ran_on(out, PROBE_TASK % "store") == [store]
    assert _ran_on(out, PROBE_TASK % "load") == loads == sorted(set(node_hosts) - {store})


def test_role_alone_on_the_controller_reads_every_node_itself(controller_alone, node_hosts, instance_urls):
    report, out = controller_alone
    _check_report(report, node_hosts, instance_urls)
    # Without the node play the controller reads the nodes one after another.
    assert out.count(DIAGNOSE_TASK) == len(node_hosts), out.count(DIAGNOSE_TASK)
    assert _ran_on(out, DIAGNOSE_TASK) == sorted("localhost -> " + h for h in node_hosts)
    store, loads = _probe_hosts(report)
    assert _ran_on(out, PROBE_TASK % "store") == ["localhost -> " + store]
    assert _ran_on(out, PROBE_TASK % "load") == ["localhost -> " + h for h in loads]


def test_both_ways_agree(node_play, controller_alone):
    first, second = node_play[0], controller_alone[0]
    assert first["run"]["id"] != second["run"]["id"]
    assert [(i["host"], i["instance"]) for i in first["fleet"]["instances"]] == \
        [(i["host"], i["instance"]) for i in second["fleet"]["instances"]]
    assert _probe_hosts(first) == _probe_hosts(second)


def test_a_limit_that_leaves_a_node_out_still_validates_every_node(tmp_path, node_hosts, instance_urls):
    report, out = _run(tmp_path, extra=["--limit", "%s,localhost" % node_hosts[0]])
    _check_report(report, node_hosts, instance_urls)
    assert "not in this play (--limit?)" in out
    # the node play did nothing; the controller read every node itself, also the one left out
    assert _ran_on(out, DIAGNOSE_TASK) == sorted("localhost -> " + h for h in node_hosts)


def test_a_second_validation_in_the_same_run_makes_its_own(tmp_path, node_hosts, instance_urls):
    report, out = _run(tmp_path, playbook=os.path.join(PLAYBOOKS, "validate_twice.yml"))
    stamped = sorted(glob.glob(str(tmp_path / "validation-2*.json")))
    assert len(stamped) == 2, stamped
    reports = []
    for path in stamped:
        with open(path, encoding="utf-8") as handle:
            reports.append(json.load(handle))
    for each in reports:
        _check_report(each, node_hosts, instance_urls)
    assert reports[0]["run"]["id"] != reports[1]["run"]["id"]
    assert report["run"]["id"] in (reports[0]["run"]["id"], reports[1]["run"]["id"])
    # the first read the nodes on the nodes, the second from the controller
    assert out.count(DIAGNOSE_TASK) == 1 + len(node_hosts), out.count(DIAGNOSE_TASK)
    assert _ran_on(out, DIAGNOSE_TASK) == sorted(node_hosts + ["localhost -> " + h for h in node_hosts])
