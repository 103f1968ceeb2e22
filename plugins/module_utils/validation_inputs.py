# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The validation role's registered results, turned into what the stage judges read.

The role registers raw results and hands them once to validation_report: every node's
result of the node play (settings read, stage 1's requests, its part of stage 6) and the
controller's stages 2-5. This file decides which nodes were validated in this run, gathers
stage 1 and stage 6 from the nodes, and says which stages could not run and why (no
instance answered, no second instance, no router, not selected). It judges nothing.
"""

from __future__ import annotations

from ansible_collections.kvcache.offload.plugins.module_utils.validation_gds import gds_raw

NOT_SELECTED = "not selected (validation_stages)"
NO_INSTANCE = "no instance answered in stage 1"


def _skip(reason):
    return {"skipped": True, "reason": reason}


def _ran(result):
    """A registered result of a task that ran (not skipped by its condition, not absent)."""
    return isinstance(result, dict) and bool(result) and not result.get("skipped")


def node_coverage(run, nodes):
    """([(host, result)] validated in this run, [{host, validated: False, reason, left_out}]).

    nodes: the role's mapping node -> its node play result ({} when it has none), or a list of
    results with their host (taken as validated). A result of another run (run_id differs)
    is an older validation's: the node did not finish this run's node play.
    """
    run_id = (run or {}).get("id")
    in_play = (run or {}).get("nodes_in_play")
    pairs = list(nodes.items()) if isinstance(nodes, dict) else [((n or {}).get("host"), n) for n in nodes or []]
    validated, missing = [], []
    for host, result in pairs:
        result = result or {}
        if result and (result.get("run_id") is None or result.get("run_id") == run_id):
            validated.append((host, result))
            continue
        left_out = in_play is not None and host not in in_play
        reason = ("not in the node play of this run (--limit, or validation_node_group set only in the inventory)"
                  if left_out else "the node play did not finish on it (unreachable, or a task failed)")
        missing.append({"host": host, "validated": False, "reason": reason, "left_out": left_out})
    return validated, missing


def instances_raw(validated):
    """Stage 1 from the nodes' registered requests, in node and instance order."""
    raw = {"instances": [], "health": [], "authed": [], "unauthed": []}
    for _host, result in validated:
        for key in raw:
            raw[key].extend(result.get(key) or [])
    return raw


def lmcache_probe_raw(run, validated, settings, expected):
    """Stage 6 from the nodes' registered store and loads, or why it did not run."""
    if len(validated) < 2:
        return _skip("fewer than two validated nodes in %s (nothing to load on another node)"
                     % settings.get("node_group", "the node group"))
    stores = [(host, r["lmcache_store"]) for host, r in validated if _ran(r.get("lmcache_store"))]
    loads = [{"host": host, "result": r["lmcache_load"]} for host, r in validated if _ran(r.get("lmcache_load"))]
    store_host, store = stores[0] if stores else (None, {"error": "no node stored the probe chunk (the storing node "
                                                                  "did not run stage 6)"})
    return {"probe_id": "validate-%s" % (run or {}).get("id"), "store": {"host": store_host, "result": store},
            "loads": loads}


def _router_raw(raw, settings):
    """Stage 5's skip reasons: no router host, a router that does not answer, no instance."""
    if not raw.get("router_hosts"):
        return _skip("group %s has no hosts" % settings.get("router_group", "kvcache_router"))
    health = raw.get("health") or {}
    if health.get("status", -1) != 200:
        reason = "the router at %s does not answer /health (%s: %s)" % (
            raw.get("url"), health.get("status", "no status"), str(health.get("msg") or "")[:200])
        if not settings.get("router_required"):
            return _skip(reason)
        return {"url": raw.get("url"), "health": health, "metrics": {},
                "probe": {"error": {"kind": "connection", "message": reason}, "rounds": []}}
    if "a" in raw and raw.get("a") is None:
        return _skip(NO_INSTANCE)
    return raw


def _routing_raw(raw, settings):
    """Stage 8's skip reasons: those of stage 5, and fewer than two instances answering."""
    reason = _router_raw(dict(raw, a=raw.get("a", "")), settings)
    if reason.get("skipped"):
        return reason
    if len(raw.get("answering", raw.get("instances")) or []) < 2:
        return _skip("fewer than two instances answered in stage 1 (nothing to route between)")
    if "probe" not in raw or raw.get("probe") is None:
        return _skip("not run")
    return raw


def stage_inputs(run, nodes, stages, settings, expected, stage_ids):
    """(raw stages by id for the judges, validated node results, not-validated node rows)."""
    settings = settings or {}
    stages = dict(stages or {})
    validated, missing = node_coverage(run, nodes)
    if "instances" not in stages:
        stages["instances"] = instances_raw(validated)
    if "lmcache_probe" not in stages:
        stages["lmcache_probe"] = lmcache_probe_raw(run, validated, settings, expected)
    if "gds_path" not in stages:
        stages["gds_path"] = gds_raw(validated, expected, settings)
    for stage_id in ("tier_write", "local_hit", "cross_instance"):
        raw = stages.get(stage_id)
        if isinstance(raw, dict) and not raw.get("skipped") and "a" in raw and raw.get("a") is None:
            stages[stage_id] = _skip(NO_INSTANCE)
        elif stage_id == "cross_instance" and isinstance(raw, dict) and "b" in raw and raw.get("b") is None:
            stages[stage_id] = _skip("fewer than two instances answered in stage 1")
    router = stages.get("router")
    if isinstance(router, dict) and "router_hosts" in router:
        stages["router"] = _router_raw(router, settings)
    routing = stages.get("routing")
    if isinstance(routing, dict) and "router_hosts" in routing:
        stages["routing"] = _routing_raw(routing, settings)
    selected = settings.get("selected_stages")
    if selected is not None:
        for stage_id in stage_ids:
            if stage_id != "instances" and stage_id not in selected:
                stages[stage_id] = _skip(NOT_SELECTED)
    return stages, [result for _host, result in validated], missing
