#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: metrics_snapshot
short_description: Read the cache counters of vLLM, LMCache and the router from their /metrics pages
version_added: 0.1.0
description:
  - Fetches the Prometheus C(/metrics) page of one or more URLs (vLLM instances, LMCache MP servers,
    the router) and returns the counters that show whether the cache tiers work, as structured data.
  - Parses with the maintained C(prometheus_client) text parser.
  - With O(baseline) (the registered result of an earlier run of this module) it also returns
    RV(delta), the growth of every counter per URL and summed over all URLs, so a playbook can take a
    snapshot, send a probe, take another snapshot and assert on what the probe caused.
  - A counter that went down (the process restarted) is listed in C(resets) of RV(delta.per_url) and its
    delta is its current value.
author:
  - kvcache.offload developers (!UNKNOWN)
requirements:
  - prometheus-client (Python library) on the host that runs the module.
options:
  urls:
    description:
      - Full URLs of the metrics pages, for example V(http://10.0.0.11:8000/metrics).
    type: list
    elements: str
    required: true
  baseline:
    description:
      - The registered result of an earlier C(kvcache.offload.metrics_snapshot) run (or its RV(snapshots)).
      - URLs missing from the baseline get C(baseline_missing=true) in RV(delta.per_url) and no deltas.
    type: dict
  prefixes:
    description:
      - Only metric families whose name starts with one of these are read.
    type: list
    elements: str
    default: ["vllm:", "lmcache:", "lmcache_mp_", "router:", "vllm_router"]
  label_filter:
    description:
      - Keep only series whose labels match; a series that lacks a filter label is kept.
      - 'For example C({model_name: my-model}) on a page shared by several models.'
    type: dict
    default: {}
  extra_metrics:
    description:
      - Further metric names (with or without C(_total)) whose individual series are returned in RV(snapshots.selected).
    type: list
    elements: str
    default: []
  fail_on_error:
    description:
      - Fail when any URL cannot be fetched or parsed. With V(false) the failure is returned in
        RV(snapshots.error) and the task succeeds.
    type: bool
    default: true
  timeout:
    description:
      - Seconds to connect and for every read; a whole page must arrive within three times this.
notes:
  - Read-only; runs in check mode as well.
extends_documentation_fragment:
  - kvcache.offload.http_client
  - kvcache.offload.read_only
"""

EXAMPLES = r"""
- name: Counters before the probe
  kvcache.offload.metrics_snapshot:
    urls:
      - http://10.0.0.11:8000/metrics
      - http://10.0.0.12:8000/metrics
      - http://127.0.0.1:8080/metrics  # an LMCache MP server's HTTP port
  delegate_to: localhost
  run_once: true
  register: before

- name: Counters after the probe, as deltas
  kvcache.offload.metrics_snapshot:
    urls: "{{ before.urls }}"
    baseline: "{{ before }}"
  delegate_to: localhost
  run_once: true
  register: after

- name: Instance B loaded KV from the shared tier
  ansible.builtin.assert:
    that:
      - after.delta.per_url['http://10.0.0.12:8000/metrics'].summary.prompt_tokens_by_source.external_kv_transfer | default(0) > 0
"""

RETURN = r"""
urls:
  description: The URLs read, in order.
  returned: always
  type: list
  elements: str
snapshots:
  description: One entry per URL, keyed by URL.
  returned: always
  type: dict
  contains:
    url:
      description: The URL.
      type: str
    ok:
      description: The page was fetched and parsed.
      type: bool
    status:
      description: HTTP status.
      type: int
    fetched_at:
      description: Epoch seconds when the page was read.
      type: float
    elapsed:
      description: Seconds the fetch took.
      type: float
    error:
      description: Null, or C(kind) (http, connection, dns, timeout, tls, protocol, parse) and C(message).
      type: dict
    summary:
      description:
        - The counters that matter, summed over all series of the page (engines, workers).
        - Keys present when the page has them, for example prefix_cache_queries, prefix_cache_hits,
          external_prefix_cache_queries, external_prefix_cache_hits, prompt_tokens, prompt_tokens_cached,
          prompt_tokens_by_source (dict by source), prompt_tokens_cached_by_source (dict by source),
          kv_cache_usage_perc (max over engines), lmcache_requested_tokens, lmcache_hit_tokens,
          lmcache_stored_tokens, lmcache_remote_read_bytes, lmcache_remote_write_bytes,
          lmcache_mp_lookup_hit_tokens, lmcache_mp_lookup_hit_l2_tokens, lmcache_mp_l2_store_completed_objects,
          router_incoming_requests, router_input_tokens_by_backend (dict by server).
      type: dict
    summary_sources:
      description: For every summary key, the metric name it was read from.
      type: dict
    counters:
      description: Every counter of the page by base name (without C(_total)), summed over series.
      type: dict
    gauges:
      description: Every gauge of the page, summed over series.
      type: dict
    info:
      description: Label sets of C(*_info) metrics (for example vllm:cache_config_info).
      type: dict
    backends:
      description: Counters and gauges of series labelled with a backend (C(server), C(worker), ...), keyed by that label.
      type: dict
    selected:
      description: The individual series of O(extra_metrics).
      type: dict
    series_count:
      description: Number of series read.
      type: int
delta:
  description: Growth since O(baseline). Present only when O(baseline) is given.
  returned: when baseline is given
  type: dict
  contains:
    per_url:
      description: Keyed by URL; C(summary), C(counters), C(backends), C(resets), C(baseline_missing), C(interval) (seconds).
      type: dict
    totals:
      description: Summary counter deltas summed over every URL.
      type: dict
"""

import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.kvcache.offload.plugins.module_utils.http_client import HttpError, fetch
from ansible_collections.kvcache.offload.plugins.module_utils.prom import (
    HAS_PROMETHEUS_CLIENT,
    PROMETHEUS_IMPORT_ERROR,
    MetricsParseError,
    add_totals,
    delta,
    snapshot,
)
from ansible_collections.kvcache.offload.plugins.module_utils.shared_args import http_argument_spec


def argument_spec():
    spec = dict(
        urls=dict(type="list", elements="str", required=True),
        baseline=dict(type="dict"),
        prefixes=dict(type="list", elements="str", default=["vllm:", "lmcache:", "lmcache_mp_", "router:", "vllm_router"]),
        label_filter=dict(type="dict", default={}),
        extra_metrics=dict(type="list", elements="str", default=[]),
        fail_on_error=dict(type="bool", default=True),
    )
    # api_key, headers, timeout, validate_certs, ca_path: the collection's HTTP contract.
    spec.update(http_argument_spec())
    return spec


def read_one(url, p):
    entry = {"url": url, "ok": False, "status": None, "fetched_at": time.time(), "elapsed": None, "error": None}
    try:
        status, _headers, body, elapsed = fetch(url, timeout=p["timeout"], api_key=p["api_key"], headers=p["headers"], accept="text/plain",
                                                validate_certs=p["validate_certs"], ca_path=p["ca_path"])
    except HttpError as exc:
        entry["error"] = {"kind": exc.kind, "message": exc.message}
        entry["elapsed"] = exc.elapsed
        return entry
    entry["status"] = status
    entry["elapsed"] = elapsed
    if status != 200:
        entry["error"] = {"kind": "http", "message": "HTTP %s" % status}
        return entry
    try:
        entry.update(snapshot(body, prefixes=p["prefixes"], label_filter=p["label_filter"], extra_metrics=p["extra_metrics"]))
    except MetricsParseError as exc:
        entry["error"] = {"kind": "parse", "message": str(exc)}
        return entry
    entry["ok"] = True
    return entry


def _baseline_snapshots(baseline):
    if not baseline:
        return None
    if "snapshots" in baseline and isinstance(baseline["snapshots"], dict):
        return baseline["snapshots"]
    return baseline


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    if not HAS_PROMETHEUS_CLIENT:
        module.fail_json(msg=missing_required_lib("prometheus-client"), exception=str(PROMETHEUS_IMPORT_ERROR))
    p = module.params
    if p["timeout"] <= 0:
        module.fail_json(msg="timeout must be positive")
    if not p["urls"]:
        module.fail_json(msg="urls must not be empty")

    snapshots = {}
    for url in p["urls"]:
        snapshots[url] = read_one(url, p)
    result = dict(changed=False, urls=list(p["urls"]), snapshots=snapshots)

    base = _baseline_snapshots(p["baseline"])
    if p["baseline"] is not None:
        per_url = {}
        for url, snap in snapshots.items():
            prev = (base or {}).get(url)
            if not snap["ok"] or not prev or not prev.get("ok"):
                per_url[url] = {"summary": {}, "counters": {}, "backends": {}, "resets": [], "baseline_missing": True, "interval": None}
                continue
            d = delta(snap, prev)
            d["interval"] = snap["fetched_at"] - prev.get("fetched_at", snap["fetched_at"])
            per_url[url] = d
        result["delta"] = {"per_url": per_url, "totals": add_totals(per_url.values())}

    failed = [u for u, s in snapshots.items() if not s["ok"]]
    if failed and p["fail_on_error"]:
        detail = "; ".join("%s: %s: %s" % (u, snapshots[u]["error"]["kind"], snapshots[u]["error"]["message"]) for u in failed)
        module.fail_json(msg="cannot read metrics: %s" % detail, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
