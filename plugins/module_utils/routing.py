# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Routing analysis (validation stage 8 and the bench's policy comparison): pure logic.

A routing probe (kvcache.offload.routing_probe) sends, through the router and one request
at a time, N sessions each with its own long prefix: a first turn and K repeat turns. Around
every request it reads every instance's vLLM counters, so the per-instance deltas of one
request tell which instance served it (the one whose vllm:prompt_tokens grew) and where its
prompt came from (vllm:prompt_tokens_by_source: local_cache_hit = the serving instance's GPU
prefix cache, external_kv_transfer = the shared tier through the KV connector,
local_compute = recomputed; older vLLM: prefix_cache_hits / external_prefix_cache_hits).

attribute() turns one request's deltas into {served_by, source, tokens}; analyse() the whole
run into per-session rows, the repeat-turn ratio on an instance that already held the
session's prefix (it served an earlier turn of the session), hit-source counts and TTFTs;
judge() applies the pass rule for the policy; backend_differences() compares the router's
backend list with the fleet's instances.
"""

from __future__ import annotations

import statistics

# Policies that route by the prompt's prefix (vllm-router cache_aware; production-stack
# prefixaware / kvaware): the stage requires validation_routing_min_ratio for them.
CACHE_AWARE_POLICIES = frozenset(("cache_aware", "prefixaware", "kvaware"))
# Policies blind to the prompt: informational, pass when every request succeeds.
CACHE_BLIND_POLICIES = frozenset(("round_robin", "roundrobin", "random", "power_of_two"))

SOURCE_GPU = "gpu_prefix_cache"
SOURCE_TIER = "shared_tier"
SOURCE_RECOMPUTED = "recomputed"
SOURCES = (SOURCE_GPU, SOURCE_TIER, SOURCE_RECOMPUTED)


def _n(value):
    try:
        if value is None or isinstance(value, bool):
            return 0.0
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _tokens(summary):
    """(prompt, gpu, tier, computed) token deltas from one instance's summary delta."""
    summary = summary or {}
    by_source = summary.get("prompt_tokens_by_source") or {}
    prompt = _n(summary.get("prompt_tokens"))
    if by_source:
        gpu = _n(by_source.get("local_cache_hit"))
        tier = _n(by_source.get("external_kv_transfer"))
        computed = _n(by_source.get("local_compute"))
    else:
        gpu = _n(summary.get("prefix_cache_hits"))
        tier = _n(summary.get("external_prefix_cache_hits")) or _n(summary.get("lmcache_hit_tokens"))
        computed = max(prompt - gpu - tier, 0.0)
    return prompt, gpu, tier, computed


def attribute(deltas, labels=None):
    """Which instance served one request, and where its prompt came from.

    deltas: {instance url: summary delta (metrics_snapshot's delta.per_url[...].summary, or
    None when the instance's metrics could not be read)}. labels: {url: "host/instance"}.
    Returns {served_by, served_label, source, prompt_tokens, gpu_tokens, tier_tokens,
    computed_tokens, problem}; served_by None with problem "unattributed" (no instance's
    counters grew), "ambiguous" (several grew: something else used the fleet) or
    "metrics" (an instance's counters could not be read).
    """
    labels = labels or {}
    grew = []
    unread = []
    for url in sorted(deltas or {}):
        summary = deltas[url]
        if summary is None:
            unread.append(url)
            continue
        prompt, gpu, tier, computed = _tokens(summary)
        if prompt > 0 or _n(summary.get("request_success")) > 0:
            grew.append((url, prompt, gpu, tier, computed))
    out = {"served_by": None, "served_label": None, "source": None, "prompt_tokens": None,
           "gpu_tokens": None, "tier_tokens": None, "computed_tokens": None, "problem": None}
    if len(grew) != 1:
        if len(grew) > 1:
            out["problem"] = "ambiguous"
        elif unread:
            out["problem"] = "metrics"
        else:
            out["problem"] = "unattributed"
        return out
    url, prompt, gpu, tier, computed = grew[0]
    out.update(served_by=url, served_label=labels.get(url, url), prompt_tokens=int(prompt), gpu_tokens=int(gpu),
               tier_tokens=int(tier), computed_tokens=int(computed))
    # The prefix's source is where most of the prompt's tokens came from (the suffix is
    # always computed; the prefix is many times longer).
    best = max(((gpu, SOURCE_GPU), (tier, SOURCE_TIER), (computed, SOURCE_RECOMPUTED)), key=lambda x: x[0])
    out["source"] = best[1] if best[0] > 0 else SOURCE_RECOMPUTED
    return out


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


