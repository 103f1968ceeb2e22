#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: routing_probe
short_description: Send multi-turn sessions through the router and attribute every request to the instance that served it
version_added: 0.1.0
description:
  - Sends O(sessions) sessions through the router at O(router_url), one request at a time. Every session has its own long
    prefix (deterministic from O(seed) and the session number); its first turn is followed by O(turns) repeat turns with
    the same prefix and a new suffix.
  - Around every request it reads the vLLM counters of every instance in O(instances) (C(/metrics)), so the per-instance
    deltas of that request show which instance served it and where its prompt tokens came from
    (C(vllm:prompt_tokens_by_source)). Requests are serial so the deltas belong to one request.
  - Stops after the first failed request (RV(stopped) says so), so a broken router costs one request timeout.
  - Returns the raw requests with their deltas; the judging (ratio of repeat turns on an instance that already held the
    prefix, hit sources) is done by the validation report (stage 8, C(routing)) and the bench.
  - Optionally reads the router's own list of workers from O(workers_path).
author:
  - kvcache.offload developers (!UNKNOWN)
requirements:
  - prometheus-client (Python library) on the host that runs the module.
options:
  router_url:
    description:
      - Base URL of the router, for example V(http://10.0.0.20:8001).
    type: str
    required: true
  instances:
    description:
      - The fleet's instances, each a dict with C(url) (base URL, C(/metrics) is appended), C(host) and C(instance).
    type: list
    elements: dict
    required: true
  model:
    description:
      - Served model name.
    type: str
    required: true
  sessions:
    description:
      - Number of sessions, each with its own prefix.
    type: int
    default: 4
  turns:
    description:
      - Repeat turns per session after the first.
    type: int
    default: 3
  prefix_tokens:
    description:
      - Length of every session's prefix in tokens (estimated as 4 characters per token).
    type: int
    default: 2048
  seed:
    description:
      - Seed of the prefixes; session I uses C(<seed>-s<I>).
    type: str
    default: "0"
  run_id:
    description:
      - Text mixed into every suffix.
    type: str
    default: ""
  max_tokens:
    description:
      - Tokens generated per request.
    type: int
    default: 4
  instance_ca_path:
    description:
      - CA bundle the instances' C(/metrics) are verified with, when they serve HTTPS with a CA of their own
        (C(kvcache_engine_tls)). Default O(ca_path).
    type: path
  metrics_timeout:
    description:
      - Seconds for every C(/metrics) read.
    type: float
    default: 10
  settle_retries:
    description:
      - When no instance's counters moved after a request, read them again this many times, 0.3 s apart (the engine
        publishes its counters right after the stream ends).
    type: int
    default: 3
  workers_path:
    description:
      - Path on the router that lists its workers (vllm-router C(/list_workers)); empty skips it. A failure to read it is
        returned in RV(router_workers_error), it never fails the task.
    type: str
    default: ""
  timeout:
    description:
      - Seconds one request may take in total (connect, prefill and the whole stream). Also the socket timeout.
    default: 60.0
notes:
  - Sends requests (their KV lands in the caches and the shared tier) but manages no state; returns C(changed=false).
  - Does nothing in check mode.
extends_documentation_fragment:
  - kvcache.offload.http_client
"""

EXAMPLES = r"""
- name: Four sessions of four turns through the router
  kvcache.offload.routing_probe:
    router_url: http://10.0.0.20:8001
    instances:
      - {host: gpu-a01, instance: gpu0, url: "http://10.0.0.11:8000"}
      - {host: gpu-a02, instance: gpu0, url: "http://10.0.0.12:8000"}
    model: my-model
    api_key: "{{ kvcache_api_key }}"
    seed: routing-1
  delegate_to: localhost
  run_once: true
  register: routing
"""

RETURN = r"""
requests:
  description: One entry per request in the order sent.
  returned: always
  type: list
  elements: dict
  contains:
    session: {description: Session number., type: int}
    turn: {description: 0 for the first turn and 1 to O(turns) for the repeat turns., type: int}
    ok: {description: The request returned a complete 200 stream., type: bool}
    status: {description: HTTP status., type: int}
    ttft: {description: Time to first token in seconds., type: float}
    error: {description: Structured error of a failed request., type: dict}
    deltas: {description: "Per instance URL: the summary delta of its counters (null when they could not be read).", type: dict}
router_workers:
  description: The router's workers as it listed them (URLs), or null.
  returned: always
  type: list
  elements: str
router_workers_error:
  description: Why the workers could not be read, or null.
  returned: always
  type: str
stopped:
  description: Why the probe stopped early (after the first failed request the rest are not sent), or null.
  returned: always
  type: str
elapsed:
  description: Seconds the whole probe took.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.kvcache.offload.plugins.module_utils.prom import HAS_PROMETHEUS_CLIENT, PROMETHEUS_IMPORT_ERROR
from ansible_collections.kvcache.offload.plugins.module_utils.routing_session import read_workers, run_sessions
from ansible_collections.kvcache.offload.plugins.module_utils.shared_args import http_argument_spec


def argument_spec():
    spec = dict(
        router_url=dict(type="str", required=True),
        instances=dict(type="list", elements="dict", required=True),
        model=dict(type="str", required=True),
        sessions=dict(type="int", default=4),
        turns=dict(type="int", default=3),
        prefix_tokens=dict(type="int", default=2048, no_log=False),
        seed=dict(type="str", default="0"),
        run_id=dict(type="str", default=""),
        max_tokens=dict(type="int", default=4, no_log=False),
        metrics_timeout=dict(type="float", default=10.0),
        instance_ca_path=dict(type="path"),
        settle_retries=dict(type="int", default=3),
        workers_path=dict(type="str", default=""),
    )
    spec.update(http_argument_spec(timeout=60.0))
    return spec


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    for name in ("sessions", "prefix_tokens", "max_tokens"):
        if p[name] < 1:
            module.fail_json(msg="%s must be at least 1" % name)
    if p["turns"] < 1:
        module.fail_json(msg="turns must be at least 1 (the repeat turns are what is measured)")
    urls = [str(i.get("url") or "").rstrip("/") for i in p["instances"]]
    if not urls or not all(urls):
        module.fail_json(msg="every instance needs a url")
    result = dict(changed=False, requests=[], router_workers=None, router_workers_error=None, elapsed=0.0, stopped=None)
    if module.check_mode:
        result["msg"] = "check mode: no request sent"
        module.exit_json(**result)
    if not HAS_PROMETHEUS_CLIENT:
        module.fail_json(msg=missing_required_lib("prometheus-client"), exception=str(PROMETHEUS_IMPORT_ERROR))
    if p["workers_path"]:
        result["router_workers"], result["router_workers_error"] = read_workers(
            p["router_url"], p["workers_path"], api_key=p["api_key"], timeout=p["metrics_timeout"],
            validate_certs=p["validate_certs"], ca_path=p["ca_path"])
    run = run_sessions(p["router_url"], urls, p["model"], sessions=p["sessions"], turns=p["turns"],
                       prefix_tokens=p["prefix_tokens"], seed=p["seed"], run_id=p["run_id"], max_tokens=p["max_tokens"],
                       api_key=p["api_key"], headers=p["headers"], timeout=p["timeout"],
                       metrics_timeout=p["metrics_timeout"], settle_retries=p["settle_retries"],
                       validate_certs=p["validate_certs"], ca_path=p["ca_path"],
                       instance_ca_path=p["instance_ca_path"])
    result.update(requests=run["requests"], elapsed=run["elapsed"], stopped=run["stopped"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
