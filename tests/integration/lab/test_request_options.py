"""A client request never takes an engine down (issue #35).

The request options clients commonly send, ordinary and wrong, go to one engine directly (with
the engine key) and through the router (its endpoint, CA and client key from conftest's
helpers). Each must get an answer: a 2xx, or a 4xx whose body names the problem; never a 5xx,
never a hang (every call has a timeout). At the end every engine still runs under the same
main PID with the same NRestarts.

Before the fix, the first request for logprobs killed the engine: vLLM's CPU build compiles a
sampler kernel with torch inductor then, and the nodes had no C++ compiler, no Python headers
and no exec-able cache directory (a 500, EngineDeadError, the unit restarted ~90 s later).

Budget: under 90 s on a converged lab: about 35 small requests each way at a few output tokens,
and the first logprobs request on each engine compiles the kernel unless the engine's compile
cache already holds it. Measured: 33 s on a lab converged just then (15 s of compile per engine),
16 s with one engine's cache emptied (7 s of compile), 6 s when both caches hold the kernel.
"""
import json
import os
import re
import time
import urllib.error
import urllib.request

import pytest
import yaml

from labutil import ROOT, docker_exec, http, metric, ssl_context

TIMEOUT = 60  # seconds for one call; the first logprobs call compiles (about 15 s)
LONG_PROMPT_WORDS = 20000  # far over the lab's max_model_len (8192 tokens)


