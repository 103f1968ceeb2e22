# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sessions through the router, one request at a time, with every instance's counters read
around each request (kvcache.offload.routing_probe, validation stage 8, and scripts/bench_routing.py).

run_sessions() returns the raw requests ({session, turn, ok, status, ttft, total, error,
usage, deltas}); module_utils/routing.py judges them.
"""

from __future__ import annotations

import json
import random
import time

from ansible_collections.kvcache.offload.plugins.module_utils.chat import build_body, make_prefix, make_suffix, run_round
from ansible_collections.kvcache.offload.plugins.module_utils.http_client import HttpError, fetch
from ansible_collections.kvcache.offload.plugins.module_utils.prom import MetricsParseError, delta, snapshot

PREFIXES = ["vllm:", "lmcache:"]


def read_all(urls, timeout=10.0, validate_certs=True, ca_path=None):
    """{base url: snapshot or None} of every instance's /metrics."""
    out = {}
    for url in urls:
        try:
            status, _h, body, _e = fetch(url + "/metrics", timeout=timeout, accept="text/plain",
                                         validate_certs=validate_certs, ca_path=ca_path)
            out[url] = snapshot(body, prefixes=PREFIXES) if status == 200 else None
        except (HttpError, MetricsParseError):
            out[url] = None
    return out


def deltas(after, before):
    """{url: summary delta, or None when either reading failed}."""
    out = {}
    for url, snap in after.items():
        prev = before.get(url)
        out[url] = delta(snap, prev)["summary"] if snap is not None and prev is not None else None
    return out


def moved(d):
    return any(s and ((s.get("prompt_tokens") or 0) > 0 or (s.get("request_success") or 0) > 0) for s in d.values())


def read_workers(router_url, path, api_key=None, timeout=10.0, validate_certs=True, ca_path=None):
    """(worker URLs, None) from the router's worker list (vllm-router /list_workers), or (None, why)."""
    url = router_url.rstrip("/") + "/" + path.lstrip("/")
    try:
        status, _h, body, _e = fetch(url, timeout=timeout, api_key=api_key, accept="application/json",
                                     validate_certs=validate_certs, ca_path=ca_path)
    except HttpError as exc:
        return None, "%s: %s" % (exc.kind, exc.message)
    if status != 200:
        return None, "HTTP %s from %s" % (status, url)
    try:
        data = json.loads(body)
    except ValueError:
        return None, "%s did not return JSON" % url
    if isinstance(data, dict):
        data = data.get("urls") or data.get("workers") or []
    urls = []
    for item in data if isinstance(data, list) else []:
        urls.append(item.get("url") if isinstance(item, dict) else str(item))
    return urls, None


def turn_order(sessions, turns, order="session", seed="0"):
    """[(session, turn)]: "session" sends a session's turns back to back; "shuffled" interleaves the
    sessions in a seeded random order (each session's turns stay in order)."""
    if order == "session":
        return [(s, t) for s in range(sessions) for t in range(turns + 1)]
    rng = random.Random("kvcache.offload-routing-order-%s" % seed)
    pending = dict((s, 0) for s in range(sessions))
    out = []
    while pending:
        s = rng.choice(sorted(pending))
        out.append((s, pending[s]))
        pending[s] += 1
        if pending[s] > turns:
            del pending[s]
    return out


def run_sessions(router_url, urls, model, sessions=4, turns=3, prefix_tokens=2048, seed="0", run_id="", max_tokens=4,
                 api_key=None, headers=None, timeout=60.0, metrics_timeout=10.0, settle_retries=3,
                 validate_certs=True, ca_path=None, order="session", prefix_tokens_by_session=None, order_seed=None,
                 stop_after_failures=1, instance_ca_path=None):
    """Send the sessions through the router one request at a time; {"requests": [...], "elapsed": s}.

    order: "session" or "shuffled" (turn_order, seeded by order_seed, else seed);
    prefix_tokens_by_session: {session: prefix tokens} overriding prefix_tokens.
    stop_after_failures: stop after this many failed requests (0: never), so a broken router or
    instance costs one request timeout, not one per request; "stopped" says so.
    instance_ca_path: the CA the instances' metrics are verified with (engines with TLS have their
    own CA); default ca_path.
    """
    instance_ca = instance_ca_path or ca_path
    started = time.monotonic()
    url = router_url.rstrip("/") + "/v1/chat/completions"
    prefixes = {}
    for s in range(sessions):
        size = (prefix_tokens_by_session or {}).get(s, prefix_tokens)
        prefixes[s] = make_prefix("%s-s%d" % (seed, s), size)
    requests = []
    failures = 0
    stopped = None
    before = read_all(urls, metrics_timeout, validate_certs, instance_ca)
    order_list = turn_order(sessions, turns, order, seed if order_seed is None else order_seed)
    for index, (session, turn) in enumerate(order_list):
        if stop_after_failures and failures >= stop_after_failures:
            stopped = "stopped after %d failed request(s); %d of %d not sent" % (
                failures, len(order_list) - index, len(order_list))
            break
        body = build_body(model, prefixes[session], make_suffix(turn, "%s-s%d" % (run_id, session)), max_tokens=max_tokens)
        rnd = run_round(url, body, api_key=api_key, headers=headers, timeout=timeout, deadline=timeout,
                        validate_certs=validate_certs, ca_path=ca_path)
        after = read_all(urls, metrics_timeout, validate_certs, instance_ca)
        d = deltas(after, before)
        tries = 0
        while rnd["ok"] and not moved(d) and tries < settle_retries:
            tries += 1
            time.sleep(0.3)
            after = read_all(urls, metrics_timeout, validate_certs, instance_ca)
            d = deltas(after, before)
        requests.append({"session": session, "turn": turn, "ok": rnd["ok"], "status": rnd["status"], "ttft": rnd["ttft"],
                         "total": rnd["total"], "error": rnd["error"], "usage": rnd["usage"], "deltas": d})
        before = after
        failures += 0 if rnd["ok"] else 1
    return {"requests": requests, "elapsed": time.monotonic() - started, "stopped": stopped}
