"""Two cache salts share no KV, through the shared tier too (issue #33 item 3).

vLLM's `cache_salt` request field (a string of at most 128 characters) enters the first KV
block's hash; in multiprocess mode LMCache 0.5.6 also carries it into every L2 object's name
(`<...>@<salt>`), so two salts are two namespaces in the shared tier
(docs/notes/cache-salt.md, docs/security.md "Tenants"). On the lab (multiprocess, fs tier):

1. a new prompt of several chunks with salt A on the first node's engine: its server stores the
   chunks in the tier under names that end in `@<salt A>`;
2. the same prompt with salt B on the second node's engine: no token comes from the tier
   (vLLM's `prompt_tokens_by_source{source="external_kv_transfer"}` does not grow);
3. the same prompt with no salt there: no token from the tier either;
4. the same prompt with salt A there: the prompt's KV comes from the tier (>= one chunk);
5. through the router, a salt vLLM refuses (`a/b`) gets vLLM's 400: the router hands the field
   to the engine unchanged, so a client's salt reaches it.

Wall time: about 20 s (four short requests of ~1000 tokens on CPU engines, one tier write).
"""
import json
import time
import uuid

from labutil import docker_exec, http, metric

SOURCE = "vllm:prompt_tokens_by_source_total"
TIER = "/mnt/kvcache"


def _ask(url, key, model, prompt, salt=None):
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 1, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    status, text = http(url + "/v1/chat/completions", body, key=key, timeout=120)
    assert status == 200, text[:300]
    return json.loads(text)


def _external(url):
    return metric(url, SOURCE, {"source": "external_kv_transfer"})


def _salted_objects(container, salt):
    out = docker_exec(container, "find", TIER, "-maxdepth", "2", "-type", "f", "-name", "*@%s*" % salt, check=False).stdout
    return out.split()


def test_two_salts_share_no_kv_through_the_tier(instances, api_key, hostvars, lab_router):
    (_ha, container_a, _ia, url_a), (_hb, _cb, _ib, url_b) = instances[0], instances[1]
    assert container_a != instances[1][1], "the lab's first two instances must be on two nodes"
    model = hostvars[instances[0][0]]["kvcache_served_model_name"]
    run = uuid.uuid4().hex[:12]
    salt_a, salt_b = "tenant-a-" + run, "tenant-b-" + run
    prompt = "salted run %s " % run + " ".join("paragraph %d of a tenant's private document." % i for i in range(150))

    _ask(url_a, api_key, model, prompt, salt_a)
    deadline = time.monotonic() + 60
    while not _salted_objects(container_a, salt_a) and time.monotonic() < deadline:
        time.sleep(0.5)
    stored = _salted_objects(container_a, salt_a)
    assert stored, "no object named ...@%s reached the shared tier in 60 s" % salt_a

    before = _external(url_b)
    _ask(url_b, api_key, model, prompt, salt_b)
    assert _external(url_b) - before == 0, "salt B loaded tenant A's KV from the tier"

    before = _external(url_b)
    _ask(url_b, api_key, model, prompt)
    assert _external(url_b) - before == 0, "a request without a salt loaded tenant A's KV from the tier"

    before = _external(url_b)
    _ask(url_b, api_key, model, prompt, salt_a)
    assert _external(url_b) - before >= 256, "salt A on the other node did not load its KV from the tier"

    # the router passes the field through: a salt vLLM refuses comes back as vLLM's 400
    status, text = http(lab_router.url + "/v1/chat/completions",
                        {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1,
                         "cache_salt": "a/b"}, key=lab_router.client_key, ca=lab_router.ca_file, timeout=120)
    assert status == 400 and "cache_salt" in text, (status, text[:300])
