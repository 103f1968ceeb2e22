"""Inputs of the validation report's tests: registered results as the validation role passes them.

Shared by the test_validation_*.py files here and tests/unit/plugins/modules/test_validation_report.py.
"""
from __future__ import annotations

import base64
import os

from ansible_collections.kvcache.offload.plugins.module_utils.validation_stages import STAGE_IDS, build_report

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "fixtures", "validation")

A = {"host": "lab-node1", "instance": "cpu0", "url": "http://172.29.100.11:8000", "model": "tiny-qwen2"}
B = {"host": "lab-node2", "instance": "cpu0", "url": "http://172.29.100.12:8000", "model": "tiny-qwen2"}


def fixture(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        return handle.read()


def probe(ttfts, status=200, prompt_tokens=2300, error=None):
    rounds = []
    for index, ttft in enumerate(ttfts):
        ok = error is None and status == 200
        rounds.append({"round": index, "status": status, "ok": ok, "ttft": ttft, "total": (ttft or 0) + 0.05,
                       "usage": {"prompt_tokens": prompt_tokens} if ok else None, "error": error})
    rest = [t for t in ttfts[1:] if t]
    return {"changed": False, "failed": False, "url": "x", "status": status, "prefix": {"sha256": "ab" * 32},
            "rounds": rounds, "error": error,
            "summary": {"rounds": len(rounds), "ok_rounds": sum(r["ok"] for r in rounds), "ttft_first": ttfts[0],
                        "ttft_rest_median": sorted(rest)[len(rest) // 2] if rest else None,
                        "speedup": (ttfts[0] / sorted(rest)[len(rest) // 2]) if rest and ttfts[0] else None}}


def refused():
    return {"status": 401, "rounds": [{"round": 0, "status": 401, "ok": False}],
            "error": None, "summary": {}}


def metrics(deltas):
    """A metrics_snapshot result with a baseline: {base_url: summary delta}."""
    return {"urls": [u + "/metrics" for u in deltas],
            "snapshots": dict((u + "/metrics", {"ok": True}) for u in deltas),
            "delta": {"per_url": dict((u + "/metrics", {"summary": s, "baseline_missing": False}) for u, s in deltas.items())}}


def tier(objects, size, error=None, fs=None):
    out = {"backend": "fs", "location": "/mnt/kvcache", "error": error, "fs": fs or {"path": "/mnt/kvcache", "read_only": False}}
    if error is None:
        out.update(objects=objects, bytes=size, newest="2026-11-29T23:30:00Z", models={}, unrecognized={"objects": objects})
    return out


def env_slurp(text, path="/etc/kvcache/vllm/cpu0.env"):
    return {"content": base64.b64encode(text.encode()).decode(), "encoding": "base64", "source": path}


def node(host, env_text, lmcache_text=None, findmnt=None, write_rc=0):
    return {
        "host": host, "unreachable": False,
        "env_slurps": [env_slurp(env_text)],
        "lmcache_slurp": env_slurp(lmcache_text if lmcache_text is not None else fixture("lab-lmcache-config.yaml"),
                                   "/etc/kvcache/lmcache-config.yaml"),
        "findmnt": {"rc": 0, "stdout": findmnt if findmnt is not None else fixture("lab-findmnt.json")},
        "write_test": {"rc": write_rc, "stderr": "" if write_rc == 0 else "sh: 1: cannot create /mnt/kvcache/x: Permission denied"},
    }


def good_inputs():
    env = fixture("lab-node2-cpu0.env")
    nodes = [node("lab-node1", env), node("lab-node2", env)]
    instances = [A, B]
    stages = {
        "instances": {"instances": instances,
                      "health": [{"status": 200, "elapsed": 0}, {"status": 200, "elapsed": 0}],
                      "authed": [probe([0.05], prompt_tokens=40), probe([0.06], prompt_tokens=40)],
                      "unauthed": [refused(), refused()]},
        "tier_write": {"a": A, "probe": probe([0.40, 0.10, 0.11]), "before": tier(10, 1000), "after": tier(14, 5000),
                       "listed_on": "lab-node1"},
        "local_hit": {"a": A, "probe": probe([0.40, 0.10, 0.11]),
                      "metrics": metrics({A["url"]: {"prefix_cache_hits": 4352.0, "prefix_cache_queries": 6900.0,
                                                     "prompt_tokens_by_source": {"local_compute": 2548.0, "local_cache_hit": 4352.0,
                                                                                 "external_kv_transfer": 0.0}},
                                          B["url"]: {}})},
        "cross_instance": {"a": A, "b": B, "cold": probe([0.45]), "hit": probe([0.20]),
                           "metrics": metrics({B["url"]: {"prompt_tokens_by_source": {"local_compute": 1.0, "local_cache_hit": 0.0,
                                                                                      "external_kv_transfer": 2288.0},
                                                          "external_prefix_cache_hits": 2288.0}})},
        "router": {"skipped": True, "reason": "group kvcache_router has no hosts"},
        "lmcache_probe": {"probe_id": "validate-1",
                          "store": {"host": "lab-node1", "result": {"ok": True, "sha256": "cd" * 32, "bytes": 1048576,
                                                                    "connector": "FSConnector", "elapsed": 9.1}},
                          "load_results": [{"__validation_load_node": "lab-node2", "ok": True, "sha256": "cd" * 32,
                                            "bytes": 1048576, "connector": "FSConnector", "elapsed": 8.2}]},
    }
    expected = {"hash_seed": "123", "model": "/opt/kvcache/models/tiny-qwen2", "chunk_size": 256, "tier": "fs",
                "fs_path": "/mnt/kvcache", "lmcache_mode": "inprocess", "fs_must_be_mount": True}
    return {"run": {"id": "20261129T233000Z-000001", "started": "2026-11-29T23:30:00Z"}, "expected": expected,
            "instances": instances, "nodes": nodes, "stages": stages,
            "settings": {"required_stages": list(STAGE_IDS)}}


def build(inputs):
    return build_report(inputs["run"], inputs["expected"], inputs["instances"], inputs["nodes"], inputs["stages"],
                        inputs["settings"])


def stage(report, stage_id):
    return [s for s in report["stages"] if s["id"] == stage_id][0]
