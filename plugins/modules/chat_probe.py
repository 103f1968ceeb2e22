#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: chat_probe
short_description: Send streaming chat completions with a long shared prefix and time them
version_added: 0.1.0
description:
  - Sends O(rounds) streaming OpenAI chat completion requests (C(stream=true)) to one base URL,
    a vLLM instance or the router.
  - Every request carries the same long, generated prefix (deterministic from O(seed) and O(prefix_tokens),
    so every host builds the identical text) plus a suffix that differs per round.
  - Returns per round the time to first token, the total time, the HTTP status, the number of cached
    prompt tokens when the server reports them, and the backend that served the request when the
    server names it in a response header.
  - A failure (HTTP status other than O(expect_status), connection refused, DNS, TLS, timeout, a broken
    stream) is returned as a structured RV(error) and fails the task, unless O(expect_status) says that
    status is expected (for example C(401) to prove that a request without key is refused).
  - Every request is bounded by O(timeout); a hanging server fails the task, it never hangs the run.
author:
  - kvcache.offload developers (!UNKNOWN)
requirements:
  - Python standard library only.
options:
  base_url:
    description:
      - Base URL of the OpenAI-compatible server, for example V(http://10.0.0.11:8000) or the router's URL.
      - O(path) is appended.
    type: str
    required: true
  path:
    description:
      - Request path appended to O(base_url).
    type: str
    default: /v1/chat/completions
  model:
    description:
      - Model name as the server serves it (vLLM C(--served-model-name), or the model path if none is set).
    type: str
    required: true
  rounds:
    description:
      - Number of requests to send, one after another.
    type: int
    default: 3
  prefix_tokens:
    description:
      - Length of the shared prefix, in tokens (estimated as 4 characters per token).
      - Make it several LMCache chunks long (chunk_size defaults to 256 tokens) and shorter than the
        server's C(--max-model-len).
    type: int
    default: 2048
  seed:
    description:
      - Seed of the shared prefix. The same seed gives the same prefix on every host; a new seed gives
        a prefix nobody has cached yet.
    type: str
    default: "0"
  run_id:
    description:
      - Text mixed into every suffix so suffixes differ between runs as well as between rounds.
    type: str
    default: ""
  max_tokens:
    description:
      - Tokens to generate per request.
    type: int
    default: 8
  temperature:
    description:
      - Sampling temperature.
    type: float
    default: 0.0
  pause:
    description:
      - Seconds to wait between rounds (lets an asynchronous store to the shared tier land first).
    type: float
    default: 0.0
  timeout:
    description:
      - Seconds one request may take in total (connect, prefill and the whole stream). Also the socket timeout.
    default: 60.0
  expect_status:
    description:
      - HTTP status every round must return for the task to succeed.
      - With V(200) a round must also deliver a complete stream ending in C([DONE]).
    type: int
    default: 200
  backend_headers:
    description:
      - Response headers that name the backend that served the request, first match wins.
    type: list
    elements: str
    default: [x-backend-url, x-served-by, x-upstream, x-vllm-backend, x-server]
notes:
  - Check mode sends no request (a probe writes KV cache into the tiers); it returns the prefix it would use.
  - The request asks for C(stream_options.include_usage); vLLM reports C(prompt_tokens_details.cached_tokens)
    only when started with C(--enable-prompt-tokens-details).
extends_documentation_fragment:
  - kvcache.offload.http_client
  - kvcache.offload.read_only
"""

EXAMPLES = r"""
- name: Three rounds against one instance, same prefix
  kvcache.offload.chat_probe:
    base_url: "http://{{ inventory_hostname }}:8000"
    api_key: "{{ vllm_api_key }}"
    model: "{{ kvcache_served_model_name }}"
    seed: "validate-{{ ansible_date_time.epoch }}"
    prefix_tokens: 2048
    rounds: 3
    timeout: 120
  register: probe

- name: The same prefix through the router
  kvcache.offload.chat_probe:
    base_url: "http://router.example:8080"
    api_key: "{{ vllm_api_key }}"
    model: "{{ kvcache_served_model_name }}"
    seed: "{{ probe.prefix.seed }}"
    rounds: 2
  delegate_to: localhost

- name: A request without key is refused
  kvcache.offload.chat_probe:
    base_url: "http://{{ inventory_hostname }}:8000"
    model: "{{ kvcache_served_model_name }}"
    rounds: 1
    expect_status: 401
"""

RETURN = r"""
url:
  description: The URL the requests were sent to.
  returned: always
  type: str
  sample: http://10.0.0.11:8000/v1/chat/completions
status:
  description: HTTP status of the last round, or null when no HTTP answer came.
  returned: always
  type: int
  sample: 200
prefix:
  description: The shared prefix that was (or in check mode would be) sent.
  returned: always
  type: dict
  contains:
    seed:
      description: The seed.
      type: str
    target_tokens:
      description: The requested length in tokens.
      type: int
    chars:
      description: Length in characters.
      type: int
    approx_tokens:
      description: Estimated length in tokens.
      type: int
    sha256:
      description: SHA-256 of the prefix text; equal on every host for the same seed and length.
      type: str
rounds:
  description: One entry per request, in order.
  returned: always
  type: list
  elements: dict
  contains:
    round:
      description: Round index, from 0.
      type: int
    status:
      description: HTTP status, null when the request got no HTTP answer.
      type: int
    ok:
      description: The round returned 200 and a complete stream.
      type: bool
    ttft:
      description: Seconds from sending to the first generated text.
      type: float
    first_event:
      description: Seconds from sending to the first SSE event.
      type: float
    total:
      description: Seconds from sending to the end of the stream (or the failure).
      type: float
    events:
      description: Number of SSE data events before C([DONE]).
      type: int
    text_chars:
      description: Characters of generated text received.
      type: int
    finish_reason:
      description: The finish reason of the last choice.
      type: str
    usage:
      description: The usage object of the final chunk, when the server sends one.
      type: dict
    cached_tokens:
      description: C(usage.prompt_tokens_details.cached_tokens) when reported.
      type: int
    backend:
      description: The response header naming the backend (C(header), C(value)), null when none of O(backend_headers) came back.
      type: dict
    response_id:
      description: The completion id from the stream.
      type: str
    error:
      description:
        - Null on success. Otherwise C(kind) (http, connection, dns, timeout, tls, protocol, invalid),
          C(message), C(url), C(status), C(body) (the server's error message) and C(elapsed).
      type: dict
summary:
  description: TTFT of the first round against the later rounds.
  returned: always
  type: dict
  contains:
    rounds:
      description: Rounds sent.
      type: int
    ok_rounds:
      description: Rounds with a complete 200 stream.
      type: int
    ttft_first:
      description: TTFT of round 0.
      type: float
    ttft_rest_median:
      description: Median TTFT of rounds 1 and later.
      type: float
    ttft_rest_min:
      description: Smallest TTFT of rounds 1 and later.
      type: float
    ttft_median:
      description: Median TTFT over all successful rounds.
      type: float
    total_median:
      description: Median total time over all successful rounds.
      type: float
    speedup:
      description: C(ttft_first) divided by C(ttft_rest_median).
      type: float
error:
  description: The first failed round's error (see RV(rounds[].error)), null when every round met O(expect_status).
  returned: always
  type: dict
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kvcache.offload.plugins.module_utils.chat import (
    DEFAULT_BACKEND_HEADERS,
    build_body,
    make_prefix,
    make_suffix,
    prefix_info,
    run_round,
    summarize,
)
from ansible_collections.kvcache.offload.plugins.module_utils.shared_args import http_argument_spec


def argument_spec():
    spec = dict(
        base_url=dict(type="str", required=True),
        path=dict(type="str", default="/v1/chat/completions"),
        model=dict(type="str", required=True),
        rounds=dict(type="int", default=3),
        prefix_tokens=dict(type="int", default=2048, no_log=False),
        seed=dict(type="str", default="0"),
        run_id=dict(type="str", default=""),
        max_tokens=dict(type="int", default=8, no_log=False),
        temperature=dict(type="float", default=0.0),
        pause=dict(type="float", default=0.0),
        expect_status=dict(type="int", default=200),
        backend_headers=dict(type="list", elements="str", default=list(DEFAULT_BACKEND_HEADERS)),
    )
    # api_key, headers, timeout, validate_certs, ca_path: the collection's HTTP contract.
    spec.update(http_argument_spec(timeout=60.0))
    return spec


def _round_meets(rnd, expect_status):
    if expect_status == 200:
        return rnd["ok"]
    return rnd["status"] == expect_status


def _describe(error):
    if not error:
        return ""
    text = "%s: %s" % (error.get("kind"), error.get("message"))
    if error.get("body"):
        text += " (%s)" % error["body"]
    return text


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    for name in ("rounds", "prefix_tokens", "max_tokens"):
        if p[name] < 1:
            module.fail_json(msg="%s must be at least 1" % name)
    if p["timeout"] <= 0:
        module.fail_json(msg="timeout must be positive")
    url = p["base_url"].rstrip("/") + "/" + p["path"].lstrip("/")
    prefix = make_prefix(p["seed"], p["prefix_tokens"])
    result = dict(changed=False, url=url, status=None, prefix=prefix_info(prefix, p["seed"], p["prefix_tokens"]),
                  rounds=[], summary=summarize([]), error=None)
    if module.check_mode:
        result["msg"] = "check mode: no request sent"
        module.exit_json(**result)

    for index in range(p["rounds"]):
        if index and p["pause"] > 0:
            time.sleep(p["pause"])
        body = build_body(p["model"], prefix, make_suffix(index, p["run_id"]), max_tokens=p["max_tokens"],
                          temperature=p["temperature"])
        rnd = run_round(url, body, api_key=p["api_key"], headers=p["headers"], timeout=p["timeout"], deadline=p["timeout"],
                        validate_certs=p["validate_certs"], ca_path=p["ca_path"], backend_headers=p["backend_headers"])
        rnd = dict(round=index, **rnd)
        result["rounds"].append(rnd)
        result["status"] = rnd["status"]
        if not _round_meets(rnd, p["expect_status"]):
            error = rnd["error"] or {"kind": "http", "message": "HTTP %s" % rnd["status"], "url": url,
                                     "status": rnd["status"], "body": None, "elapsed": rnd["total"]}
            result["error"] = error
            result["summary"] = summarize(result["rounds"])
            module.fail_json(msg="round %d: expected HTTP %s, got %s" % (index, p["expect_status"], _describe(error)), **result)
    result["summary"] = summarize(result["rounds"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
