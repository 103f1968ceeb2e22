"""The router stage in the lab: one endpoint over every instance, the key enforced end to end.

Requests go to the router's lab address; that they reached both instances is read from
each instance's own request counters, not from the router.
"""
from labutil import http, metric

SUCCESS = "vllm:request_success_total"


def test_router_is_healthy(router_url):
    assert http(router_url + "/health")[0] == 200


def test_requests_through_the_router_reach_every_instance(router_url, instances, api_key, hostvars):
    model = hostvars[instances[0][0]]["kvcache_served_model_name"]
    before = [metric(url, SUCCESS, {}) for (host, container, inst, url) in instances]
    body = {"model": model, "messages": [{"role": "user", "content": "route me"}], "max_tokens": 2}
    rounds = 4 * len(instances)
    for dummy in range(rounds):
        status, text = http(router_url + "/v1/chat/completions", body, key=api_key, timeout=120)
        assert status == 200, text[:300]
    after = [metric(url, SUCCESS, {}) for (host, container, inst, url) in instances]
    served = [b - a for a, b in zip(before, after)]
    assert sum(served) >= rounds, "the instances counted %s requests for %d sent" % (served, rounds)
    assert all(count >= 1 for count in served), "some instance got nothing through the router: %s" % served


def test_router_enforces_the_key_end_to_end(router_url, api_key, instances, hostvars):
    model = hostvars[instances[0][0]]["kvcache_served_model_name"]
    body = {"model": model, "messages": [{"role": "user", "content": "no key"}], "max_tokens": 2}
    assert http(router_url + "/v1/chat/completions", body)[0] == 401
    assert http(router_url + "/v1/chat/completions", body, key="wrong-" + api_key)[0] == 401
