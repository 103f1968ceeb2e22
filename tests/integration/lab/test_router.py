"""The router stage in the lab: one endpoint over every instance, behind its TLS front.

Requests go to the router's lab address (the front, https, verified against the lab CA,
with the client key: the `lab_router` fixture); that they reached both instances is read
from each instance's own request counters, not from the router. The front serves the
client API and GET /health only: the router's worker API and metrics are not on the client
port, the engines' key is not a client key, and nothing but TLS is spoken there.
"""
import json
import socket
import ssl
import urllib.error
import urllib.request

from labutil import container_name, docker_exec, group_hosts, http, metric, router_settings_default, router_workers

SUCCESS = "vllm:request_success_total"
OUTSIDER = "http://172.29.100.99:8000"


def _model(hostvars, instances):
    return hostvars[instances[0][0]]["kvcache_served_model_name"]


def _router(inventory, hostvars):
    return hostvars[group_hosts(inventory, "kvcache_router")[0]]


def test_router_is_healthy(lab_router):
    assert http(lab_router.url + "/health")[0] == 200


def test_requests_through_the_router_reach_every_instance(lab_router, instances, hostvars):
    before = [metric(url, SUCCESS, {}) for (host, container, inst, url) in instances]
    body = {"model": _model(hostvars, instances), "messages": [{"role": "user", "content": "route me"}], "max_tokens": 2}
    rounds = 4 * len(instances)
    for dummy in range(rounds):
        status, text = http(lab_router.url + "/v1/chat/completions", body, key=lab_router.client_key, timeout=120)
        assert status == 200, text[:300]
    after = [metric(url, SUCCESS, {}) for (host, container, inst, url) in instances]
    served = [b - a for a, b in zip(before, after)]
    assert sum(served) >= rounds, "the instances counted %s requests for %d sent" % (served, rounds)
    assert all(count >= 1 for count in served), "some instance got nothing through the router: %s" % served


def test_router_enforces_the_client_key(lab_router, api_key, instances, hostvars):
    body = {"model": _model(hostvars, instances), "messages": [{"role": "user", "content": "no key"}], "max_tokens": 2}
    url = lab_router.url + "/v1/chat/completions"
    assert http(url, body)[0] == 401
    assert http(url, body, key="wrong-" + lab_router.client_key)[0] == 401
    # the engines' key opens the engines only, not the router
    assert http(url, body, key=api_key)[0] == 401
    assert http(lab_router.url + "/v1/models")[0] == 401
    status, text = http(lab_router.url + "/v1/models", key=lab_router.client_key)
    assert status == 200 and json.loads(text)["data"], text[:300]


def test_the_client_key_does_not_open_an_engine(lab_router, instances, hostvars):
    body = {"model": _model(hostvars, instances), "messages": [{"role": "user", "content": "direct"}], "max_tokens": 2}
    assert http(instances[0][3] + "/v1/chat/completions", body, key=lab_router.client_key)[0] == 401


def test_the_front_refuses_the_worker_api_and_everything_else(lab_router, inventory, hostvars, instances):
    """Issue #32: an outsider's POST /add_worker on the client port answered 200 and got client traffic."""
    before = router_workers(inventory, hostvars)
    assert before[0] == 200, before
    for key in (None, lab_router.client_key):
        for path, body in (("/add_worker?url=" + OUTSIDER, {}), ("/remove_worker?url=" + instances[0][3], {}),
                           ("/list_workers", None), ("/metrics", None), ("/invocations", {"prompt": "x"}),
                           ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}), ("/tokenize", {"prompt": "x"}),
                           ("/v1/chat/completions/../../list_workers", None), ("/readiness", None)):
            status = http(lab_router.url + path, body, key=key)[0]
            assert status in (403, 404), "%s (key: %s) answered %s at the front" % (path, bool(key), status)
    # nothing changed behind it
    after = router_workers(inventory, hostvars)
    assert after[0] == 200 and sorted(json.loads(after[1])["urls"]) == sorted(i[3] for i in instances), after
    # /health takes GET only
    assert http(lab_router.url + "/health", {})[0] in (403, 405)