def percentile(values, pct):
    """Nearest-rank percentile (pct in 0..100) of the non-None values, None when empty."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    rank = max(1, -(-len(values) * pct // 100))
    return round(values[int(rank) - 1], 4)


def policy_kind(policy):
    policy = str(policy or "").strip().lower()
    if policy in CACHE_AWARE_POLICIES:
        return "cache_aware"
    if policy in CACHE_BLIND_POLICIES:
        return "cache_blind"
    return "unknown"


def analyse(requests, instances):
    """The routing run's numbers.

    requests: the routing_probe's requests [{session, turn, ok, status, ttft, error, deltas}]
    in the order they were sent. instances: [{host, instance, url}] of the fleet.
    """
    labels = {i.get("url"): "%s/%s" % (i.get("host"), i.get("instance")) for i in instances or []}
    sessions = {}
    rows = []
    for req in requests or []:
        attr = attribute(req.get("deltas"), labels) if req.get("ok") else dict(attribute({}), problem="request_failed")
        sid = req.get("session")
        sess = sessions.setdefault(sid, {"session": sid, "turns": 0, "failed": 0, "instances": [], "holding": [],
                                         "repeat_turns": 0, "repeat_on_holding": 0, "unattributed": 0,
                                         "sources": dict((s, 0) for s in SOURCES)})
        sess["turns"] += 1
        holding = list(sess["holding"])
        on_holding = None
        if not req.get("ok"):
            sess["failed"] += 1
        elif attr["served_by"] is None:
            sess["unattributed"] += 1
        else:
            if attr["served_label"] not in sess["instances"]:
                sess["instances"].append(attr["served_label"])
            if req.get("turn", 0) > 0:
                on_holding = attr["served_by"] in holding
                sess["repeat_turns"] += 1
                sess["repeat_on_holding"] += int(on_holding)
                sess["sources"][attr["source"]] += 1
            if attr["served_by"] not in sess["holding"]:
                sess["holding"].append(attr["served_by"])
        rows.append({"session": sid, "turn": req.get("turn"), "ok": bool(req.get("ok")), "status": req.get("status"),
                     "ttft_s": req.get("ttft"), "served_by": attr["served_label"], "on_holding_instance": on_holding,
                     "source": attr["source"], "prompt_tokens": attr["prompt_tokens"], "gpu_tokens": attr["gpu_tokens"],
                     "tier_tokens": attr["tier_tokens"], "computed_tokens": attr["computed_tokens"],
                     "problem": attr["problem"], "error": req.get("error")})
    repeat = sum(s["repeat_turns"] for s in sessions.values())
    on_holding = sum(s["repeat_on_holding"] for s in sessions.values())
    first_repeats = [r for r in rows if r["turn"] == 1 and r["on_holding_instance"] is not None]
    sources = dict((s, sum(x["sources"][s] for x in sessions.values())) for s in SOURCES)
    ttft_repeat = [r["ttft_s"] for r in rows if r["ok"] and (r["turn"] or 0) > 0]
    n_inst = len(instances or []) or 1
    per_session = []
    for sess in sessions.values():
        per_session.append({"session": sess["session"], "turns": sess["turns"], "failed": sess["failed"],
                            "instances_used": sess["instances"], "repeat_turns": sess["repeat_turns"],
                            "repeat_on_holding_instance": sess["repeat_on_holding"],
                            "unattributed": sess["unattributed"], "sources": sess["sources"]})
    return {
        "requests": len(rows),
        "failed": sum(1 for r in rows if not r["ok"]),
        "unattributed": sum(1 for r in rows if r["ok"] and r["served_by"] is None),
        "repeat_turns": repeat,
        "repeat_on_holding_instance": on_holding,
        "holding_ratio": round(on_holding / float(repeat), 4) if repeat else None,
        "first_repeat_holding_ratio": (round(sum(1 for r in first_repeats if r["on_holding_instance"])
                                             / float(len(first_repeats)), 4) if first_repeats else None),
        "blind_expectation_first_repeat": round(1.0 / n_inst, 4),
        "instances": len(instances or []),
        "sources": sources,
        "ttft_median_s": _median([r["ttft_s"] for r in rows if r["ok"]]),
        "ttft_repeat_median_s": _median(ttft_repeat),
        "ttft_repeat_p95_s": percentile(ttft_repeat, 95),
        "sessions": per_session,
        "rows": rows,
    }


def _norm_url(url):
    return str(url or "").rstrip("/")


def backend_differences(router_backends, instances):
    """URLs the router routes to that are no fleet instance, and fleet instances it lacks.

    router_backends: a list of URLs or of {url: ...} (router_facts.backends); None when
    unknown. Returns None when unknown, else {"extra": [...], "missing": [...]}.
    """
    if router_backends is None:
        return None
    have = set(_norm_url(b.get("url") if isinstance(b, dict) else b) for b in router_backends)
    want = set(_norm_url(i.get("url")) for i in instances or [])
    return {"extra": sorted(have - want), "missing": sorted(want - have)}


def judge(numbers, policy, min_ratio):
    """(status, reason, cause ids) for the numbers of analyse() under a policy."""
    kind = policy_kind(policy)
    causes = []
    if numbers["requests"] == 0:
        return "fail", "no request was sent through the router", ["routing_requests_failed"]
    if numbers["failed"]:
        causes.append("routing_requests_failed")
        return "fail", "%d/%d requests through the router failed" % (numbers["failed"], numbers["requests"]), causes
    ratio = numbers["holding_ratio"]
    shown = "n/a" if ratio is None else "%.0f %%" % (ratio * 100)
    spread = "%d/%d repeat turns on an instance already holding the session's prefix (%s); sources %s" % (
        numbers["repeat_on_holding_instance"], numbers["repeat_turns"], shown,
        ", ".join("%s %d" % (k, v) for k, v in numbers["sources"].items()))
    if numbers["unattributed"]:
        causes.append("routing_unattributed")
    if kind == "cache_aware":
        if numbers["unattributed"] or ratio is None:
            return "fail", "policy %s: %d requests could not be attributed to an instance; %s" % (
                policy, numbers["unattributed"], spread), causes
        if ratio < min_ratio:
            return "fail", "policy %s: %s, below the required %.0f %%" % (policy, spread, min_ratio * 100), causes
        return "pass", "policy %s: %s (required %.0f %%)" % (policy, spread, min_ratio * 100), causes
    if kind == "unknown":
        causes.append("routing_policy_unjudged")
        return "pass", "policy %s: not judged (informational); %s" % (policy or "unknown", spread), causes
    return "pass", "policy %s (cache-blind, informational): %s; a cache-blind policy puts a first repeat turn on a holding " \
        "instance about 1/%d of the time (measured %s)" % (
            policy, spread, numbers["instances"] or 1,
            "n/a" if numbers["first_repeat_holding_ratio"] is None else "%.0f %%" % (numbers["first_repeat_holding_ratio"] * 100)), causes
