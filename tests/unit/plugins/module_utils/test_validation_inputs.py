"""validation_inputs: the validation role's registered results -> what the stage judges read.

The role hands validation_report every node's node-play result (a mapping node -> result,
tagged with the run id) and the controller's stages 2-5 as registered; the module decides
which nodes were validated, gathers stages 1 and 6 from the nodes and says why a stage
could not run. These tests give the role's shape and check the report it makes.
"""
from __future__ import annotations

import copy

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils.validation_inputs import (
    NO_INSTANCE,
    NOT_SELECTED,
    node_coverage,
    stage_inputs,
)
from ansible_collections.kvcache.offload.plugins.module_utils.validation_stages import STAGE_IDS

from validation_helpers import A, B, build, good_inputs, stage

RUN = "20261129T233000Z-000001"


def role_inputs():
    """good_inputs() as the role passes them: node results by host, controller stages 2-5 only."""
    raw = good_inputs()
    one = raw["stages"]["instances"]
    probe6 = raw["stages"]["lmcache_probe"]
    results = {}
    for index, node in enumerate(raw["nodes"]):
        host = node["host"]
        result = dict(node, run_id=RUN, instances=[one["instances"][index]], health=[one["health"][index]],
                      authed=[dict(one["authed"][index], __validation_inst=one["instances"][index])],
                      unauthed=[one["unauthed"][index]],
                      lmcache_store={"skipped": True, "false_condition": "..."}, lmcache_load={"skipped": True})
        if host == probe6["store"]["host"]:
            result["lmcache_store"] = probe6["store"]["result"]
        else:
            result["lmcache_load"] = dict(probe6["load_results"][0])
        results[host] = result
    stages = {key: raw["stages"][key] for key in ("tier_write", "local_hit", "cross_instance")}
    stages["router"] = {"a": A, "url": "", "router_hosts": [], "health": None, "probe": None, "metrics": None}
    settings = dict(raw["settings"], selected_stages=list(STAGE_IDS), node_group="kvcache_nodes",
                    router_group="kvcache_router", router_required=False)
    run = dict(raw["run"], nodes_in_play=sorted(results))
    return dict(raw, run=run, nodes=results, stages=stages, settings=settings)


def shape(report):
    return [(s["id"], s["status"], sorted(s["numbers"]), s["numbers"]) for s in report["stages"]]


def test_the_role_shape_gives_the_report_the_raw_shape_gives():
    from_role = build(role_inputs())
    from_raw = build(good_inputs())
    assert shape(from_role) == shape(from_raw)
    assert [s["reason"] for s in from_role["stages"]] == [s["reason"] for s in from_raw["stages"]]
    assert from_role["result"] == "pass"
    assert [(n["host"], n["validated"], n["reason"]) for n in from_role["fleet"]["nodes"]] == [
        ("lab-node1", True, ""), ("lab-node2", True, "")]
    rows = stage(from_role, "lmcache_probe")["details"]["results"]
    assert [(r["host"], r["action"], r["ok"]) for r in rows] == [("lab-node1", "store", True), ("lab-node2", "load", True)]


def test_a_node_left_out_of_the_play_is_named_and_its_instances_are_not_judged():
    inputs = role_inputs()
    inputs["nodes"]["lab-node2"] = {}
    inputs["run"]["nodes_in_play"] = ["lab-node1"]
    report = build(inputs)
    row = [n for n in report["fleet"]["nodes"] if n["host"] == "lab-node2"][0]
    assert row["validated"] is False and "not in the node play" in row["reason"]
    cause = [c for c in report["causes"] if c["id"] == "node_left_out"][0]
    assert cause["hosts"] == ["lab-node2"] and cause["severity"] == "warning"
    assert stage(report, "instances")["status"] == "pass"
    assert stage(report, "instances")["numbers"]["instances"] == 1
    assert stage(report, "lmcache_probe")["status"] == "skipped"
    assert "fewer than two validated nodes" in stage(report, "lmcache_probe")["reason"]
    assert any("not validated: lab-node2" in line for line in __import__(
        "ansible_collections.kvcache.offload.plugins.module_utils.validation_render",
        fromlist=["summary_lines"]).summary_lines(report))