def _vllm_setting(hostvars, host, name):
    """A vllm_* setting of a host: its inventory value, else the role's default."""
    if name in hostvars[host]:
        return hostvars[host][name]
    with open(os.path.join(ROOT, "roles", "vllm", "defaults", "main.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)[name]


@pytest.fixture(scope="module")
def engine(instances, api_key):
    """(base URL, key) of the first lab engine."""
    return instances[0][3], api_key


def _units(instances):
    return [(container, "kvcache-vllm@%s.service" % inst["name"]) for (host, container, inst, url) in instances]


def _states(instances):
    return {"%s %s" % unit: _unit_state(*unit) for unit in _units(instances)}


def _unit_state(container, unit):
    out = docker_exec(container, "systemctl", "show", "-p", "MainPID", "-p", "NRestarts", "-p", "ActiveState",
                      unit, timeout=30).stdout
    return dict(line.split("=", 1) for line in out.split())


@pytest.fixture(scope="module")
def engines_before(instances):
    return _states(instances)


def call(base, path, body, key, ca=None, timeout=TIMEOUT, stream_events=None):
    """POST body (a dict, or bytes as they are) to base+path; (status, text, seconds).

    stream_events: read a streamed answer until [DONE], or close it after that many events.
    Any transport error (refused, reset, timed out) is status 0 with the error as text."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + key})
    context = ssl_context(base, ca)
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            if stream_events is None:
                return resp.status, resp.read().decode(errors="replace"), time.monotonic() - start
            events = []
            while len(events) < stream_events:
                line = resp.readline()
                if not line:
                    break
                line = line.decode(errors="replace").strip()
                if line.startswith("data: "):
                    events.append(line[6:])
                    if line == "data: [DONE]":
                        break
            return resp.status, "\n".join(events), time.monotonic() - start
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace"), time.monotonic() - start
    except (urllib.error.URLError, OSError) as err:
        return 0, "%s: %s" % (type(err).__name__, err), time.monotonic() - start


def cases(model, max_n):
    """(name, path, body, expected, check): expected 'ok' (2xx), a regex a 4xx body must match
    (case-insensitive), or ('ok', regex) for either; check(text) -> problem or None on a 2xx."""
    chat, comp = "/v1/chat/completions", "/v1/completions"
    msgs = [{"role": "user", "content": "tell me about the cache tier"}]

    def has(*keys):
        def check(text):
            doc = json.loads(text)
            for key in keys:
                doc = doc[key]
                if doc in (None, [], {}):
                    return "no %s in the answer" % "/".join(map(str, keys))
            return None
        return check

    def streamed(text):
        events = text.splitlines()
        if events[-1:] != ["[DONE]"]:
            return "the stream did not end with [DONE]"
        if not any(json.loads(e).get("usage") for e in events[:-1]):
            return "no usage in the stream"
        return None

    tool = {"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
    return [
        # the options of the issue
        ("completion logprobs", comp, {"model": model, "prompt": "the cache", "max_tokens": 3, "logprobs": 2},
         "ok", has("choices", 0, "logprobs", "top_logprobs")),
        ("chat logprobs/top_logprobs", chat, {"model": model, "messages": msgs, "max_tokens": 3, "logprobs": True,
                                              "top_logprobs": 2}, "ok", has("choices", 0, "logprobs", "content")),
        ("prompt_logprobs", comp, {"model": model, "prompt": "the cache tier", "max_tokens": 2, "prompt_logprobs": 1},
         "ok", has("choices", 0, "prompt_logprobs")),
        ("n=3", comp, {"model": model, "prompt": "the", "max_tokens": 3, "n": 3, "temperature": 0.8}, "ok",
         lambda text: None if len(json.loads(text)["choices"]) == 3 else "not 3 choices"),
        ("echo", comp, {"model": model, "prompt": "echo this", "max_tokens": 2, "echo": True}, "ok",
         lambda text: None if json.loads(text)["choices"][0]["text"].startswith("echo this") else "prompt not echoed"),
        ("seed/top_k/min_p", chat, {"model": model, "messages": msgs, "max_tokens": 3, "seed": 7, "top_k": 5,
                                    "min_p": 0.1, "temperature": 0.7}, "ok", None),
        ("stop with penalties", chat, {"model": model, "messages": msgs, "max_tokens": 4, "stop": ["the", "."],
                                       "presence_penalty": 0.5, "frequency_penalty": 0.5,
                                       "repetition_penalty": 1.1}, "ok", None),
        ("json_schema response_format", chat, {
            "model": model, "messages": msgs, "max_tokens": 8, "response_format": {
                "type": "json_schema", "json_schema": {"name": "answer", "schema": {
                    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}}, "ok", None),
        ("stream with usage", chat, {"model": model, "messages": msgs, "max_tokens": 3, "stream": True,
                                     "stream_options": {"include_usage": True}}, "ok", streamed),
        ("huge max_tokens (streamed, closed after 3 events)", comp, {
            "model": model, "prompt": "the", "max_tokens": 10 ** 9, "stream": True}, ("ok", r"max_tokens"), None),
        ("max_tokens at the context, streamed, closed after 3 events", comp, {
            "model": model, "prompt": "the", "max_tokens": 8000, "stream": True, "ignore_eos": True}, "ok", None),
        ("bad logit_bias", chat, {"model": model, "messages": msgs, "max_tokens": 2,
                                  "logit_bias": {"999999999": 50, "abc": 1}}, ("ok", r"logit_bias|token"), None),
        # other things clients send
        ("prompt over max_model_len", comp, {"model": model, "prompt": "cache " * LONG_PROMPT_WORDS, "max_tokens": 2},
         r"context length|maximum|too long", None),
        ("unknown model", chat, {"model": "no-such-model", "messages": msgs, "max_tokens": 2},
         r"no-such-model|model", None),
        ("malformed JSON", comp, b'{"model": "x", "prompt": "unterminated', r"json|decode|parse|expect", None),
        ("empty messages", chat, {"model": model, "messages": [], "max_tokens": 2}, ("ok", r"messages|empty"), None),
        ("negative max_tokens", comp, {"model": model, "prompt": "the", "max_tokens": -5}, r"max_tokens", None),
        ("temperature out of range", chat, {"model": model, "messages": msgs, "max_tokens": 2, "temperature": -1},
         r"temperature", None),
        ("temperature of the wrong type", chat, {"model": model, "messages": msgs, "max_tokens": 2,
                                                 "temperature": "hot"}, r"temperature", None),
        ("a very long stop list", chat, {"model": model, "messages": msgs, "max_tokens": 2,
                                         "stop": ["stop%d" % i for i in range(500)]}, ("ok", r"stop"), None),
        ("tools, tool_choice auto", chat, {"model": model, "messages": msgs, "max_tokens": 4, "tools": [tool],
                                           "tool_choice": "auto"}, ("ok", r"tool"), None),
        ("tools, tool_choice named", chat, {"model": model, "messages": msgs, "max_tokens": 4, "tools": [tool],
                                            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
         ("ok", r"tool"), None),
        ("token ids outside the vocabulary", comp, {"model": model, "prompt": [1, 2, 99999999], "max_tokens": 2},
         r"token|vocab|range", None),
        ("empty prompt", comp, {"model": model, "prompt": "", "max_tokens": 2}, ("ok", r"prompt|empty"), None),
        ("a batch of prompts", comp, {"model": model, "prompt": ["one", "two"], "max_tokens": 2}, "ok",
         lambda text: None if len(json.loads(text)["choices"]) == 2 else "not 2 choices"),
        ("top_logprobs over the limit", chat, {"model": model, "messages": msgs, "max_tokens": 2, "logprobs": True,
                                               "top_logprobs": 1000}, r"logprobs", None),
        ("prompt_logprobs over the limit", comp, {"model": model, "prompt": "the", "max_tokens": 2,
                                                  "prompt_logprobs": 1000}, r"logprobs", None),
        ("n over the limit (vllm_max_n)", comp, {"model": model, "prompt": "the", "max_tokens": 1, "n": max_n + 1,
                                                 "temperature": 0.8}, r"\bn\b", None),
        ("a seed of 2**64", comp, {"model": model, "prompt": "the", "max_tokens": 2, "seed": 2 ** 64},
         ("ok", r"seed"), None),
        ("content as parts", chat, {"model": model, "max_tokens": 2, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hello"}]}]}, "ok", None),
        ("an image for a text-only model", chat, {"model": model, "max_tokens": 2, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {
                "url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="}}]}]},
         ("ok", r"image|multimodal|modality|support"), None),
        ("max_completion_tokens", chat, {"model": model, "messages": msgs, "max_completion_tokens": 2}, "ok", None),
        ("suffix", comp, {"model": model, "prompt": "the", "max_tokens": 2, "suffix": "end"}, ("ok", r"suffix"), None),
    ]


def run_cases(base, key, ca, model, max_n):
    """Every case against one endpoint: (report lines, problems)."""
    lines, problems = [], []
    for name, path, body, expected, check in cases(model, max_n):
        stream = 3 if "closed after 3 events" in name else (50 if isinstance(body, dict) and body.get("stream") else None)
        status, text, took = call(base, path, body, key, ca, stream_events=stream)
        lines.append("%-48s %3d %5.1fs %s" % (name, status, took, " ".join(text.split())[:110]))
        ok_allowed = expected == "ok" or isinstance(expected, tuple)
        pattern = expected[1] if isinstance(expected, tuple) else (None if expected == "ok" else expected)
        if 200 <= status < 300 and ok_allowed:
            problem = check(text) if check else None
            if problem:
                problems.append("%s: %s (%s)" % (name, problem, text[:300]))
        elif 400 <= status < 500 and pattern:
            if not re.search(pattern, text, re.IGNORECASE):
                problems.append("%s: %d whose body does not name the problem (/%s/): %s" % (name, status, pattern, text[:300]))
        else:
            problems.append("%s: %s, got %d in %.1f s: %s" % (
                name, "expected 2xx" if expected == "ok" else "expected 2xx or 4xx" if ok_allowed else "expected 4xx",
                status, took, text[:300]))
    return lines, problems


def test_options_to_one_engine_directly(engines_before, engine, hostvars, instances):
    base, key = engine
    model = hostvars[instances[0][0]]["kvcache_served_model_name"]
    lines, problems = run_cases(base, key, None, model, _vllm_setting(hostvars, instances[0][0], "vllm_max_n"))
    print("\n".join(["engine %s:" % base] + lines))
    assert not problems, "\n".join(problems)


def test_options_through_the_router(engines_before, lab_router, hostvars, instances):
    base = lab_router.url
    model = hostvars[instances[0][0]]["kvcache_served_model_name"]
    lines, problems = run_cases(base, lab_router.client_key, lab_router.ca_file, model,
                                max(_vllm_setting(hostvars, host, "vllm_max_n") for (host, c, i, u) in instances))
    print("\n".join(["router %s:" % base] + lines))
    assert not problems, "\n".join(problems)


def test_every_engine_kept_its_process(engines_before, instances):
    # An engine that died on a request answers /health 500 until its API server exits.
    health = {url: http(url + "/health", timeout=10)[0] for (host, container, inst, url) in instances}
    # A client that closed its stream freed its sequence: nothing keeps generating for nobody.
    deadline = time.monotonic() + 20
    while True:
        running = {url: metric(url, "vllm:num_requests_running", {}) for (host, container, inst, url) in instances}
        if not any(running.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    after = _states(instances)
    changed = {unit: (engines_before[unit], after[unit]) for unit in after
               if (after[unit]["MainPID"], after[unit]["NRestarts"])
               != (engines_before[unit]["MainPID"], engines_before[unit]["NRestarts"])}
    assert not changed, "engines restarted during the requests (before, after): %s" % changed
    assert all(state["ActiveState"] == "active" for state in after.values()), after
    assert all(status == 200 for status in health.values()), "engines not healthy: %s" % health
    assert not any(running.values()), "requests still running 20 s after the last answer: %s" % running
