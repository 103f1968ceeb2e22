"""The router's TLS front (issue #32 items 1, 3, 4): its preflight refusals, and the nginx
configuration and key map the role renders, with Ansible's own templating (the harness of
test_router_policies.py, from the role files themselves; KVCACHE_TEST_ROLES_DIR runs it on
another copy of roles/).

The key map's regular expressions are evaluated here with Python's re, which agrees with
PCRE (nginx's engine) on the constructs the role writes (anchors, escaped literals, a
character class, +). The lab test tests/integration/lab/test_router.py runs the real nginx.
"""
import os
import re

import pytest

from test_router_policies import CLIENT_KEY, ENGINE_KEY, ROLES, router_checks, router_layers, run

ROUTER_TEMPLATES = os.path.join(ROLES, "router", "templates")


def _template(name):
    with open(os.path.join(ROUTER_TEMPLATES, name), encoding="utf-8") as handle:
        return handle.read()


FRONT_RUN = {"ansible_managed": "managed", "router_implementation": "vllm_router",
             "__router_front_user": "www-data",
             "groups": {"kvcache_nodes": ["gpu-a01", "gpu-a02"], "kvcache_router": ["router-1"],
                        "kvcache_monitoring": ["mon-1", "localhost"]}}


@pytest.fixture(scope="module")
def rendered():
    layers = router_layers()
    layers[-1]["hostvars"].update({"mon-1": {"ansible_host": "10.0.0.9"}, "localhost": {}})
    layers.append(FRONT_RUN)
    cases = [{}, {"router_client_api_keys": ["a.b+c/d=e~f-g_h" + "x" * 32, CLIENT_KEY]}]
    return run(layers, cases, exprs={"conf": _template("front-nginx.conf.j2"),
                                     "keys": _template("front-keys.conf.j2"),
                                     "unit": _template("router-front.service.j2")})


def _locations(conf):
    return re.findall(r"^\s*location (= )?(\S+) \{", conf, re.M)


def test_the_front_forwards_only_the_client_api_and_health(rendered):
    conf = rendered[0]["conf"]
    client, metrics = conf.split("\n    server {")[1:]
    assert _locations(client) == [("= ", "/health")] + [("= ", p) for p in [
        "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/embeddings", "/v1/responses", "/v1/score",
        "/v1/rerank", "/v1/audio/transcriptions", "/v1/audio/translations"]] + [("", "/")]
    # everything else is 404; the API needs a client key and gets the engines' key instead
    assert re.search(r"location / \{\s*return 404 ", client)
    assert client.count("if ($kvcache_client_ok != 1)") == 9
    assert client.count("proxy_set_header Authorization $kvcache_engine_authorization;") == 9
    # /health forwards no Authorization at all, and takes GET only
    health = client.split("location = /health {")[1].split("}\n")[0:2]
    assert 'proxy_set_header Authorization "";' in "".join(health) and "limit_except GET" in "".join(health)
    assert "listen 10.0.0.5:8001 ssl;" in client
    assert "ssl_protocols TLSv1.2 TLSv1.3;" in client
    assert "proxy_pass http://127.0.0.1:18101;" in client
    assert "proxy_buffering off;" in conf and "client_max_body_size 16m;" in conf
    # the metrics listener: loopback, the monitoring host with an address, nobody else
    assert "listen 10.0.0.5:29000;" in metrics and "listen 127.0.0.1:29000;" in metrics
    assert _locations(metrics) == [("= ", "/metrics"), ("", "/")]
    allows = re.findall(r"allow (\S+);", metrics)
    assert allows == ["127.0.0.1", "::1", "10.0.0.9"], allows
    assert "deny all;" in metrics and "proxy_pass http://127.0.0.1:29101/metrics;" in metrics


def test_no_key_is_in_the_configuration_or_the_unit(rendered):
    for result in rendered:
        for name in ("conf", "unit"):
            assert CLIENT_KEY not in result[name] and ENGINE_KEY not in result[name], name
        assert "include /etc/kvcache-router/front/keys.conf;" in result["conf"]