@pytest.mark.parametrize("result", [{}, "older run"])
def test_a_node_in_the_play_without_a_result_of_this_run_fails_stage_1(result):
    inputs = role_inputs()
    if result == "older run":
        inputs["nodes"]["lab-node2"]["run_id"] = "20261129T000000Z-999999"
    else:
        inputs["nodes"]["lab-node2"] = {}
    report = build(inputs)
    one = stage(report, "instances")
    assert one["status"] == "fail" and "lab-node2: not validated" in one["reason"]
    assert "node_not_validated" in one["causes"]
    assert report["result"] == "fail"


def test_node_coverage_without_nodes_in_play_says_the_play_did_not_finish():
    validated, missing = node_coverage({"id": "r1"}, {"n1": {"run_id": "r1", "host": "n1"}, "n2": {}})
    assert [h for h, _r in validated] == ["n1"]
    assert missing == [{"host": "n2", "validated": False, "left_out": False,
                        "reason": "the node play did not finish on it (unreachable, or a task failed)"}]


def test_a_list_of_node_results_is_taken_as_validated():
    validated, missing = node_coverage({"id": "r1"}, [{"host": "n1", "env_slurps": []}])
    assert [h for h, _r in validated] == ["n1"] and missing == []


def test_no_answering_instance_skips_stages_2_to_5_with_the_reason():
    inputs = role_inputs()
    for key in ("tier_write", "local_hit", "cross_instance", "router"):
        inputs["stages"][key]["a"] = None
    inputs["stages"]["router"]["router_hosts"] = ["lab-router"]
    inputs["stages"]["router"]["health"] = {"status": 200}
    report = build(inputs)
    for key in ("tier_write", "local_hit", "cross_instance", "router"):
        assert (stage(report, key)["status"], stage(report, key)["reason"]) == ("skipped", NO_INSTANCE), key


def test_one_answering_instance_skips_stage_4():
    inputs = role_inputs()
    inputs["stages"]["cross_instance"]["b"] = None
    assert stage(build(inputs), "cross_instance")["reason"] == "fewer than two instances answered in stage 1"


def test_router_skips_name_the_group_and_the_health_answer():
    inputs = role_inputs()
    assert stage(build(inputs), "router")["reason"] == "group kvcache_router has no hosts"
    inputs["stages"]["router"].update(router_hosts=["lab-router"], url="http://r:8001",
                                      health={"status": -1, "msg": "Connection refused"})
    router = stage(build(inputs), "router")
    assert router["status"] == "skipped"
    assert router["reason"] == "the router at http://r:8001 does not answer /health (-1: Connection refused)"


def test_router_required_fails_instead_of_skipping():
    inputs = role_inputs()
    inputs["settings"]["router_required"] = True
    inputs["stages"]["router"].update(router_hosts=["lab-router"], url="http://r:8001", health={"status": 503, "msg": ""})
    router = stage(build(inputs), "router")
    assert router["status"] == "fail" and "does not answer /health (503" in router["reason"]


def test_stages_not_selected_are_reported_so_whatever_ran():
    inputs = role_inputs()
    inputs["settings"]["selected_stages"] = ["lmcache_probe"]
    report = build(inputs)
    assert [(s["id"], s["status"]) for s in report["stages"]] == [
        ("instances", "pass"), ("tier_write", "skipped"), ("local_hit", "skipped"), ("cross_instance", "skipped"),
        ("router", "skipped"), ("lmcache_probe", "pass"), ("gds_path", "skipped"), ("routing", "skipped")]
    assert {stage(report, k)["reason"] for k in ("tier_write", "local_hit", "cross_instance", "router", "gds_path",
                                                 "routing")} == {NOT_SELECTED}


def test_multiprocess_mode_runs_stage_6_from_the_nodes_too():
    inputs = role_inputs()
    inputs["expected"]["lmcache_mode"] = "multiprocess"
    assert stage(build(inputs), "lmcache_probe")["status"] == "pass"


def test_a_store_that_ran_nowhere_fails_stage_6_saying_so():
    inputs = role_inputs()
    inputs["nodes"]["lab-node1"]["lmcache_store"] = {"skipped": True}
    six = stage(build(inputs), "lmcache_probe")
    assert six["status"] == "fail" and "no node stored the probe chunk" in six["reason"]


def test_stage_inputs_leaves_its_arguments_alone():
    inputs = role_inputs()
    before = copy.deepcopy(inputs)
    stage_inputs(inputs["run"], inputs["nodes"], inputs["stages"], inputs["settings"], inputs["expected"], STAGE_IDS)
    assert inputs == before
    assert B["host"] == "lab-node2"
