# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus text parsing and counter deltas for vLLM, LMCache and router /metrics pages.

Parsing is done by the maintained ``prometheus_client.parser.text_string_to_metric_families``.

Names: the text format writes a counter ``foo`` as ``foo_total`` (and, outside
multiprocess mode, a separate ``foo_created`` gauge); the parser turns a typed counter
family back into ``foo`` with samples ``foo_total``. Exporters that emit no ``# TYPE``
line give an ``unknown`` family named ``foo_total``. This module names every series by
its base name (``_total`` stripped) so both spellings select the same thing, and drops
``_created`` series. Gauges whose own name ends in ``_total`` (the production-stack
router does this) keep their type: only counters are diffed.

Names the summary knows (checked in the released sources):
- vLLM 0.32/0.33 (vllm/v1/metrics/loggers.py): labels model_name, engine; ``source`` on
  vllm:prompt_tokens_by_source (local_compute, local_cache_hit, external_kv_transfer) and
  vllm:prompt_tokens_cached_by_source (device, host, p2p, disk, external_unspecified).
- LMCache 0.5.6 in-process (lmcache/observability.py): lmcache:* counters, labels
  model_name, worker_id, role, served_model_name.
- LMCache 0.5.6 MP server (OpenTelemetry -> Prometheus): ``lmcache_mp.lookup_hit`` with
  unit ``tokens`` is exposed as ``lmcache_mp_lookup_hit_tokens_total``; both the
  unit-suffixed and the bare base name are accepted.
- vLLM production-stack router: gauges labelled ``server`` (vllm:current_qps, ...),
  counters vllm:num_incoming_requests{model}, vllm:input_tokens_total{server,model};
  newer releases use a ``router:`` prefix.
