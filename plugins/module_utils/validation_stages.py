# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The validation report's stages: one judge per stage, and the report they make up.

Each eval_* judges one stage from the raw results the validation role collected (the
registered results of chat_probe, metrics_snapshot, tier_inventory, lmcache_storage_probe)
and sets its status (pass/fail/skipped), reason and numbers; causes come from
validation_causes. build_report parses what was read on the nodes (validation_settings),
runs the judges in the order of the play and returns the report dict. Everything that
decides pass/fail/skipped lives here, so it is unit-tested and not spread over Jinja. The
report's schema is documented in docs/validation-report.md (SCHEMA_VERSION below).
"""

from __future__ import annotations

import datetime

from ansible_collections.kvcache.offload.plugins.module_utils.validation_causes import (
    Causes,
    _err_text,
    _label,
    _probe_causes,
    _timed_out,
    causes_from_probe,
    causes_from_tier_result,
    detect_config_causes,
    detect_expired_false_hits,
    detect_l2_disabled,
)
from ansible_collections.kvcache.offload.plugins.module_utils.routing import analyse, backend_differences, judge, policy_kind
from ansible_collections.kvcache.offload.plugins.module_utils.validation_gds import eval_gds_path
from ansible_collections.kvcache.offload.plugins.module_utils.validation_inputs import stage_inputs
from ansible_collections.kvcache.offload.plugins.module_utils.validation_settings import (
    fs_mount_state,
    instance_config,
    label_seeds,
    lmcache_settings,
    node_env_files,
    node_lmcache_text,
)

SCHEMA_ID = "kvcache.offload/validation-report"
SCHEMA_VERSION = 1

PASS = "pass"
FAIL = "fail"
SKIPPED = "skipped"

# (id, number, title); the order is the order of the play.
STAGES = (
    ("instances", 1, "Every instance answers (health, authenticated completion, 401 without key)"),
    ("tier_write", 2, "A long prompt puts KV in the shared tier"),
    ("local_hit", 3, "The same prefix on the same instance is a cache hit"),
    ("cross_instance", 4, "The same prefix on another instance is a hit from the shared tier"),
    ("router", 5, "The same prefix through the router is a hit"),
    ("lmcache_probe", 6, "LMCache storage probe: store on one node, load bit-exact on another"),
    ("gds_path", 7, "GPUDirect Storage: LMCache's KV reads and writes went through nvidia-fs on every node"),
    ("routing", 8, "Routing: repeat turns of a session go to an instance that already holds its prefix"),
)
STAGE_IDS = tuple(s[0] for s in STAGES)


# --------------------------------------------------------------------------- helpers


def _num(value):
    try:
        if value is None or isinstance(value, bool):
            return None
        return float(value)
    except (TypeError, ValueError):
        return None


def _r(value, digits=4):
    value = _num(value)
    return None if value is None else round(value, digits)


def _intish(value):
    value = _num(value)
    if value is None:
        return None
    return int(value) if value == int(value) else value


def probe_ok(result):
    """A chat_probe result whose every round returned a complete 200 stream."""
    if not isinstance(result, dict) or result.get("unreachable") or result.get("skipped"):
        return False
    rounds = result.get("rounds") or []
    return bool(rounds) and result.get("error") is None and all(r.get("ok") for r in rounds)


def probe_numbers(result):
    """The numbers of a chat_probe result that go into the report."""
    if not isinstance(result, dict):
        return {}
    summary = result.get("summary") or {}
    rounds = result.get("rounds") or []
    prompt_tokens = None
    for rnd in rounds:
        usage = rnd.get("usage") or {}
        if usage.get("prompt_tokens") is not None:
            prompt_tokens = usage.get("prompt_tokens")
            break
    return {
        "rounds": len(rounds),
        "ok_rounds": summary.get("ok_rounds", sum(1 for r in rounds if r.get("ok"))),
        "ttft_s": [_r(r.get("ttft")) for r in rounds],
        "total_s": [_r(r.get("total")) for r in rounds],
        "status": [r.get("status") for r in rounds],
        "prompt_tokens": prompt_tokens,
        "prefix_sha256": (result.get("prefix") or {}).get("sha256"),
    }


def metrics_delta(metrics_result, base_url):
    """The summary delta of one instance from a metrics_snapshot result taken with a baseline.

    Returns (summary dict or None, error text or None).
    """
    if not isinstance(metrics_result, dict) or metrics_result.get("skipped"):
        return None, "no metrics"
    url = base_url.rstrip("/") + "/metrics"
    snap = (metrics_result.get("snapshots") or {}).get(url)
    if snap is not None and not snap.get("ok"):
        return None, _err_text(snap)
    per_url = ((metrics_result.get("delta") or {}).get("per_url") or {}).get(url)
    if per_url is None:
        return None, "no metrics for %s" % url
    if per_url.get("baseline_missing"):
        return None, "no baseline for %s" % url
    return per_url.get("summary") or {}, None


def hit_numbers(summary):
    """Local and external hit counts from a summary delta (metrics_snapshot)."""
    summary = summary or {}
    by_source = summary.get("prompt_tokens_by_source") or {}
    external = by_source.get("external_kv_transfer")
    if external is None:
        external = summary.get("external_prefix_cache_hits")
    if external is None:
        external = summary.get("lmcache_hit_tokens")
    local = by_source.get("local_cache_hit")
    if local is None:
        local = summary.get("prefix_cache_hits")
    return {
        "prefix_cache_hits": _intish(summary.get("prefix_cache_hits")),
        "prefix_cache_queries": _intish(summary.get("prefix_cache_queries")),
        "local_cache_hit_tokens": _intish(local),
        "external_kv_tokens": _intish(external),
        "external_prefix_cache_hits": _intish(summary.get("external_prefix_cache_hits")),
        "local_compute_tokens": _intish(by_source.get("local_compute")),
        "prompt_tokens": _intish(summary.get("prompt_tokens")),
        "lmcache_hit_tokens": _intish(summary.get("lmcache_hit_tokens")),
        "lmcache_stored_tokens": _intish(summary.get("lmcache_stored_tokens")),
        "has_external_metrics": "prompt_tokens_by_source" in summary or "external_prefix_cache_hits" in summary
        or "lmcache_hit_tokens" in summary,
    }


# --------------------------------------------------------------------------- stages


def _stage(stage_id, required):
    number, title = [(n, t) for i, n, t in STAGES if i == stage_id][0]
    return {"id": stage_id, "number": number, "title": title, "status": SKIPPED, "required": bool(required),
            "reason": "", "numbers": {}, "causes": [], "details": {}}


def _skipped(stage, raw):
    """Mark the stage skipped when the role recorded {"skipped": true, "reason": ...} (or nothing)."""
    if raw is None:
        stage["reason"] = "not run"
        return True
    if isinstance(raw, dict) and raw.get("skipped"):
        stage["reason"] = str(raw.get("reason") or "skipped")
        return True
    return False


def instance_items(raw):
    """Stage 1 items [{host, instance, url, health, authed, unauthed}] from the role's raw data.

    The role passes the instance list and the three registered loop results (same order);
    a list of ready items is accepted as well.
    """
    if isinstance(raw, list):
        return raw
    if "items" in raw:
        return raw["items"]
    items = []
    health = raw.get("health") or []
    authed = raw.get("authed") or []
    unauthed = raw.get("unauthed") or []
    for index, inst in enumerate(raw.get("instances") or []):
        h = health[index] if index < len(health) else {}
        items.append({
            "host": inst.get("host"), "instance": inst.get("instance"), "url": inst.get("url"),
            "health": {"status": h.get("status"), "elapsed": h.get("elapsed"), "msg": h.get("msg"),
                       "unreachable": h.get("unreachable")},
            "authed": authed[index] if index < len(authed) else {},
            "unauthed": unauthed[index] if index < len(unauthed) else {},
        })
    return items


def eval_instances(stage, raw, causes, dropped_nodes=()):
    """Stage 1; dropped_nodes: nodes in the node play without a result (their instances are unchecked)."""
    if _skipped(stage, raw):
        return stage
    items = instance_items(raw)
    rows = []
    answered = refused = healthy = 0
    problems = ["%s: not validated (the node play did not finish on it)" % host for host in dropped_nodes]
    for item in items:
        who = _label(item)
        health = item.get("health") or {}
        health_ok = health.get("status") == 200
        authed = item.get("authed") or {}
        unauthed = item.get("unauthed") or {}
        auth_ok = probe_ok(authed)
        unauth_status = unauthed.get("status")
        unauth_ok = unauth_status == 401
        healthy += health_ok
        answered += auth_ok
        refused += unauth_ok
        nums = probe_numbers(authed)
        rows.append({"host": item.get("host"), "instance": item.get("instance"), "url": item.get("url"),
                     "health_status": health.get("status"), "health_s": _r(health.get("elapsed")),
                     "completion_status": authed.get("status"), "ttft_s": (nums.get("ttft_s") or [None])[0],
                     "total_s": (nums.get("total_s") or [None])[0], "without_key_status": unauth_status,
                     "error": None if (health_ok and auth_ok and unauth_ok) else _instance_error(health, authed, unauthed)})
        if not health_ok:
            found = causes_from_probe(causes, {"error": _health_error(health), "unreachable": health.get("unreachable"),
                                               "msg": health.get("msg")}, who)
            if not found and health.get("status"):
                causes.add("instance_unreachable", "%s: /health returned HTTP %s" % (who, health.get("status")),
                           hosts=[item.get("host")])
            problems.append("%s: /health %s" % (who, health.get("status") or health.get("msg") or "no answer"))
        if not auth_ok:
            if authed.get("status") == 401:
                causes.add("api_key_rejected", "%s returned 401 with the fleet's API key" % who, hosts=[item.get("host")])
            else:
                causes_from_probe(causes, authed, who)
            problems.append("%s: completion %s" % (who, _err_text(authed)))
        if not unauth_ok:
            if unauth_status == 200:
                causes.add("auth_not_enforced", "%s answered 200 without an API key" % who, hosts=[item.get("host")])
            got = unauth_status if unauth_status is not None else _err_text(unauthed)
            problems.append("%s: without key got %s, expected 401" % (who, got))
    total = len(items)
    stage["numbers"] = {"instances": total, "healthy": healthy, "answered_with_key": answered, "refused_without_key": refused}
    stage["details"] = {"instances": rows}
    if total and healthy == answered == refused == total and not dropped_nodes:
        stage["status"] = PASS
        stage["reason"] = "%d/%d instances healthy, answered with the key and refused without it" % (total, total)
    else:
        stage["status"] = FAIL
        stage["reason"] = "; ".join(problems) if problems else "no instances to check"
    return stage


def _health_error(health):
    if health.get("status") in (None, -1):
        msg = str(health.get("msg") or "")
        kind = "timeout" if "timed out" in msg.lower() else "connection"
        return {"kind": kind, "message": msg}
    return None


def _instance_error(health, authed, unauthed):
    parts = []
    if health.get("status") != 200:
        parts.append("health: %s" % (health.get("status") or health.get("msg")))
    if not probe_ok(authed):
        parts.append("completion: %s" % _err_text(authed))
    if unauthed.get("status") != 401:
        parts.append("without key: %s" % (unauthed.get("status") or _err_text(unauthed)))
    return "; ".join(parts)


def eval_tier_write(stage, raw, causes):
    if _skipped(stage, raw):
        return stage
    probe = raw.get("probe") or {}
    before = raw.get("before") or {}
    after = raw.get("after") or {}
    who = _label(raw.get("a") or {})
    listed_on = raw.get("listed_on") or "controller"
    problems = []
    found = []
    ok_probe = probe_ok(probe)
    if not ok_probe:
        found += causes_from_probe(causes, probe, who)
        problems.append("probe on %s failed: %s" % (who, _err_text(probe)))
    listing_ok = True
    for label, res in (("before", before), ("after", after)):
        if res.get("error") or res.get("unreachable") or _timed_out(res) or "objects" not in res:
            listing_ok = False
            found += causes_from_tier_result(causes, res, host=None if listed_on == "controller" else listed_on)
            problems.append("listing the tier %s the probe failed: %s" % (label, _err_text(res)))
            break
    delta_objects = delta_bytes = None
    if listing_ok:
        delta_objects = int(after.get("objects", 0)) - int(before.get("objects", 0))
        delta_bytes = int(after.get("bytes", 0)) - int(before.get("bytes", 0))
        found += causes_from_tier_result(causes, after, host=None if listed_on == "controller" else listed_on)
    nums = probe_numbers(probe)
    stage["numbers"] = {
        "objects_before": before.get("objects"), "objects_after": after.get("objects"), "objects_added": delta_objects,
        "bytes_before": before.get("bytes"), "bytes_after": after.get("bytes"), "bytes_added": delta_bytes,
        "prompt_tokens": nums.get("prompt_tokens"), "newest_write": after.get("newest"),
    }
    stage["details"] = {"instance": who, "tier": raw.get("location") or after.get("location") or before.get("location"),
                        "listed_on": listed_on, "probe": nums,
                        "models": after.get("models"), "unrecognized_objects": (after.get("unrecognized") or {}).get("objects")}
    lmcache_note = _lmcache_server_stores(stage, raw, causes, problems)
    blocking = causes.blocking(stage["id"])
    if ok_probe and listing_ok and delta_objects > 0 and delta_bytes > 0 and not blocking and not problems:
        stage["status"] = PASS
        stage["reason"] = "%d objects, %d bytes added to %s by one long prompt on %s%s" % (
            delta_objects, delta_bytes, stage["details"]["tier"], who, lmcache_note)
    else:
        stage["status"] = FAIL
        if listing_ok and ok_probe and not (delta_objects > 0 and delta_bytes > 0):
            problems.append("the tier did not grow (objects %+d, bytes %+d)" % (delta_objects, delta_bytes))
        if blocking:
            problems.append("the tier is not usable by the engines: %s" % ", ".join(blocking))
            if listing_ok and ok_probe and delta_objects > 0:
                problems.append("(measured: %d objects added while the check ran)" % delta_objects)
        stage["reason"] = "; ".join(problems)
    return stage


def _lmcache_server_summary(raw, causes, problems, host):
    """The counter deltas of the LMCache server on `host` (raw["lmcache_metrics"], read on that
    node by the role before and after the probe), or None: not read (in-process mode), or
    unreadable (cause metrics_unavailable and a problem added)."""
    res = raw.get("lmcache_metrics")
    if not isinstance(res, dict) or res.get("skipped"):
        return None
    summary, err = metrics_delta(res, raw.get("lmcache_url", ""))
    if err:
        causes.add("metrics_unavailable", "LMCache server on %s: %s" % (host, err), hosts=[host])
        problems.append("the LMCache server's counters on %s: %s" % (host, err))
        return None
    return summary


def _lmcache_server_stores(stage, raw, causes, problems):
    """Multiprocess mode: what the LMCache server on A's node stored in its L2 for the probe.

    The role reads the server's /metrics on A's node before the probe and after the tier
    listing saw the new objects (raw["lmcache_metrics"], raw["lmcache_url"]). Adds the number,
    appends to problems, returns a note for the pass reason.
    """
    host_a = (raw.get("a") or {}).get("host")
    summary = _lmcache_server_summary(raw, causes, problems, host_a)
    if summary is None:
        return ""
    stored = _intish(summary.get("lmcache_mp_l2_store_completed_objects"))
    stage["numbers"]["lmcache_l2_stored_chunks"] = stored
    if not stored:
        problems.append("the LMCache server on %s stored %s chunks in its L2 (the shared tier) for the probe"
                        % (host_a, stored or 0))
    return "; LMCache's server on %s stored %s chunks in its L2" % (host_a, stored or 0)


def eval_local_hit(stage, raw, causes, settings):
    if _skipped(stage, raw):
        return stage
    probe = raw.get("probe") or {}
    who = _label(raw.get("a") or {})
    summary, merr = metrics_delta(raw.get("metrics"), (raw.get("a") or {}).get("url", ""))
    nums = probe_numbers(probe)
    summ = probe.get("summary") or {}
    hits = hit_numbers(summary)
    stage["numbers"] = {
        "rounds": nums.get("rounds"), "ok_rounds": nums.get("ok_rounds"),
        "ttft_first_s": _r(summ.get("ttft_first")), "ttft_hit_median_s": _r(summ.get("ttft_rest_median")),
        "ttft_speedup": _r(summ.get("speedup"), 2),
        "prefix_cache_hits": hits["prefix_cache_hits"], "prefix_cache_queries": hits["prefix_cache_queries"],
        "local_cache_hit_tokens": hits["local_cache_hit_tokens"],
    }
    stage["details"] = {"instance": who, "probe": nums}
    problems = []
    if not probe_ok(probe):
        causes_from_probe(causes, probe, who)
        problems.append("probe on %s failed: %s" % (who, _err_text(probe)))
    if merr:
        causes.add("metrics_unavailable", "%s: %s" % (who, merr), hosts=[(raw.get("a") or {}).get("host")])
        problems.append("metrics of %s: %s" % (who, merr))
    hit_tokens = hits["local_cache_hit_tokens"] or hits["prefix_cache_hits"] or 0
    if not problems and hit_tokens < settings.get("min_local_hit_tokens", 1):
        problems.append("no prefix-cache hit on %s (hit tokens %s)" % (who, hit_tokens))
    lmcache_note = _lmcache_server_lookups(stage, raw, causes, problems)
    speedup = _num(summ.get("speedup"))
    if speedup is not None and speedup <= 1.0:
        causes.add("ttft_not_lower", "%s: TTFT %.4fs cold vs %.4fs on hits" % (who, summ.get("ttft_first"), summ.get("ttft_rest_median")),
                   hosts=[(raw.get("a") or {}).get("host")])
        if settings.get("require_ttft_drop"):
            problems.append("TTFT did not drop on %s (speedup %.2f)" % (who, speedup))
    if problems:
        stage["status"] = FAIL
        stage["reason"] = "; ".join(problems)
    else:
        stage["status"] = PASS
        stage["reason"] = "%s hit %s cached prompt tokens on rounds 2..%s; TTFT %s s -> %s s%s" % (
            who, hit_tokens, nums.get("rounds"), stage["numbers"]["ttft_first_s"], stage["numbers"]["ttft_hit_median_s"],
            lmcache_note)
    return stage


def _lmcache_server_lookups(stage, raw, causes, problems):
    """Multiprocess mode: what the LMCache server on A's node found when A's repeats asked it.

    vLLM asks the node's server for every new request, also when its own prefix cache holds
    the prompt (LMCacheMPConnector.get_num_new_matched_tokens submits the lookup first), so
    rounds 2..n must find the prefix that round 1 stored: in the server's L1 (the node's CPU
    RAM) or, when L1 has evicted it, its L2. Same counters as stage 2 (one read before and
    one after the probe). Adds numbers, appends to problems, returns a note for the reason.
    """
    host_a = (raw.get("a") or {}).get("host")
    summary = _lmcache_server_summary(raw, causes, problems, host_a)
    if summary is None:
        return ""
    l1 = _intish(summary.get("lmcache_mp_lookup_hit_l1_tokens"))
    l2 = _intish(summary.get("lmcache_mp_lookup_hit_l2_tokens"))
    stage["numbers"].update({"lmcache_hit_tokens": _intish(summary.get("lmcache_mp_lookup_hit_tokens")),
                             "lmcache_l1_hit_tokens": l1, "lmcache_l2_hit_tokens": l2})
    if not (l1 or l2):
        problems.append("the LMCache server on %s found none of the repeated prefix (L1 %s, L2 %s tokens): "
                        "what round 1 stored is not held on the node" % (host_a, l1 or 0, l2 or 0))
    return "; LMCache's server on %s: %s from its L1 (CPU RAM), %s from its L2" % (host_a, l1 or 0, l2 or 0)


def eval_cross_instance(stage, raw, causes, settings):
    if _skipped(stage, raw):
        return stage
    a = raw.get("a") or {}
    b = raw.get("b") or {}
    who_b = _label(b)
    cold = raw.get("cold") or {}
    hit = raw.get("hit") or {}
    summary, merr = metrics_delta(raw.get("metrics"), b.get("url", ""))
    hits = hit_numbers(summary)
    cold_n = probe_numbers(cold)
    hit_n = probe_numbers(hit)
    ttft_cold = (cold_n.get("ttft_s") or [None])[0]
    ttft_hit = (hit_n.get("ttft_s") or [None])[0]
    external = hits["external_kv_tokens"] or 0
    stage["numbers"] = {
        "external_kv_tokens": hits["external_kv_tokens"], "external_prefix_cache_hits": hits["external_prefix_cache_hits"],
        "local_compute_tokens": hits["local_compute_tokens"], "prompt_tokens": hit_n.get("prompt_tokens"),
        "ttft_cold_s": ttft_cold, "ttft_hit_s": ttft_hit,
        "ttft_speedup": _r(ttft_cold / ttft_hit, 2) if ttft_cold and ttft_hit else None,
    }
    stage["details"] = {"written_by": _label(a), "read_by": who_b, "cold_probe": cold_n, "hit_probe": hit_n}
    problems = []
    lmcache_note = _lmcache_server_loads(stage, raw, causes, a, b, problems)
    for label, res in (("cold", cold), ("hit", hit)):
        if not probe_ok(res):
            causes_from_probe(causes, res, who_b)
            problems.append("%s probe on %s failed: %s" % (label, who_b, _err_text(res)))
    if merr:
        causes.add("metrics_unavailable", "%s: %s" % (who_b, merr), hosts=[b.get("host")])
        problems.append("metrics of %s: %s" % (who_b, merr))
    elif not hits["has_external_metrics"]:
        causes.add("no_external_kv_metrics", "%s exports no external KV counters" % who_b, hosts=[b.get("host")])
    if not problems and external < settings.get("min_external_tokens", 1):
        problems.append("%s loaded %s tokens from the shared tier for the prompt %s computed" % (who_b, external, _label(a)))
    if ttft_cold and ttft_hit and ttft_hit >= ttft_cold:
        causes.add("ttft_not_lower", "%s: TTFT %.4fs cold vs %.4fs with KV from the tier" % (who_b, ttft_cold, ttft_hit),
                   hosts=[b.get("host")])
        if settings.get("require_ttft_drop"):
            problems.append("TTFT did not drop on %s (%.4fs cold, %.4fs hit)" % (who_b, ttft_cold, ttft_hit))
    measured_ok = not problems
    blocking = causes.blocking(stage["id"])
    if blocking:
        problems.append("configuration breaks sharing between instances: %s" % ", ".join(blocking))
        if measured_ok:
            problems.append("(measured: %s external KV tokens now; instances started with different settings stop "
                            "sharing under LMCache's keys when they restart)" % external)
    if problems:
        stage["status"] = FAIL
        stage["reason"] = "; ".join(problems)
    else:
        stage["status"] = PASS
        stage["reason"] = "%s loaded %s prompt tokens from the shared tier that %s computed; TTFT %s s cold -> %s s%s" % (
            who_b, external, _label(a), ttft_cold, ttft_hit, lmcache_note)
    return stage


def _lmcache_server_loads(stage, raw, causes, a, b, problems):
    """Multiprocess mode: what LMCache's own server on B's node counted for the prompt A computed.

    The role reads the server's /metrics (loopback only) on B's node before and after the hit
    probe (raw["lmcache_metrics"], raw["lmcache_url"]). When A and B are on different nodes,
    B's server never held those chunks in its L1: the load must show in its L2 hit counter.
    Adds numbers, appends to problems, returns a note for the pass reason.
    """
    host_b = b.get("host")
    summary = _lmcache_server_summary(raw, causes, problems, host_b)
    if summary is None:
        return ""
    l2 = _intish(summary.get("lmcache_mp_lookup_hit_l2_tokens"))
    l1 = _intish(summary.get("lmcache_mp_lookup_hit_l1_tokens"))
    stage["numbers"].update({"lmcache_hit_tokens": _intish(summary.get("lmcache_mp_lookup_hit_tokens")),
                             "lmcache_l1_hit_tokens": l1, "lmcache_l2_hit_tokens": l2})
    cross_node = bool(host_b) and host_b != a.get("host")
    if cross_node and not l2:
        problems.append("the LMCache server on %s found %s tokens of the prompt %s computed in its L2 (the shared tier; "
                        "%s in its own L1): the load did not come from the tier" % (host_b, l2 or 0, _label(a), l1 or 0))
    return "; LMCache's server on %s: %s from its L2, %s from its L1" % (host_b, l2 or 0, l1 or 0)


def eval_router(stage, raw, causes, settings):
    if _skipped(stage, raw):
        return stage
    probe = raw.get("probe") or {}
    metrics = raw.get("metrics") or {}
    per_url = ((metrics.get("delta") or {}).get("per_url") or {})
    backends = []
    total_hits = 0
    total_external = 0
    for url, d in sorted(per_url.items()):
        if d.get("baseline_missing"):
            continue
        h = hit_numbers(d.get("summary"))
        prompt = h["prompt_tokens"] or 0
        hits = (h["local_cache_hit_tokens"] or h["prefix_cache_hits"] or 0)
        total_hits += hits
        total_external += h["external_kv_tokens"] or 0
        backends.append({"metrics_url": url, "prompt_tokens": prompt, "cache_hit_tokens": hits,
                         "external_kv_tokens": h["external_kv_tokens"]})
    nums = probe_numbers(probe)
    stage["numbers"] = {"rounds": nums.get("rounds"), "ok_rounds": nums.get("ok_rounds"),
                        "ttft_s": nums.get("ttft_s"), "cache_hit_tokens": total_hits,
                        "external_kv_tokens": total_external,
                        "backends_served": sum(1 for b in backends if b["prompt_tokens"])}
    stage["details"] = {"router_url": raw.get("url"), "backends": backends, "probe": nums}
    problems = []
    if not probe_ok(probe):
        if not causes_from_probe(causes, probe, "router"):
            causes.add("router_unhealthy", "router: %s" % _err_text(probe))
        problems.append("probe through the router failed: %s" % _err_text(probe))
    if not problems and total_hits + total_external < settings.get("min_local_hit_tokens", 1):
        problems.append("no cache hit on any backend for a prefix every backend has seen")
    lmcache_note = _lmcache_servers_lookups(stage, raw, causes, problems)
    blocking = causes.blocking(stage["id"])
    if blocking:
        problems.append("configuration breaks sharing between instances: %s" % ", ".join(blocking))
    if problems:
        stage["status"] = FAIL
        stage["reason"] = "; ".join(problems)
    else:
        stage["status"] = PASS
        stage["reason"] = "%d/%d rounds through %s hit %d cached tokens (%d from the shared tier)%s" % (
            nums.get("ok_rounds"), nums.get("rounds"), raw.get("url"), total_hits, total_external, lmcache_note)
    return stage


def _lmcache_servers_lookups(stage, raw, causes, problems):
    """Multiprocess mode: what the LMCache servers of the serving nodes found for the router's
    rounds (raw["lmcache_metrics_by_node"]: {node: metrics_snapshot result with its baseline},
    read on every node of an answering instance before and after the probe). Every backend has
    seen the prefix, and vLLM asks its node's server for every request, so the servers together
    must find it: in L1 on A's node, in L2 (the tier) elsewhere. Adds numbers, appends to
    problems, returns a note for the reason."""
    by_node = raw.get("lmcache_metrics_by_node")
    if not isinstance(by_node, dict) or not by_node:
        return ""
    l1 = l2 = 0
    found = []
    for host in sorted(by_node):
        res = by_node[host]
        url = ((res or {}).get("urls") or [""])[0]
        summary = _lmcache_server_summary({"lmcache_metrics": res, "lmcache_url": url[:-len("/metrics")]
                                           if url.endswith("/metrics") else url}, causes, problems, host)
        if summary is None:
            continue
        host_l1 = _intish(summary.get("lmcache_mp_lookup_hit_l1_tokens")) or 0
        host_l2 = _intish(summary.get("lmcache_mp_lookup_hit_l2_tokens")) or 0
        l1, l2 = l1 + host_l1, l2 + host_l2
        if host_l1 or host_l2:
            found.append("%s %d" % (host, host_l1 + host_l2))
    stage["numbers"].update({"lmcache_l1_hit_tokens": l1, "lmcache_l2_hit_tokens": l2})
    if not (l1 or l2):
        problems.append("the LMCache servers on %s found none of the prefix every backend has seen"
                        % ", ".join(sorted(by_node)))
    return "; LMCache's servers found %d tokens in L1, %d in L2 (%s)" % (l1, l2, ", ".join(found) or "none")


def eval_routing(stage, raw, causes, settings):
    """Stage 8: sessions through the router, each request attributed to the instance that served it."""
    if _skipped(stage, raw):
        return stage
    probe = raw.get("probe") or {}
    instances = raw.get("instances") or []
    policy = raw.get("policy")
    min_ratio = _num(raw.get("min_ratio"))
    min_ratio = 0.9 if min_ratio is None else min_ratio
    nums = analyse(probe.get("requests") or [], instances)
    status, reason, found = judge(nums, policy, min_ratio)
    problems = []
    if probe.get("stopped") and status == FAIL:
        reason += " (%s)" % probe["stopped"]
    if probe.get("failed") and not probe.get("requests"):
        status = FAIL
        found = ["routing_requests_failed"]
        reason = "the routing probe failed: %s" % (probe.get("msg") or _err_text(probe))
    backends = raw.get("backends")
    if backends is None:
        backends = probe.get("router_workers")
    diff = backend_differences(backends, instances)
    if diff and (diff["extra"] or diff["missing"]):
        found.append("routing_backends_differ")
        problems.append("the router's backends differ from the fleet (not instances: %s; instances missing: %s)" % (
            ", ".join(diff["extra"]) or "none", ", ".join(diff["missing"]) or "none"))
    messages = {
        "routing_requests_failed": "%d/%d requests through %s failed" % (nums["failed"], nums["requests"], raw.get("url")),
        "routing_backends_differ": "; ".join(problems),
        "routing_unattributed": "%d requests not attributable to one instance" % nums["unattributed"],
        "routing_policy_unjudged": "policy %s (%s)" % (policy, raw.get("implementation") or "router"),
    }
    for cause in found:
        causes.add(cause, messages[cause], hosts=list(raw.get("router_hosts") or [])[:1])
    if problems:
        status = FAIL
        reason = "; ".join(problems + [reason])
    stage["status"] = status
    stage["reason"] = reason
    stage["numbers"] = {
        "policy": policy, "instances": nums["instances"], "sessions": len(nums["sessions"]), "requests": nums["requests"],
        "failed": nums["failed"], "unattributed": nums["unattributed"], "repeat_turns": nums["repeat_turns"],
        "repeat_on_holding_instance": nums["repeat_on_holding_instance"], "holding_ratio": nums["holding_ratio"],
        "required_ratio": min_ratio if policy_kind(policy) == "cache_aware" else None,
        "first_repeat_holding_ratio": nums["first_repeat_holding_ratio"],
        "blind_expectation_first_repeat": nums["blind_expectation_first_repeat"],
        "gpu_prefix_cache_turns": nums["sources"]["gpu_prefix_cache"],
        "shared_tier_turns": nums["sources"]["shared_tier"], "recomputed_turns": nums["sources"]["recomputed"],
        "ttft_repeat_median_s": nums["ttft_repeat_median_s"], "ttft_repeat_p95_s": nums["ttft_repeat_p95_s"],
        "probe_s": _r(probe.get("elapsed"), 2),
    }
    stage["details"] = {"router_url": raw.get("url"), "implementation": raw.get("implementation"), "policy": policy,
                        "backends_differ": diff, "sessions": nums["sessions"], "requests": nums["rows"]}
    return stage


def eval_lmcache_probe(stage, raw, causes):
    if _skipped(stage, raw):
        return stage
    store = raw.get("store") or {}
    store_host = store.get("host")
    sres = store.get("result") or {}
    loads = list(raw.get("loads") or [])
    for res in raw.get("load_results") or []:
        if isinstance(res, dict) and not res.get("skipped"):
            loads.append({"host": res.get("__validation_load_node") or res.get("host"), "result": res})
    problems = []
    rows = [{"host": store_host, "action": "store", "ok": bool(sres.get("ok")), "sha256": sres.get("sha256"),
             "bytes": sres.get("bytes"), "elapsed_s": _r(sres.get("elapsed"), 2), "connector": sres.get("connector"),
             "error": None if sres.get("ok") else _err_text(sres)}]
    if not sres.get("ok"):
        _probe_causes(causes, sres, store_host)
        problems.append("store on %s failed: %s" % (store_host, _err_text(sres)))
    matched = 0
    for load in loads:
        host = load.get("host")
        res = load.get("result") or {}
        match = bool(res.get("ok")) and sres.get("sha256") is not None and res.get("sha256") == sres.get("sha256")
        matched += match
        rows.append({"host": host, "action": "load", "ok": bool(res.get("ok")), "sha256": res.get("sha256"),
                     "bytes": res.get("bytes"), "elapsed_s": _r(res.get("elapsed"), 2), "connector": res.get("connector"),
                     "match": match, "error": None if match else (_err_text(res) if not res.get("ok") else "sha256 differs")})
        if not match and sres.get("ok"):
            _probe_causes(causes, res, host)
            problems.append("load on %s: %s" % (host, _err_text(res) if not res.get("ok") else "sha256 differs"))
    stage["numbers"] = {"stored_bytes": sres.get("bytes"), "loads": len(loads), "loads_matching": matched,
                        "store_s": _r(sres.get("elapsed"), 2)}
    stage["details"] = {"probe_id": raw.get("probe_id"), "key": sres.get("key"), "remote_url": sres.get("remote_url"),
                        "remote_storage_plugins": sres.get("remote_storage_plugins"),
                        "lmcache_version": sres.get("lmcache_version"), "results": rows}
    if not loads and not problems:
        problems.append("no node to load on")
    blocking = causes.blocking(stage["id"])
    if problems or blocking:
        stage["status"] = FAIL
        if blocking and not problems:
            problems.append("configuration: %s" % ", ".join(blocking))
        stage["reason"] = "; ".join(problems)
    else:
        stage["status"] = PASS
        stage["reason"] = "%d bytes stored on %s through %s, read back bit-exact on %s" % (
            sres.get("bytes") or 0, store_host, sres.get("connector"), ", ".join(load.get("host") for load in loads))
    return stage


# --------------------------------------------------------------------------- report


def _iso_now():
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_report(run, expected, instances, nodes, stages, settings):
    """The report dict (see docs/validation-report.md)."""
    settings = dict(settings or {})
    required = settings.get("required_stages", list(STAGE_IDS))
    tier = (expected or {}).get("tier")
    causes = Causes()
    stages, nodes, not_validated = stage_inputs(run, nodes, stages, settings, expected, STAGE_IDS)

    instance_configs = []
    lmcache_by_node = {}
    fs_by_node = {}
    node_rows = []
    for node in nodes or []:
        host = node.get("host")
        transport = [r for r in (node.get("findmnt"), node.get("write_test"), node.get("lmcache_slurp"))
                     if isinstance(r, dict) and (r.get("unreachable") or "module_stderr" in r)]
        if node.get("unreachable") or transport:
            detail = node.get("msg") or (transport[0].get("module_stderr") or transport[0].get("msg") if transport else "")
            causes.add("node_unreachable", "%s: %s" % (host, str(detail or "unreachable").strip()[:300]), hosts=[host])
        detect_expired_false_hits(causes, host, node.get("engine_uptime"), (expected or {}).get("s3_expiration_days"))
        detect_l2_disabled(causes, host, node.get("lmcache_l2"))
        for name, text in node_env_files(node):
            instance_configs.append(instance_config(host, name, text))
        present, text = node_lmcache_text(node)
        if present and not node.get("unreachable") and not transport:
            lmcache_by_node[host] = lmcache_settings(text)
        fs = None
        if tier == "fs":
            fs = fs_mount_state((expected or {}).get("fs_path"), node.get("findmnt"), node.get("write_test"))
            fs_by_node[host] = fs
        node_rows.append({"host": host, "lmcache": lmcache_by_node.get(host), "fs_tier": fs,
                          "reachable": not node.get("unreachable"), "validated": True, "reason": ""})
    for row in not_validated:
        causes.add("node_left_out" if row["left_out"] else "node_not_validated",
                   "%s: %s" % (row["host"], row["reason"]), hosts=[row["host"]])
        node_rows.append({"host": row["host"], "lmcache": None, "fs_tier": None, "reachable": None,
                          "validated": False, "reason": row["reason"]})
    # the seeds are compared and reported as labels from here on: the value is a fleet secret
    instance_configs, expected = label_seeds(instance_configs, expected)
    detect_config_causes(causes, instance_configs, lmcache_by_node, fs_by_node, expected, tier)

    stages = stages or {}
    out_stages = []
    for stage_id in STAGE_IDS:
        stage = _stage(stage_id, stage_id in required)
        raw = stages.get(stage_id)
        if stage_id == "instances":
            eval_instances(stage, raw, causes, [r["host"] for r in not_validated if not r["left_out"]])
        elif stage_id == "tier_write":
            eval_tier_write(stage, raw, causes)
        elif stage_id == "local_hit":
            eval_local_hit(stage, raw, causes, settings)
        elif stage_id == "cross_instance":
            eval_cross_instance(stage, raw, causes, settings)
        elif stage_id == "router":
            eval_router(stage, raw, causes, settings)
        elif stage_id == "gds_path":
            eval_gds_path(stage, raw, causes, _skipped)
        elif stage_id == "routing":
            eval_routing(stage, raw, causes, settings)
        else:
            eval_lmcache_probe(stage, raw, causes)
        out_stages.append(stage)
    for stage in out_stages:
        if stage["status"] == FAIL:
            stage["causes"] = causes.for_stage(stage["id"])

    failed_required = [s["id"] for s in out_stages if s["status"] == FAIL and s["required"]]
    failed_other = [s["id"] for s in out_stages if s["status"] == FAIL and not s["required"]]
    run = dict(run or {})
    run.setdefault("finished", _iso_now())
    report = {
        "schema": SCHEMA_ID,
        "schema_version": SCHEMA_VERSION,
        "result": FAIL if failed_required else PASS,
        "run": run,
        "counts": {
            PASS: sum(1 for s in out_stages if s["status"] == PASS),
            FAIL: sum(1 for s in out_stages if s["status"] == FAIL),
            SKIPPED: sum(1 for s in out_stages if s["status"] == SKIPPED),
        },
        "failed_required": failed_required,
        "failed_optional": failed_other,
        "stages": out_stages,
        "causes": causes.as_list(),
        "fleet": {"expected": expected or {}, "instances": instance_configs, "nodes": node_rows,
                  "endpoints": [{"host": i.get("host"), "instance": i.get("instance"), "url": i.get("url")}
                                for i in instances or []]},
    }
    return report
