"""Stage 8 (routing) pure logic: attribution of a request to an instance and a prefix source,
the repeat-turn ratio, the pass rule per policy and the causes (module_utils/routing.py and
validation_stages.eval_routing). The fixtures are routing_probe results recorded on the lab
(tests/unit/fixtures/routing/: round_robin and cache_aware, two instances, 4 sessions x 4 turns)."""
import copy
import json
import os

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils import routing
from ansible_collections.kvcache.offload.plugins.module_utils.validation_causes import Causes
from ansible_collections.kvcache.offload.plugins.module_utils.validation_stages import _stage, eval_routing

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "routing")
A = "http://172.29.100.11:8000"
B = "http://172.29.100.12:8000"
INSTANCES = [{"host": "lab-node1", "instance": "cpu0", "url": A}, {"host": "lab-node2", "instance": "cpu0", "url": B}]


def load(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        return json.load(handle)


def summary(prompt=0, gpu=0, tier=0):
    if not prompt:
        return {"prompt_tokens": 0.0, "request_success": 0.0,
                "prompt_tokens_by_source": {"local_compute": 0.0, "local_cache_hit": 0.0, "external_kv_transfer": 0.0}}
    return {"prompt_tokens": float(prompt), "request_success": 1.0,
            "prompt_tokens_by_source": {"local_compute": float(prompt - gpu - tier), "local_cache_hit": float(gpu),
                                        "external_kv_transfer": float(tier)}}


def request(session, turn, served, gpu=0, tier=0, ok=True):
    deltas = {A: summary(), B: summary()}
    if served:
        deltas[served] = summary(1600, gpu, tier)
    return {"session": session, "turn": turn, "ok": ok, "status": 200 if ok else 500, "ttft": 0.1, "deltas": deltas,
            "error": None if ok else {"kind": "http", "message": "HTTP 500"}}


def run(policy, requests, backends=None, min_ratio=0.9):
    causes = Causes()
    raw = {"url": "http://172.29.100.20:8001", "router_hosts": ["lab-router"], "policy": policy,
           "implementation": "vllm_router", "min_ratio": min_ratio, "instances": INSTANCES, "answering": INSTANCES,
           "backends": backends, "probe": {"requests": requests, "elapsed": 7.0}}
    stage = eval_routing(_stage("routing", True), raw, causes, {})
    return stage, causes


def test_attribution_names_the_instance_whose_counters_grew_and_the_prefix_source():
    labels = {A: "lab-node1/cpu0", B: "lab-node2/cpu0"}
    got = routing.attribute({A: summary(), B: summary(1600, tier=1536)}, labels)
    assert (got["served_by"], got["served_label"], got["source"], got["tier_tokens"]) == (B, "lab-node2/cpu0", "shared_tier", 1536)
    assert routing.attribute({A: summary(1600, gpu=1536), B: summary()})["source"] == "gpu_prefix_cache"
    assert routing.attribute({A: summary(1600), B: summary()})["source"] == "recomputed"


def test_attribution_refuses_to_guess():
    assert routing.attribute({A: summary(), B: summary()})["problem"] == "unattributed"
    assert routing.attribute({A: summary(1600), B: summary(1600)})["problem"] == "ambiguous"
    assert routing.attribute({A: None, B: summary()})["problem"] == "metrics"


def test_attribution_without_by_source_counters_uses_the_prefix_cache_counters():
    old = {"prompt_tokens": 1600.0, "prefix_cache_hits": 1536.0}
    got = routing.attribute({A: old, B: {"prompt_tokens": 0.0}})
    assert (got["source"], got["gpu_tokens"], got["computed_tokens"]) == ("gpu_prefix_cache", 1536, 64)


def test_recorded_round_robin_run_is_informational_and_shows_the_spread():
    probe = load("probe_round_robin.json")
    stage, causes = run("round_robin", probe["requests"], backends=[{"url": A}, {"url": B}])
    nums = stage["numbers"]
    assert stage["status"] == "pass" and "informational" in stage["reason"]
    assert nums["requests"] == 16 and nums["repeat_turns"] == 12 and nums["unattributed"] == 0
    # Round robin over two instances: turn 1 always lands on the other instance.
    assert nums["first_repeat_holding_ratio"] == 0.0 and nums["blind_expectation_first_repeat"] == 0.5
    assert nums["holding_ratio"] < 0.9
    assert all(len(s["instances_used"]) == 2 for s in stage["details"]["sessions"])
    assert nums["required_ratio"] is None and causes.ids() == []


def test_recorded_cache_aware_run_passes_with_every_repeat_turn_on_the_holding_instance():
    probe = load("probe_cache_aware.json")
    stage, _causes = run("cache_aware", probe["requests"])
    nums = stage["numbers"]
    assert stage["status"] == "pass", stage["reason"]
    assert nums["holding_ratio"] >= 0.9 and nums["required_ratio"] == 0.9
    assert nums["gpu_prefix_cache_turns"] == nums["repeat_turns"]
    assert all(len(s["instances_used"]) == 1 for s in stage["details"]["sessions"])


def test_the_round_robin_spread_fails_a_cache_aware_policy():
    """The same measurements judged as a cache-aware policy: below 90 % fails."""
    probe = load("probe_round_robin.json")
    stage, _causes = run("cache_aware", probe["requests"])
    assert stage["status"] == "fail"
    assert "below the required 90 %" in stage["reason"]


@pytest.mark.parametrize("ratio_needed, status", [(0.6, "pass"), (0.7, "fail")])
def test_the_ratio_threshold_is_the_variable(ratio_needed, status):
    # 3 sessions; session 0's turn 1 goes elsewhere: 2/3 repeat turns of it stay.
    reqs = []
    for sid in range(3):
        reqs.append(request(sid, 0, A))
        reqs.append(request(sid, 1, B if sid == 0 else A, tier=1536 if sid == 0 else 0, gpu=0 if sid == 0 else 1536))
    stage, _causes = run("cache_aware", reqs, min_ratio=ratio_needed)
    assert stage["numbers"]["holding_ratio"] == round(2 / 3.0, 4)
    assert stage["status"] == status


def test_failed_requests_through_the_router_fail_with_their_cause():
    reqs = [request(0, 0, A), request(0, 1, None, ok=False)]
    stage, causes = run("round_robin", reqs)
    assert stage["status"] == "fail" and "1/2 requests through the router failed" in stage["reason"]
    assert "routing_requests_failed" in causes.ids()


def test_a_backend_list_that_differs_from_the_fleet_fails_and_names_both_sides():
    probe = load("probe_cache_aware.json")
    stage, causes = run("cache_aware", probe["requests"], backends=[{"url": A}, {"url": "http://172.29.100.99:8000"}])
    assert stage["status"] == "fail"
    assert causes.get("routing_backends_differ")
    assert stage["details"]["backends_differ"] == {"extra": ["http://172.29.100.99:8000"], "missing": [B]}


def test_the_routers_own_worker_list_is_compared_when_the_play_has_no_router_facts():
    probe = copy.deepcopy(load("probe_cache_aware.json"))
    probe["router_workers"] = [A]
    causes = Causes()
    raw = {"url": "u", "router_hosts": ["r"], "policy": "cache_aware", "min_ratio": 0.9, "instances": INSTANCES,
           "backends": None, "probe": probe}
    stage = eval_routing(_stage("routing", True), raw, causes, {})
    assert stage["status"] == "fail" and stage["details"]["backends_differ"]["missing"] == [B]


def test_a_policy_without_a_rule_is_shown_not_judged():
    probe = load("probe_round_robin.json")
    stage, causes = run("consistent_hash", probe["requests"])
    assert stage["status"] == "pass" and "not judged" in stage["reason"]
    assert causes.get("routing_policy_unjudged")["severity"] == "warning"


def test_unattributed_requests_fail_a_cache_aware_policy():
    reqs = [request(0, 0, A), request(0, 1, None)]
    stage, causes = run("cache_aware", reqs)
    assert stage["status"] == "fail" and "could not be attributed" in stage["reason"]
    assert "routing_unattributed" in causes.ids()


def test_percentile_is_nearest_rank():
    assert routing.percentile([0.1, 0.2, 0.3, 0.4], 50) == 0.2
    assert routing.percentile([0.1, 0.2, 0.3, 0.4], 95) == 0.4
    assert routing.percentile([], 95) is None


def test_the_shuffled_order_keeps_each_sessions_turns_in_order_and_is_seeded():
    from ansible_collections.kvcache.offload.plugins.module_utils.routing_session import turn_order
    order = turn_order(6, 4, "shuffled", "x")
    assert sorted(order) == [(s, t) for s in range(6) for t in range(5)]
    for s in range(6):
        assert [t for sid, t in order if sid == s] == list(range(5))
    assert order == turn_order(6, 4, "shuffled", "x") and order != turn_order(6, 4, "shuffled", "y")
    assert turn_order(2, 1) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_the_markdown_report_has_a_row_per_session():
    from ansible_collections.kvcache.offload.plugins.module_utils.validation_render import render_markdown
    from ansible_collections.kvcache.offload.plugins.module_utils.validation_stages import build_report
    probe = load("probe_round_robin.json")
    raw = {"url": "http://172.29.100.20:8001", "router_hosts": ["lab-router"], "policy": "round_robin",
           "health": {"status": 200}, "a": INSTANCES[0], "implementation": "vllm_router", "min_ratio": 0.9,
           "instances": INSTANCES, "answering": INSTANCES, "backends": None, "probe": probe}
    report = build_report({"id": "r1"}, {}, INSTANCES, [], {"routing": raw},
                          {"selected_stages": ["instances", "routing"], "required_stages": ["routing"]})
    text = render_markdown(report)
    assert "| session | instances used | repeat turns on a holding instance |" in text
    assert "| 0 | lab-node1/cpu0, lab-node2/cpu0 | 2/3 |" in text


def test_a_broken_router_costs_one_request(monkeypatch):
    """run_sessions stops after the first failed request instead of waiting out every timeout."""
    from ansible_collections.kvcache.offload.plugins.module_utils import routing_session
    sent = []

    def fake_round(url, body, **_kw):
        sent.append(url)
        return {"ok": False, "status": None, "ttft": None, "total": 120.0, "usage": None,
                "error": {"kind": "timeout", "message": "timed out"}}

    monkeypatch.setattr(routing_session, "run_round", fake_round)
    monkeypatch.setattr(routing_session, "read_all", lambda urls, *a: dict((u, None) for u in urls))
    run = routing_session.run_sessions("http://r", [A, B], "m", sessions=4, turns=3, prefix_tokens=16)
    assert len(sent) == 1 and len(run["requests"]) == 1
    assert run["stopped"] == "stopped after 1 failed request(s); 15 of 16 not sent"
    stage, causes = run_stage_with_probe(run)
    assert stage["status"] == "fail" and "15 of 16 not sent" in stage["reason"]
    assert "routing_requests_failed" in causes.ids()


def run_stage_with_probe(probe):
    causes = Causes()
    raw = {"url": "http://r", "router_hosts": ["lab-router"], "policy": "round_robin", "min_ratio": 0.9,
           "instances": INSTANCES, "backends": None, "probe": probe}
    return eval_routing(_stage("routing", True), raw, causes, {}), causes