"""

from __future__ import annotations

import math

try:
    from prometheus_client.parser import text_string_to_metric_families
    HAS_PROMETHEUS_CLIENT = True
    PROMETHEUS_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised by ansible-test sanity
    text_string_to_metric_families = None
    HAS_PROMETHEUS_CLIENT = False
    PROMETHEUS_IMPORT_ERROR = exc

DEFAULT_PREFIXES = ("vllm:", "lmcache:", "lmcache_mp_", "router:", "vllm_router")

# Labels that name a backend on a router page.
BACKEND_LABELS = ("server", "worker", "backend", "backend_url", "url")

# (summary key, candidate base names, kind, group-by label or None).
# kind: counter (summed over series, diffed), gauge_max / gauge_sum (not diffed).
SUMMARY_SPEC = (
    ("prefix_cache_queries", ("vllm:prefix_cache_queries",), "counter", None),
    ("prefix_cache_hits", ("vllm:prefix_cache_hits",), "counter", None),
    ("external_prefix_cache_queries", ("vllm:external_prefix_cache_queries",), "counter", None),
    ("external_prefix_cache_hits", ("vllm:external_prefix_cache_hits",), "counter", None),
    ("prompt_tokens", ("vllm:prompt_tokens",), "counter", None),
    ("prompt_tokens_cached", ("vllm:prompt_tokens_cached",), "counter", None),
    ("prompt_tokens_by_source", ("vllm:prompt_tokens_by_source",), "counter", "source"),
    ("prompt_tokens_cached_by_source", ("vllm:prompt_tokens_cached_by_source",), "counter", "source"),
    ("generation_tokens", ("vllm:generation_tokens",), "counter", None),
    ("request_success", ("vllm:request_success",), "counter", None),
    ("kv_cache_usage_perc", ("vllm:kv_cache_usage_perc",), "gauge_max", None),
    ("lmcache_requested_tokens", ("lmcache:num_requested_tokens",), "counter", None),
    ("lmcache_hit_tokens", ("lmcache:num_hit_tokens",), "counter", None),
    ("lmcache_stored_tokens", ("lmcache:num_stored_tokens",), "counter", None),
    ("lmcache_lookup_tokens", ("lmcache:num_lookup_tokens",), "counter", None),
    ("lmcache_lookup_hits", ("lmcache:num_lookup_hits",), "counter", None),
    ("lmcache_remote_read_requests", ("lmcache:num_remote_read_requests",), "counter", None),
    ("lmcache_remote_read_bytes", ("lmcache:num_remote_read_bytes",), "counter", None),
    ("lmcache_remote_write_requests", ("lmcache:num_remote_write_requests",), "counter", None),
    ("lmcache_remote_write_bytes", ("lmcache:num_remote_write_bytes",), "counter", None),
    ("lmcache_retrieve_hit_rate", ("lmcache:retrieve_hit_rate",), "gauge_max", None),
    ("lmcache_remote_cache_usage", ("lmcache:remote_cache_usage",), "gauge_sum", None),
    ("lmcache_mp_lookup_requested_tokens", ("lmcache_mp_lookup_requested_tokens", "lmcache_mp_lookup_requested"), "counter", None),
    ("lmcache_mp_lookup_hit_tokens", ("lmcache_mp_lookup_hit_tokens", "lmcache_mp_lookup_hit"), "counter", None),
    ("lmcache_mp_lookup_hit_l1_tokens", ("lmcache_mp_lookup_hit_l1_tokens", "lmcache_mp_lookup_hit_l1"), "counter", None),
    ("lmcache_mp_lookup_hit_l2_tokens", ("lmcache_mp_lookup_hit_l2_tokens", "lmcache_mp_lookup_hit_l2"), "counter", None),
    ("lmcache_mp_l2_store_completed_objects",
     ("lmcache_mp_l2_store_completed_objects_chunks", "lmcache_mp_l2_store_completed_objects"), "counter", None),
    ("lmcache_mp_l2_load_completed_objects",
     ("lmcache_mp_l2_prefetch_load_completed_chunks", "lmcache_mp_l2_prefetch_load_completed"), "counter", None),
    ("router_incoming_requests", ("vllm:num_incoming_requests", "router:num_incoming_requests"), "counter", None),
    ("router_input_tokens_by_backend", ("vllm:input_tokens", "router:input_tokens"), "counter", "server"),
    ("router_request_errors_by_backend", ("vllm:request_errors", "router:request_errors"), "counter", "server"),
    ("router_healthy_backends", ("vllm:healthy_pods_total", "router:healthy_pods_total"), "gauge_sum", None),
)

COUNTER_TYPES = ("counter",)


class MetricsParseError(Exception):
    pass


def _matches_filter(labels, label_filter):
    """A series is left out only when it carries a filter label with another value."""
    for key, value in (label_filter or {}).items():
        if key in labels and labels[key] != str(value):
            return False
    return True


def _finite(value):
    return value if isinstance(value, (int, float)) and not math.isnan(value) and not math.isinf(value) else None


def parse_series(text, prefixes=DEFAULT_PREFIXES, label_filter=None):
    """Parse a /metrics page into a list of series dicts.

    Each series: {"name": base name, "type": counter|gauge|unknown|info, "labels": {...}, "value": float}.
    Histograms and summaries are left out (the validation needs counters and gauges).
    """
    if not HAS_PROMETHEUS_CLIENT:
        raise MetricsParseError("prometheus_client is not installed")
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError and friends on garbage
        raise MetricsParseError("not a Prometheus text page: %s" % exc)
    counter_names = set(f.name for f in families if f.type == "counter")
    out = []
    for family in families:
        name = family.name
        if prefixes and not name.startswith(tuple(prefixes)):
            continue
        if family.type in ("histogram", "gaugehistogram", "summary", "stateset"):
            continue
        if name.endswith("_created") and name[:-len("_created")] in counter_names:
            continue
        for sample in family.samples:
            sname = sample.name
            if sname.endswith("_created"):
                continue
            if family.type == "counter":
                base = name
                mtype = "counter"
            elif family.type == "unknown" and sname.endswith("_total"):
                base = sname[:-len("_total")]
                mtype = "counter"
            elif family.type == "info" or sname.endswith("_info"):
                base = sname
                mtype = "info"
            else:
                base = sname
                mtype = "gauge" if family.type == "gauge" else family.type
            labels = dict(sample.labels)
            if not _matches_filter(labels, label_filter):
                continue
            value = _finite(float(sample.value))
            if value is None:
                continue
            out.append({"name": base, "type": mtype, "labels": labels, "value": value})
    return out


def _lookup_names(series_by_name, candidates):
    for cand in candidates:
        if cand in series_by_name:
            return cand, series_by_name[cand]
        # a gauge spelled with its own _total (router) or a bare counter name
        if cand + "_total" in series_by_name:
            return cand + "_total", series_by_name[cand + "_total"]
    return None, []


def snapshot(text, prefixes=DEFAULT_PREFIXES, label_filter=None, extra_metrics=None):
    """Build the structured snapshot of one page (JSON-serialisable)."""
    series = parse_series(text, prefixes=prefixes, label_filter=label_filter)
    by_name = {}
    for s in series:
        by_name.setdefault(s["name"], []).append(s)

    counters = {}
    gauges = {}
    info = {}
    for name, items in by_name.items():
        mtype = items[0]["type"]
        total = sum(i["value"] for i in items)
        if mtype == "counter":
            counters[name] = total
        elif mtype == "info":
            info[name] = [i["labels"] for i in items]
        else:
            gauges[name] = total

    summary = {}
    found = {}
    for key, candidates, kind, group in SUMMARY_SPEC:
        name, items = _lookup_names(by_name, candidates)
        if not items:
            continue
        found[key] = name
        if group:
            grouped = {}
            for i in items:
                label = i["labels"].get(group, "")
                grouped[label] = grouped.get(label, 0.0) + i["value"]
            summary[key] = grouped
        elif kind == "gauge_max":
            summary[key] = max(i["value"] for i in items)
        else:
            summary[key] = sum(i["value"] for i in items)

    backends = {}
    for s in series:
        if s["type"] not in ("counter", "gauge"):
            continue
        for label in BACKEND_LABELS:
            if label in s["labels"]:
                entry = backends.setdefault(s["labels"][label], {})
                entry[s["name"]] = entry.get(s["name"], 0.0) + s["value"]
                break

    selected = {}
    for name in extra_metrics or ():
        base = name[:-len("_total")] if name.endswith("_total") and name[:-len("_total")] in by_name else name
        if base in by_name:
            selected[name] = [{"labels": i["labels"], "value": i["value"]} for i in by_name[base]]

    return {
        "summary": summary,
        "summary_sources": found,
        "counters": counters,
        "gauges": gauges,
        "info": info,
        "backends": backends,
        "selected": selected,
        "series_count": len(series),
    }


def _counter_delta(current, baseline):
    """Return (delta, reset) for one counter value; a drop means the process restarted."""
    if baseline is None:
        return current, False
    diff = current - baseline
    if diff < 0:
        return current, True
    return diff, False


def _summary_kinds():
    return dict((key, kind) for key, _cands, kind, _group in SUMMARY_SPEC)


def delta(current, baseline):
    """Delta of one snapshot against a baseline snapshot (both from snapshot()).

    Returns {"summary": {...}, "counters": {...}, "backends": {...}, "resets": [names], "baseline_missing": bool}.
    Only counters are diffed; gauges in the summary are reported at their current value.
    """
    if not baseline:
        return {"summary": {}, "counters": {}, "backends": {}, "resets": [], "baseline_missing": True}
    kinds = _summary_kinds()
    resets = []
    out_counters = {}
    base_counters = baseline.get("counters") or {}
    for name, value in (current.get("counters") or {}).items():
        d, reset = _counter_delta(value, base_counters.get(name))
        out_counters[name] = d
        if reset:
            resets.append(name)

    out_summary = {}
    base_summary = baseline.get("summary") or {}
    for key, value in (current.get("summary") or {}).items():
        kind = kinds.get(key, "counter")
        if kind != "counter":
            out_summary[key] = value
            continue
        if isinstance(value, dict):
            base_group = base_summary.get(key) or {}
            group_out = {}
            for label, v in value.items():
                d, reset = _counter_delta(v, base_group.get(label))
                group_out[label] = d
                if reset:
                    resets.append("%s{%s}" % (key, label))
            out_summary[key] = group_out
        else:
            d, reset = _counter_delta(value, base_summary.get(key))
            out_summary[key] = d
            if reset:
                resets.append(key)

    out_backends = {}
    base_backends = baseline.get("backends") or {}
    cur_counter_names = set((current.get("counters") or {}).keys())
    for backend, metrics in (current.get("backends") or {}).items():
        entry = {}
        for name, v in metrics.items():
            if name not in cur_counter_names:
                continue
            d, _reset = _counter_delta(v, (base_backends.get(backend) or {}).get(name))
            entry[name] = d
        if entry:
            out_backends[backend] = entry

    return {
        "summary": out_summary,
        "counters": out_counters,
        "backends": out_backends,
        "resets": sorted(set(resets)),
        "baseline_missing": False,
    }


def add_totals(deltas):
    """Sum summary counter deltas across several pages (e.g. all instances of a fleet)."""
    kinds = _summary_kinds()
    totals = {}
    for d in deltas:
        for key, value in (d.get("summary") or {}).items():
            if kinds.get(key, "counter") != "counter":
                continue
            if isinstance(value, dict):
                group = totals.setdefault(key, {})
                for label, v in value.items():
                    group[label] = group.get(label, 0.0) + v
            else:
                totals[key] = totals.get(key, 0.0) + value
    return totals
