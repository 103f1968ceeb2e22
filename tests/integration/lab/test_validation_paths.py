"""The one way the validation reaches the nodes, against the running lab.

playbooks/validate.yml: a play on the node group runs the node-side part (settings read for
the cause analysis, stage 1's requests to each node's instances, stage 6's LMCache probe) on
every node at once; the controller play only reads the results and judges. A node the node
play did not cover (--limit) is reported "not validated" with the reason, never probed a
second way; two validations in one playbook run give two independent reports; the
controller part alone refuses to judge. Stages 2-5 are left out to keep the runs short
(test_runner.py runs all of them through site.yml and compares the report's shape).
"""
import glob
import json
import os
import re

import pytest

from faultutil import run_validate, stage, wait_healthy
from labutil import ROOT, engine_url

STAGES = ["-e", '{"validation_stages": ["instances", "lmcache_probe"]}']
PLAYBOOKS = os.path.join(ROOT, "tests", "integration", "lab", "playbooks")
TASK = "TASK [kvcache.offload.validation : %s]"
DIAGNOSE_TASK = TASK % "Diagnose | Instance env files on the node"
PROBE_TASK = {"store": TASK % "Nodes | Stage 6, store a synthetic chunk through LMCache",
              "load": TASK % "Nodes | Stage 6, load it bit-exact"}


@pytest.fixture(scope="module")
def instance_urls(hostvars, node_hosts):
    urls = [engine_url(hostvars, h, i["port"])
            for h in node_hosts for i in hostvars[h]["vllm_instances"]]
    if not wait_healthy(urls, timeout=60):
        pytest.skip("the lab's instances do not answer /health (is the lab up?)")
    return urls


@pytest.fixture(scope="module")
def node_play(tmp_path_factory, instance_urls):  # pylint: disable=unused-argument
    return _run(tmp_path_factory.mktemp("node-play"))


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
    assert _ran_on(out, PROBE_TASK["store"]) == [store]
    assert _ran_on(out, PROBE_TASK["load"]) == loads == sorted(set(node_hosts) - {store})


def test_the_controller_part_alone_refuses_to_judge(tmp_path):
    rc, report, out = run_validate(str(tmp_path), extra=STAGES, playbook=os.path.join(PLAYBOOKS, "validate_controller_only.yml"))
    assert rc != 0 and report is None, out
    assert "The node part of the validation did not run before this one on localhost" in out, out
    assert "tasks_from: nodes" in out, out


def test_a_limit_that_leaves_a_node_out_reports_it_not_validated(tmp_path, node_hosts, instance_urls):
    left_out = node_hosts[-1]
    report, out = _run(tmp_path, extra=["--limit", "%s,localhost" % node_hosts[0]])
    rows = {n["host"]: n for n in report["fleet"]["nodes"]}
    assert sorted(rows) == sorted(node_hosts)
    assert rows[left_out]["validated"] is False
    assert "not in the node play" in rows[left_out]["reason"], rows[left_out]
    assert rows[node_hosts[0]]["validated"] is True and rows[node_hosts[0]]["lmcache"], rows[node_hosts[0]]
    found = [c for c in report["causes"] if c["id"] == "node_left_out"]
    assert found and found[0]["hosts"] == [left_out], report["causes"]
    assert "not validated: %s (not in the node play" % left_out in out  # the summary at the end of the play
    # its instances are not probed a second way: stage 1 judged the other node's only
    assert stage(report, "instances")["numbers"]["instances"] == len(
        [i for i in report["fleet"]["endpoints"] if i["host"] != left_out])
    assert _ran_on(out, DIAGNOSE_TASK) == [node_hosts[0]]
    assert "localhost -> %s" % left_out not in out
    # one validated node: nothing to load on another node
    assert stage(report, "lmcache_probe")["status"] == "skipped", stage(report, "lmcache_probe")
    assert "fewer than two" in stage(report, "lmcache_probe")["reason"]


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
    assert report["run"]["id"] == reports[1]["run"]["id"] or report["run"]["id"] == reports[0]["run"]["id"]
    # both read the nodes on the nodes themselves, once each
    assert out.count(DIAGNOSE_TASK) == 2, out.count(DIAGNOSE_TASK)
    assert _ran_on(out, DIAGNOSE_TASK) == sorted(node_hosts)
    assert "ok: [localhost -> " not in out, "the controller reached a node itself"