def test_streaming_goes_through_event_by_event(lab_router, instances, hostvars):
    body = {"model": _model(hostvars, instances), "messages": [{"role": "user", "content": "stream to me"}],
            "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(lab_router.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + lab_router.client_key})
    ctx = ssl.create_default_context(cafile=lab_router.ca_file)
    with urllib.request.urlopen(req, timeout=120, context=ctx) as resp:
        assert resp.status == 200
        assert resp.headers.get("Content-Type", "").startswith("text/event-stream"), resp.headers
        events = [line for line in (raw.decode().strip() for raw in resp) if line.startswith("data:")]
    assert events[-1] == "data: [DONE]", events[-3:]
    assert len(events) >= 3, events
    assert any('"usage"' in e and '"completion_tokens"' in e for e in events), events[-3:]


def test_the_client_endpoint_speaks_tls_only(lab_router, inventory, hostvars):
    host = _router(inventory, hostvars)["ansible_host"]
    port = int(lab_router.url.rsplit(":", 1)[1])
    # plain http gets no service: nginx answers 400 to a plain request on its TLS port
    try:
        with urllib.request.urlopen("http://%s:%d/health" % (host, port), timeout=10) as resp:
            status = resp.status
    except urllib.error.HTTPError as err:
        status = err.code
    assert status == 400
    # the certificate does not verify against the system's trust store: it is the lab CA's
    try:
        urllib.request.urlopen(lab_router.url + "/health", timeout=10, context=ssl.create_default_context())
        raise AssertionError("the router's certificate verified without the lab CA")
    except urllib.error.URLError as err:
        assert isinstance(err.reason, ssl.SSLCertVerificationError), err
    # TLS 1.1 is refused, TLS 1.2 and 1.3 are spoken
    for version, accepted in ((ssl.TLSVersion.TLSv1_1, False), (ssl.TLSVersion.TLSv1_2, True), (ssl.TLSVersion.TLSv1_3, True)):
        ctx = ssl.create_default_context(cafile=lab_router.ca_file)
        ctx.minimum_version = ctx.maximum_version = version
        if version == ssl.TLSVersion.TLSv1_1:
            ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        try:
            with socket.create_connection((host, port), timeout=10) as sock, ctx.wrap_socket(sock, server_hostname=host):
                spoken = True
        except (ssl.SSLError, OSError):
            spoken = False
        assert spoken == accepted, version


def test_the_router_listens_on_loopback_behind_the_front(inventory, hostvars, lab_router):
    router = group_hosts(inventory, "kvcache_router")[0]
    container = container_name(hostvars, router)
    listening = docker_exec(container, "ss", "-Hltn").stdout.split("\n")
    local = sorted({line.split()[3] for line in listening if line.strip()})
    address = hostvars[router]["ansible_host"]
    metrics_port = int(hostvars[router].get("router_metrics_port", router_settings_default("router_metrics_port")))
    # on the router's lab address: the front's client port and its metrics port, nothing else
    public = sorted(a for a in local if not a.startswith(("127.", "[::1]")))
    port = lab_router.url.rsplit(":", 1)[1]
    assert public == sorted(["%s:%s" % (address, port), "%s:%s" % (address, metrics_port)]), local
    # the router's metrics: the monitoring host (the lab controller) reads them through the front,
    # any other source gets 403 (the router host's own lab address stands in for one)
    status, text = http("http://%s:%d/metrics" % (address, metrics_port))
    assert status == 200 and "vllm_router" in text, text[:300]
    code = ("import urllib.request, urllib.error\n"
            "try:\n    print(urllib.request.urlopen('http://%s:%d/metrics', timeout=10).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n") % (address, metrics_port)
    assert docker_exec(container, "python3", "-c", code).stdout.strip() == "403"