def _client_ok(keys_conf, header):
    """$kvcache_client_ok as nginx's map would compute it from the rendered map block."""
    block = keys_conf.split("map $http_authorization $kvcache_client_ok {")[1].split("}")[0]
    for source, value in re.findall(r'^\s*"~(.*)" (\d);$', block, re.M):
        if re.search(source.replace("\\\\", "\\"), header):
            return value
    return "0"


@pytest.mark.parametrize("header, ok", [
    ("Bearer " + CLIENT_KEY, "1"),
    ("bearer " + CLIENT_KEY, "1"),
    ("BEARER  " + CLIENT_KEY, "1"),
    ("Bearer " + CLIENT_KEY + "x", "0"),
    ("Bearer x" + CLIENT_KEY, "0"),
    ("Bearer " + CLIENT_KEY.upper(), "0"),  # keys are matched case-sensitively
    (CLIENT_KEY, "0"),
    ("Bearer " + ENGINE_KEY, "0"),
    ("Basic " + CLIENT_KEY, "0"),
    ("", "0"),
    ("Bearer " + "a.b+c/d=e~f-g_h" + "x" * 32, "1"),
    ("Bearer " + "aXb+c/d=e~f-g_h" + "x" * 32, "0"),  # '.' is a literal, not any character
])
def test_the_key_map_accepts_exactly_the_client_keys(rendered, header, ok):
    assert _client_ok(rendered[1]["keys"], header) == ok


def test_the_engines_key_replaces_the_clients(rendered):
    keys = rendered[0]["keys"]
    assert 'default "Bearer %s";' % ENGINE_KEY in keys
    assert _client_ok(keys, "Bearer " + CLIENT_KEY) == "1"


@pytest.fixture(scope="module")
def rendered_ps():
    layers = router_layers()
    layers.append(dict(FRONT_RUN, router_implementation="production_stack"))
    results = run(layers, [{}, {"__router_front_draining": ["http://10.0.0.12:8000"]}],
                  exprs={"conf": _template("front-nginx.conf.j2"), "env": _template("router.env.j2"),
                         "drain": _template("front-drain.conf.j2")})
    return dict(results[0], drain_one=results[1]["drain"])


def test_the_drain_list_fails_only_the_routers_keyless_health_checks_of_listed_engines(rendered_ps):
    """playbooks/tasks/router_drain.yml lists a restarting node's engines: the gateway answers
    503 to a keyless POST (production-stack's health check) for them, and forwards the rest."""
    conf = rendered_ps["conf"]
    assert "include /etc/kvcache-router/front/drain.conf;" in conf
    gateways = conf.split("\n    server {")[3:]
    for gateway, engine in zip(gateways, ("http://10.0.0.11:8000", "http://10.0.0.12:8000")):
        assert 'set $kvcache_backend "%s";' % engine in gateway
        assert re.search(r"if \(\$kvcache_drain_refuse\) \{\s*return 503 ", gateway), gateway
    empty, one = rendered_ps["drain"], rendered_ps["drain_one"]
    assert 'map "$kvcache_backend|$request_method|$http_authorization" $kvcache_drain_refuse {' in empty
    assert re.findall(r'^\s*"(.*)" 1;$', empty, re.M) == []
    # the key a matched string would need: backend URL, POST, and no Authorization at all
    assert re.findall(r'^\s*"(.*)" 1;$', one, re.M) == ["http://10.0.0.12:8000|POST|"]


def test_production_stack_reaches_each_engine_through_the_key_gateway(rendered_ps):
    """production-stack 0.1.12 sends its backend health checks with no key (its
    utils.is_model_healthy); the front's key gateway gives each engine a loopback port that
    adds the engines' key, and the router's --static-backends are those ports."""
    conf = rendered_ps["conf"]
    gateways = conf.split("\n    server {")[3:]
    assert len(gateways) == 2, conf
    for port, (gateway, engine) in zip((18200, 18201), zip(gateways, ("http://10.0.0.11:8000", "http://10.0.0.12:8000"))):
        assert "listen 127.0.0.1:%d;" % port in gateway
        assert len(re.findall(r"^\s*listen ", gateway, re.M)) == 1, gateway
        assert "proxy_set_header Authorization $kvcache_engine_authorization;" in gateway
        assert "proxy_pass %s;" % engine in gateway
    # the router itself holds no key
    assert ENGINE_KEY not in rendered_ps["env"] and "API_KEY" not in rendered_ps["env"]


def test_vllm_router_has_no_key_gateway(rendered):
    assert len(rendered[0]["conf"].split("\n    server {")) == 3
    assert "18200" not in rendered[0]["conf"] and "drain.conf" not in rendered[0]["conf"]


# --- preflight refusals (tasks/checks.yml) --------------------------------------------------

CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
REFUSALS = {
    "no certificate": ({"router_tls_cert": ""}, "router_tls_cert is not set"),
    "no key": ({"router_tls_key": ""}, "router_tls_key is not set"),
    "a key that is a certificate": ({"router_tls_key": CERT}, "router_tls_key is PEM text without an unencrypted private key"),
    "an encrypted key": ({"router_tls_key": "-----BEGIN ENCRYPTED PRIVATE KEY-----\nx\n-----END ENCRYPTED PRIVATE KEY-----"},
                         "router_tls_key is PEM text without an unencrypted private key"),
    "a certificate file that is not there": ({"router_tls_cert": "/nonexistent/router.crt"},
                                             "router_tls_cert is '/nonexistent/router.crt', not a readable file on the controller"),
    "no client key": ({"router_client_api_keys": []}, "router_client_api_keys is empty"),
    "a short client key": ({"router_client_api_keys": [CLIENT_KEY, "s" * 31]}, "positions 1, counting from 0"),
    "a client key with a quote": ({"router_client_api_keys": ['"' + "q" * 40]}, "positions 0, counting from 0"),
    "a client key with a space": ({"router_client_api_keys": ["q" * 20 + " " + "q" * 20]}, "positions 0, counting from 0"),
    "the engines' key as a client key": ({"router_client_api_keys": [ENGINE_KEY]}, "contains the engines' key"),
    "an engines' key with a dollar": ({"kvcache_api_key": "$" + "e" * 40}, "router_api_key (by default kvcache_api_key) has characters"),
    "the internal port on the client port": ({"router_internal_port": 8001}, "must differ"),
    "a metrics source that is no address": ({"router_metrics_allowed_sources": ["monitoring.example.com"]}, "router_metrics_allowed_sources"),
    "an API path that is no path": ({"router_front_api_paths": ["/v1/chat/completions", "v1 models"]}, "router_front_api_paths"),
    "production_stack on a bridge network": ({"router_implementation": "production_stack", "router_container_network": "kvcache"},
                                             "router_container_network is 'kvcache'"),
    "an image digest that is no digest": ({"router_implementation": "production_stack", "router_image_digest": "sha256:ABC"},
                                          "router_image_digest is 'sha256:ABC', not a digest"),
    "a key gateway port on the router's own": ({"router_implementation": "production_stack", "router_engine_gateway_port_base": 18100},
                                               "must not hold the router's own ports [18101]"),
}


@pytest.fixture(scope="module")
def refusals():
    names = sorted(REFUSALS)
    results = run(router_layers(), [REFUSALS[name][0] for name in names] + [{}], checks=router_checks())
    return dict(zip(names + ["good"], (r["refusals"] for r in results)))


def test_good_front_inputs_are_accepted(refusals):
    assert refusals["good"] == []


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_preflight_refuses_what_the_front_cannot_use(refusals, name):
    got = refusals[name]
    assert len(got) == 1, got
    msg = got[0]["msg"]
    for word in ["Host router-1:", "Fix:", REFUSALS[name][1]]:
        assert word in msg, (word, msg)
    for secret in (CLIENT_KEY, ENGINE_KEY):
        assert secret not in msg
