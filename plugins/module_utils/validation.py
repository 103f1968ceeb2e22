# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The validation report: stage verdicts, cause detection, JSON and Markdown.

The validation role collects raw results (the registered results of chat_probe,
metrics_snapshot, tier_inventory, lmcache_storage_probe, and what it read on the nodes:
instance env files, the LMCache config, the fs tier's mount and a write test as the
service user). Everything that decides pass/fail/skipped and names causes lives here,
so it is unit-tested and not spread over Jinja. The report's schema is documented in
docs/validation-report.md (SCHEMA_VERSION below).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import re
import shlex

from ansible_collections.kvcache.offload.plugins.module_utils.envfile import parse_env_text

try:
    import yaml
    HAS_YAML = True
except ImportError:  # pragma: no cover - ansible-core depends on PyYAML
    yaml = None
    HAS_YAML = False

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
)
STAGE_IDS = tuple(s[0] for s in STAGES)

# Variables every engine unit must set so nothing phones home (FACTS: LMCache posts usage
# data to its vendor by default).
TELEMETRY_ENV = (("LMCACHE_TRACK_USAGE", "false"), ("DO_NOT_TRACK", "1"), ("VLLM_NO_USAGE_STATS", "1"))
TELEMETRY_PRESENT_ONLY = ("PROMETHEUS_MULTIPROC_DIR",)

# Cause catalogue: id -> (severity, stages it can explain, fix).
# Causes with severity "error" whose stages include a stage make that stage fail even when
# the measurement passed (configuration that breaks sharing under LMCache's keys).
CAUSES = {
    "instance_unreachable": ("error", ("instances", "tier_write", "local_hit", "cross_instance", "router"),
                             "Start the instance (systemctl status/journalctl -u kvcache-vllm@<name> on the node) and "
                             "check that the port is reachable from the controller."),
    "instance_timeout": ("error", ("instances", "tier_write", "local_hit", "cross_instance", "router"),
                         "The instance accepted the connection but did not answer in time: look at its load and journal."),
    "engine_failed": ("error", ("instances", "local_hit", "cross_instance", "router"),
                      "The engine failed while serving the request (journalctl -u 'kvcache-vllm@*' on the node); systemd "
                      "restarts it. With vLLM's ExampleConnector (the lab's stand-in) a prompt longer than one prefill "
                      "chunk (max_num_batched_tokens, 2048 tokens on CPU) is saved partially and the instance that loads "
                      "it crashes: keep validation_prefix_tokens so the prompt fits one chunk."),
    "api_key_rejected": ("error", ("instances",),
                         "The instance refused the fleet's API key: re-run the nodes stage so every instance has "
                         "kvcache_api_key, or pass the right key (validation_api_key)."),
    "auth_not_enforced": ("error", ("instances",),
                          "The instance answered without an API key: it must run with VLLM_API_KEY "
                          "(the vllm role's api-key.env)."),
    "telemetry_vars_missing": ("warning", ("instances",),
                               "Set LMCACHE_TRACK_USAGE=false, DO_NOT_TRACK=1, VLLM_NO_USAGE_STATS=1 and "
                               "PROMETHEUS_MULTIPROC_DIR in every instance's environment (the vllm role does); without "
                               "them LMCache and vLLM post usage data at start (and stall where that is blocked)."),
    "hash_seed_mismatch": ("error", ("cross_instance", "router"),
                           "Give every instance the same PYTHONHASHSEED (kvcache_hash_seed, fleet-wide) and restart "
                           "the odd ones: vLLM and LMCache ('builtin' hash) seed their prefix hashes with it, so "
                           "instances with different seeds never find each other's KV in the shared tier."),
    "hash_seed_unset": ("error", ("cross_instance", "router"),
                        "Set PYTHONHASHSEED (kvcache_hash_seed) for every instance: without it every process "
                        "draws a random seed and no KV is shared across instances or restarts."),
    "model_mismatch": ("error", ("cross_instance", "router"),
                       "Serve the same model string (--model, kvcache_model) on every instance: LMCache keys its "
                       "objects by that string, so different strings (even paths to the same weights) never share."),
    "tp_mismatch": ("error", ("cross_instance", "router"),
                    "Use one tensor-parallel size (kvcache_tensor_parallel_size) fleet-wide: LMCache keys "
                    "include the world size and the KV layout differs."),
    "kv_dtype_mismatch": ("error", ("cross_instance", "router"),
                          "Use one KV cache dtype (kvcache_kv_dtype) fleet-wide."),
    "kv_connector_mismatch": ("error", ("tier_write", "cross_instance", "router"),
                              "Every instance needs the same KV connector (--kv-transfer-config); an instance "
                              "without one neither writes to nor reads from the shared tier."),
    "chunk_size_mismatch": ("error", ("cross_instance", "router", "lmcache_probe"),
                            "Use one chunk_size (kvcache_chunk_size) in every node's LMCache config: chunk hashes "
                            "and object sizes depend on it."),
    "hash_algorithm_mismatch": ("error", ("cross_instance", "router"),
                                "Use one pre_caching_hash_algorithm (kvcache_hash_algorithm) on every node."),
    "fs_url_no_host": ("error", ("tier_write", "cross_instance", "lmcache_probe"),
                       "remote_url 'fs:///path' (no host) fails silently in LMCache (a warning, 0 hits): use "
                       "remote_storage_plugins [fs] with remote_storage_plugin.fs.base_path, or fs://localhost:0/path."),
    "lmcache_config_unreadable": ("error", ("lmcache_probe",),
                                  "The node's LMCache config is missing or not valid YAML: re-run the nodes stage "
                                  "(lmcache role)."),
    "lmcache_remote_not_configured": ("error", ("lmcache_probe",),
                                      "LMCache found no remote backend: set remote_storage_plugins/extra_config (fs) or "
                                      "remote_url (s3) in the LMCache config (kvcache_tier)."),
    "mount_missing": ("error", ("instances", "tier_write", "local_hit", "cross_instance", "lmcache_probe"),
                      "The shared tier path is missing or not a mount on the node: mount the shared volume "
                      "(kvcache_mount role; in the lab the container's volume) before the engines start."),
    "tier_read_only": ("error", ("instances", "tier_write", "local_hit", "cross_instance", "lmcache_probe"),
                       "The shared tier is mounted read-only: remount it read-write (export policy rw_rule, mount "
                       "options)."),
    "tier_not_writable": ("error", ("instances", "tier_write", "local_hit", "cross_instance", "lmcache_probe"),
                          "The engines' service user cannot write into the shared tier: fix the ownership/mode of "
                          "the volume's root (or the export's anon/root squash), e.g. chown kvcache:kvcache, mode 0770."),
    "tier_full": ("error", ("instances", "tier_write", "local_hit", "cross_instance", "lmcache_probe"),
                  "The shared tier has no room for new KV: check that the pruner runs (systemctl status "
                  "kvcache-prune.timer on the pruning node; kvcache_prune_min_free_percent / kvcache_prune_max_bytes), "
                  "then grow the volume (ONTAP autosize) or size the cache smaller (kvcache_remote_tier_size_gb)."),
    "tier_unreachable": ("error", ("tier_write", "cross_instance", "lmcache_probe"),
                         "The shared tier did not answer in time or refused the connection: check the endpoint, "
                         "network path and the storage system's health."),
    "s3_auth": ("error", ("tier_write", "cross_instance", "lmcache_probe"),
                "The S3 store answered 403 (AccessDenied / InvalidAccessKeyId / SignatureDoesNotMatch): the key "
                "is wrong, revoked or lacks rights on the bucket; issue a key (storagegrid_s3 role) and re-run the "
                "nodes stage."),
    "s3_bucket_missing": ("error", ("tier_write", "cross_instance", "lmcache_probe"),
                          "The bucket does not exist: create it (storagegrid_s3 role) or fix kvcache_s3_bucket."),
    "s3_addressing": ("error", ("tier_write", "cross_instance", "lmcache_probe"),
                      "LMCache uses virtual-hosted style only (s3://<bucket>.<endpoint>): give the S3 endpoint a "
                      "domain name (StorageGRID endpoint domain names) and use that name in kvcache_s3_endpoint."),
    "s3_dns": ("error", ("tier_write", "cross_instance", "lmcache_probe"),
               "<bucket>.<endpoint> does not resolve: add wildcard DNS (*.<endpoint>) for virtual-hosted style."),
    "tier_error": ("error", ("tier_write", "cross_instance", "lmcache_probe"),
                   "Listing or probing the shared tier failed; see the message."),
    "metrics_unavailable": ("error", ("local_hit", "cross_instance", "router"),
                            "The instance's /metrics could not be read: the counters that prove hits are missing."),
    "no_external_kv_metrics": ("warning", ("cross_instance",),
                               "The instance exports no external KV counters (vllm:prompt_tokens_by_source / "
                               "external_prefix_cache_*): is a KV connector configured?"),
    "ttft_not_lower": ("warning", ("local_hit", "cross_instance"),
                       "Time to first token did not drop on the hit. On the lab's tiny CPU model prefill is so cheap "
                       "that loading KV can cost as much; on a real model this points at a slow tier."),
    "node_unreachable": ("error", ("lmcache_probe", "tier_write"),
                         "Ansible could not reach the node: check the connection (SSH / docker) to it."),
    "router_unhealthy": ("error", ("router",),
                         "The router answers but fails the probe: check its backends and logs (roles/router)."),
}


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


def _label(item):
    return "%s/%s" % (item.get("host"), item.get("instance"))


def _err_text(result):
    """A short description of a failed module result (chat_probe, tier_inventory, ...)."""
    if not isinstance(result, dict):
        return "no result"
    if result.get("unreachable"):
        return "unreachable: %s" % (result.get("msg") or "")
    err = result.get("error")
    if isinstance(err, dict):
        text = "%s: %s" % (err.get("kind"), err.get("message"))
        if err.get("body"):
            text += " (%s)" % err.get("body")
        return text
    if isinstance(err, str) and err:
        return "%s: %s" % (result.get("stage") or "error", err)
    if result.get("msg"):
        return str(result.get("msg"))
    return "failed"


def _timed_out(result):
    return isinstance(result, dict) and ("timedout" in result or "timed out" in str(result.get("msg", "")).lower())


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


# --------------------------------------------------------------------------- node configuration


def slurped_text(result):
    """The text of an ansible.builtin.slurp result, or None when the read failed."""
    if not isinstance(result, dict) or result.get("content") is None or result.get("unreachable"):
        return None
    content = result["content"]
    if result.get("encoding", "base64") == "base64":
        try:
            return base64.b64decode(content).decode("utf-8", "replace")
        except (ValueError, TypeError):
            return None
    return content


def node_env_files(node):
    """[(instance name, env text)] of a node entry: env_files [{name, content}] or env_slurps (slurp results)."""
    out = []
    for env in node.get("env_files") or []:
        out.append((env.get("name") or "", env.get("content")))
    for res in node.get("env_slurps") or []:
        text = slurped_text(res)
        if text is None:
            continue
        path = (res.get("source") or (res.get("__validation_env_item") or {}).get("path") or "")
        out.append((os.path.basename(path), text))
    return [(name[:-4] if name.endswith(".env") else name, text) for name, text in out]


def node_lmcache_text(node):
    """(present, text): the LMCache config text of a node entry (lmcache_config text or lmcache_slurp)."""
    if "lmcache_config" in node:
        return True, node.get("lmcache_config")
    if "lmcache_slurp" in node:
        return True, slurped_text(node.get("lmcache_slurp"))
    return False, None


def parse_vllm_args(text):
    """The sharing-relevant options of a VLLM_ARGS string (the vllm role's env file)."""
    out = {"model": None, "served_model_name": None, "tensor_parallel_size": None, "kv_cache_dtype": None, "port": None}
    try:
        argv = shlex.split(text or "")
    except ValueError:
        argv = (text or "").split()
    names = {"--model": "model", "--served-model-name": "served_model_name", "--tensor-parallel-size": "tensor_parallel_size",
             "-tp": "tensor_parallel_size", "--kv-cache-dtype": "kv_cache_dtype", "--port": "port"}
    index = 0
    while index < len(argv):
        arg = argv[index]
        key, value = arg, None
        if "=" in arg and arg.startswith("--"):
            key, value = arg.split("=", 1)
        if key in names:
            if value is None and index + 1 < len(argv):
                value = argv[index + 1]
                index += 1
            out[names[key]] = value
        index += 1
    if out["tensor_parallel_size"] is None:
        out["tensor_parallel_size"] = "1"
    if out["kv_cache_dtype"] is None:
        out["kv_cache_dtype"] = "auto"
    return out


def instance_config(host, name, env_text):
    """What an instance env file says about sharing: seed, model, TP, dtype, connector, telemetry."""
    env = parse_env_text(env_text)
    args = parse_vllm_args(env.get("VLLM_ARGS", ""))
    kv = None
    kv_error = None
    if env.get("VLLM_KV_TRANSFER_CONFIG"):
        try:
            kv = json.loads(env["VLLM_KV_TRANSFER_CONFIG"])
        except ValueError as exc:
            kv_error = str(exc)
    missing = []
    for key, want in TELEMETRY_ENV:
        if str(env.get(key, "")).strip().lower() != want:
            missing.append("%s=%s" % (key, want))
    for key in TELEMETRY_PRESENT_ONLY:
        if not env.get(key):
            missing.append(key)
    return {
        "host": host,
        "instance": name,
        "hash_seed": env.get("PYTHONHASHSEED"),
        "model": args["model"],
        "served_model_name": args["served_model_name"],
        "tensor_parallel_size": args["tensor_parallel_size"],
        "kv_cache_dtype": args["kv_cache_dtype"],
        "port": args["port"],
        "kv_connector": (kv or {}).get("kv_connector") if isinstance(kv, dict) else None,
        "kv_transfer_config_error": kv_error,
        "lmcache_config_file": env.get("LMCACHE_CONFIG_FILE"),
        "telemetry_missing": missing,
    }


def lmcache_settings(text):
    """The sharing-relevant keys of an LMCache config (secrets never copied)."""
    out = {"readable": False, "error": None, "chunk_size": None, "remote_url": None, "remote_storage_plugins": None,
           "fs_base_path": None, "pre_caching_hash_algorithm": None, "local_cpu": None}
    if text is None:
        out["error"] = "missing"
        return out
    if not HAS_YAML:  # pragma: no cover
        out["error"] = "PyYAML is not installed on the controller"
        return out
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        out["error"] = "not valid YAML: %s" % str(exc).splitlines()[0]
        return out
    if not isinstance(data, dict):
        out["error"] = "not a mapping"
        return out
    out["readable"] = True
    extra = data.get("extra_config") or {}
    out["chunk_size"] = data.get("chunk_size", 256)
    out["remote_url"] = data.get("remote_url")
    out["remote_storage_plugins"] = data.get("remote_storage_plugins")
    out["fs_base_path"] = extra.get("remote_storage_plugin.fs.base_path") if isinstance(extra, dict) else None
    out["pre_caching_hash_algorithm"] = data.get("pre_caching_hash_algorithm", "builtin")
    out["local_cpu"] = data.get("local_cpu")
    return out


def _ran(result):
    """A registered command result that really ran on the node (not skipped, unreachable or a transport failure)."""
    return (isinstance(result, dict) and not result.get("skipped") and not result.get("unreachable")
            and "module_stderr" not in result and "timedout" not in result and "rc" in result)


def fs_mount_state(path, findmnt_result, write_result):
    """Facts about the fs tier on a node from `findmnt -J --target` and a write test as the service user."""
    state = {"path": path, "checked": False, "exists": None, "is_mount": None, "mount_target": None, "source": None,
             "fstype": None, "read_only": None, "writable_by_service_user": None, "write_error": None}
    if _ran(findmnt_result):
        state["checked"] = True
        if findmnt_result.get("rc") == 0:
            try:
                fs = (json.loads(findmnt_result.get("stdout") or "{}").get("filesystems") or [{}])[0]
            except (ValueError, IndexError, AttributeError):
                fs = {}
            state["exists"] = True
            state["mount_target"] = fs.get("target")
            state["source"] = fs.get("source")
            state["fstype"] = fs.get("fstype")
            state["is_mount"] = fs.get("target") == path
            options = (fs.get("options") or "").split(",")
            state["read_only"] = "ro" in options
        else:
            state["exists"] = False
    if _ran(write_result):
        state["checked"] = True
        state["writable_by_service_user"] = write_result.get("rc") == 0
        if write_result.get("rc") != 0:
            state["write_error"] = (write_result.get("stderr") or write_result.get("msg") or "").strip()[-300:] or \
                "rc=%s" % write_result.get("rc")
    return state


# --------------------------------------------------------------------------- causes


class Causes(object):
    """Collects detected causes, one entry per id, merging hosts and evidence."""

    def __init__(self):
        self._by_id = {}
        self._order = []

    def add(self, cause_id, message, hosts=None, evidence=None):
        severity, stages, fix = CAUSES[cause_id]
        entry = self._by_id.get(cause_id)
        if entry is None:
            entry = {"id": cause_id, "severity": severity, "stages": list(stages), "message": message,
                     "hosts": [], "evidence": [], "fix": fix}
            self._by_id[cause_id] = entry
            self._order.append(cause_id)
        elif message not in entry["message"]:
            entry["message"] += "; " + message
        for host in hosts or ():
            if host and host not in entry["hosts"]:
                entry["hosts"].append(host)
        if evidence and evidence not in entry["evidence"]:
            entry["evidence"].append(evidence)

    def ids(self):
        return list(self._order)

    def get(self, cause_id):
        return self._by_id.get(cause_id)

    def for_stage(self, stage_id):
        return [c for c in self._order if stage_id in self._by_id[c]["stages"]]

    def blocking(self, stage_id):
        return [c for c in self.for_stage(stage_id) if self._by_id[c]["severity"] == "error"
                and c in CONFIG_CAUSES]

    def as_list(self):
        return [self._by_id[c] for c in self._order]


# Causes detected from configuration alone: they fail the stages they break even when the
# lab's connector happens to share anyway (see docs/validation-report.md).
CONFIG_CAUSES = frozenset(("hash_seed_mismatch", "hash_seed_unset", "model_mismatch", "tp_mismatch", "kv_dtype_mismatch",
                           "kv_connector_mismatch", "chunk_size_mismatch", "hash_algorithm_mismatch", "fs_url_no_host",
                           "mount_missing", "tier_read_only", "tier_not_writable"))


def _describe_values(values):
    return ", ".join("%s=%s" % (k, "unset" if v is None else v) for k, v in values)


def detect_config_causes(causes, instance_configs, lmcache_by_node, fs_by_node, expected, tier):
    """Causes visible in the nodes' configuration: fleet-wide settings that differ, fs:///, mount state."""
    expected = expected or {}
    configs = [c for c in instance_configs if c]
    if configs:
        seeds = [(_label(c), c["hash_seed"]) for c in configs]
        unset = [c for c in configs if c["hash_seed"] in (None, "", "random")]
        if unset:
            causes.add("hash_seed_unset", "PYTHONHASHSEED is not set for %s" % ", ".join(_label(c) for c in unset),
                       hosts=[c["host"] for c in unset], evidence=_describe_values(seeds))
        distinct = sorted(set(str(c["hash_seed"]) for c in configs if c not in unset))
        if len(distinct) > 1:
            want = expected.get("hash_seed")
            odd = [c for c in configs if c not in unset and want is not None and str(c["hash_seed"]) != str(want)]
            if not odd:
                odd = configs
            causes.add("hash_seed_mismatch",
                       "PYTHONHASHSEED differs between instances (%s)%s" % (
                           _describe_values(seeds),
                           "; the fleet's kvcache_hash_seed is %s" % want if want is not None else ""),
                       hosts=[c["host"] for c in odd], evidence=_describe_values(seeds))
        for key, cause_id, what in (("model", "model_mismatch", "--model"),
                                    ("tensor_parallel_size", "tp_mismatch", "--tensor-parallel-size"),
                                    ("kv_cache_dtype", "kv_dtype_mismatch", "--kv-cache-dtype"),
                                    ("kv_connector", "kv_connector_mismatch", "kv_connector")):
            values = [(_label(c), c[key]) for c in configs]
            if len(set(str(v) for _l, v in values)) > 1 or (key == "kv_connector" and any(v is None for _l, v in values)):
                causes.add(cause_id, "%s differs between instances (%s)" % (what, _describe_values(values)),
                           hosts=sorted(set(c["host"] for c in configs)), evidence=_describe_values(values))
        tele = [c for c in configs if c["telemetry_missing"]]
        if tele:
            causes.add("telemetry_vars_missing", "telemetry variables missing: %s" % "; ".join(
                "%s lacks %s" % (_label(c), ", ".join(c["telemetry_missing"])) for c in tele),
                hosts=[c["host"] for c in tele])

    readable = dict((h, s) for h, s in (lmcache_by_node or {}).items() if s and s.get("readable"))
    for host, settings in sorted((lmcache_by_node or {}).items()):
        if settings and not settings.get("readable") and expected.get("lmcache_mode", "inprocess") == "inprocess":
            causes.add("lmcache_config_unreadable", "LMCache config on %s: %s" % (host, settings.get("error")), hosts=[host])
    if readable:
        for key, cause_id in (("chunk_size", "chunk_size_mismatch"), ("pre_caching_hash_algorithm", "hash_algorithm_mismatch")):
            values = sorted(readable.items())
            distinct = set(str(s.get(key)) for _h, s in values)
            if len(distinct) > 1:
                causes.add(cause_id, "%s differs between nodes (%s)" % (key, ", ".join("%s=%s" % (h, s.get(key)) for h, s in values)),
                           hosts=[h for h, _s in values])
        for host, settings in sorted(readable.items()):
            url = settings.get("remote_url") or ""
            if url.startswith("fs:///"):
                causes.add("fs_url_no_host", "LMCache remote_url on %s is %s (no host)" % (host, url), hosts=[host])
            if url.startswith("s3://") and expected.get("s3_bucket"):
                hostpart = url[len("s3://"):].split("/")[0]
                if not hostpart.startswith(expected["s3_bucket"] + "."):
                    causes.add("s3_addressing", "LMCache remote_url on %s is %s: not <bucket>.<endpoint> (virtual-hosted)"
                               % (host, url), hosts=[host])

    if tier == "fs":
        for host, state in sorted((fs_by_node or {}).items()):
            if not state or not state.get("checked"):
                continue
            if state.get("exists") is False:
                causes.add("mount_missing", "%s does not exist on %s" % (state["path"], host), hosts=[host])
            elif state.get("is_mount") is False and expected.get("fs_must_be_mount", True):
                causes.add("mount_missing", "%s on %s is not a mount point (it lies on %s)" % (
                    state["path"], host, state.get("mount_target")), hosts=[host])
            if state.get("read_only"):
                causes.add("tier_read_only", "%s is mounted read-only on %s" % (state["path"], host), hosts=[host])
            if state.get("writable_by_service_user") is False:
                causes.add("tier_not_writable", "the service user cannot write into %s on %s (%s)" % (
                    state["path"], host, state.get("write_error")), hosts=[host])
    return causes


_ERROR_PATTERNS = (
    ("tier_full", ("no space left on device", "enospc", "disk quota exceeded", "edquot")),
    ("tier_read_only", ("read-only file system", "erofs")),
    ("tier_not_writable", ("permission denied", "eacces", "operation not permitted")),
    ("s3_auth", ("403", "accessdenied", "invalidaccesskeyid", "signaturedoesnotmatch", "forbidden")),
    ("s3_bucket_missing", ("nosuchbucket",)),
    ("s3_dns", ("name or service not known", "temporary failure in name resolution", "nodename nor servname",
                "could not resolve", "dns")),
    ("tier_unreachable", ("timed out", "timeout", "connection refused", "unreachable")),
)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _evidence(text, needles):
    """The text's first line, and the first later line (a log line) that names the cause."""
    lines = [line.strip() for line in _ANSI.sub("", text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    first = lines[0][:300]
    if any(n in first.lower() for n in needles):
        return first
    for line in lines[1:]:
        if any(n in line.lower() for n in needles):
            return "%s; logged: %s" % (first, line[:300])
    return first


def causes_from_text(causes, text, host=None, tier_context=True):
    """Map an error message of the tier or the LMCache probe to causes. Returns the ids found.

    The cause's message is the error's first line, plus the log line that shows the cause when
    only the log (an LMCache stderr tail) does; terminal colour codes are removed.
    """
    low = (text or "").lower()
    found = []
    for cause_id, needles in _ERROR_PATTERNS:
        if not tier_context and cause_id.startswith("s3_"):
            continue
        if any(n in low for n in needles):
            found.append(cause_id)
            causes.add(cause_id, "%s%s" % ("%s: " % host if host else "", _evidence(text, needles)),
                       hosts=[host] if host else None)
    return found


_TIER_KIND = {"auth": "s3_auth", "not_found": "s3_bucket_missing", "addressing": "s3_addressing", "dns": "s3_dns",
              "missing": "mount_missing", "not_a_directory": "mount_missing", "permission": "tier_not_writable",
              "timeout": "tier_unreachable", "connection": "tier_unreachable", "tls": "tier_error", "s3": "tier_error"}


def causes_from_tier_result(causes, result, host=None):
    """Causes from a failed tier_inventory result (error.kind) or its fs facts."""
    if not isinstance(result, dict):
        return []
    found = []
    if result.get("unreachable"):
        causes.add("node_unreachable", "%s: %s" % (host, result.get("msg")), hosts=[host])
        return ["node_unreachable"]
    if _timed_out(result):
        causes.add("tier_unreachable", "listing the tier on %s timed out" % (host or "the controller"), hosts=[host])
        return ["tier_unreachable"]
    err = result.get("error")
    if isinstance(err, dict) and err.get("kind"):
        cause_id = _TIER_KIND.get(err["kind"], "tier_error")
        causes.add(cause_id, "%s%s: %s" % ("%s: " % host if host else "", err.get("kind"), err.get("message")),
                   hosts=[host] if host else None)
        found.append(cause_id)
    fs = result.get("fs") or {}
    if fs.get("read_only"):
        causes.add("tier_read_only", "%s is read-only on %s" % (fs.get("path"), host), hosts=[host])
        found.append("tier_read_only")
    if volume_full(fs.get("total_bytes"), fs.get("free_bytes")):
        causes.add("tier_full", "%s on %s has %d bytes free of %d" % (
            fs.get("path"), host, fs["free_bytes"], fs["total_bytes"]), hosts=[host])
        found.append("tier_full")
    return found


FULL_FRACTION = 0.01
FULL_BYTES_CAP = 1 << 30


def volume_full(total_bytes, free_bytes):
    """True when a volume has no room left for KV: under 1 % free, or under 1 GiB on a big volume."""
    if not isinstance(total_bytes, int) or not isinstance(free_bytes, int) or total_bytes <= 0:
        return False
    return free_bytes < min(total_bytes * FULL_FRACTION, FULL_BYTES_CAP)


def causes_from_probe(causes, result, who):
    """Causes from a failed chat_probe result (who: 'host/instance' or 'router')."""
    if not isinstance(result, dict):
        return []
    host = who.split("/")[0] if "/" in who else None
    if result.get("unreachable"):
        causes.add("instance_unreachable", "%s: %s" % (who, result.get("msg")), hosts=[host])
        return ["instance_unreachable"]
    err = result.get("error") or {}
    kind = err.get("kind")
    if "enginecore" in ("%s %s" % (err.get("message"), err.get("body"))).lower():
        causes.add("engine_failed", "%s: %s" % (who, _err_text(result)), hosts=[host])
        return ["engine_failed"]
    if _timed_out(result) or kind == "timeout":
        causes.add("instance_timeout", "%s: %s" % (who, _err_text(result)), hosts=[host])
        return ["instance_timeout"]
    if kind in ("connection", "dns", "tls"):
        causes.add("instance_unreachable", "%s: %s" % (who, _err_text(result)), hosts=[host])
        return ["instance_unreachable"]
    return []


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


def eval_instances(stage, raw, causes):
    if _skipped(stage, raw):
        return stage
    items = instance_items(raw)
    rows = []
    answered = refused = healthy = 0
    problems = []
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
    if total and healthy == answered == refused == total:
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
    blocking = causes.blocking(stage["id"])
    if ok_probe and listing_ok and delta_objects > 0 and delta_bytes > 0 and not blocking:
        stage["status"] = PASS
        stage["reason"] = "%d objects, %d bytes added to %s by one long prompt on %s" % (
            delta_objects, delta_bytes, stage["details"]["tier"], who)
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
        stage["reason"] = "%s hit %s cached prompt tokens on rounds 2..%s; TTFT %s s -> %s s" % (
            who, hit_tokens, nums.get("rounds"), stage["numbers"]["ttft_first_s"], stage["numbers"]["ttft_hit_median_s"])
    return stage


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
            problems.append("(measured: %s external KV tokens; a connector that keys by token content, such as the "
                            "lab's ExampleConnector, still shares, LMCache's keys do not)" % external)
    if problems:
        stage["status"] = FAIL
        stage["reason"] = "; ".join(problems)
    else:
        stage["status"] = PASS
        stage["reason"] = "%s loaded %s prompt tokens from the shared tier that %s computed; TTFT %s s cold -> %s s" % (
            who_b, external, _label(a), ttft_cold, ttft_hit)
    return stage


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
    blocking = causes.blocking(stage["id"])
    if blocking:
        problems.append("configuration breaks sharing between instances: %s" % ", ".join(blocking))
    if problems:
        stage["status"] = FAIL
        stage["reason"] = "; ".join(problems)
    else:
        stage["status"] = PASS
        stage["reason"] = "%d/%d rounds through %s hit %d cached tokens (%d from the shared tier)" % (
            nums.get("ok_rounds"), nums.get("rounds"), raw.get("url"), total_hits, total_external)
    return stage


def _probe_causes(causes, result, host):
    if not isinstance(result, dict):
        return
    if result.get("unreachable"):
        causes.add("node_unreachable", "%s: %s" % (host, result.get("msg")), hosts=[host])
        return
    if _timed_out(result) or result.get("stage") == "timeout":
        causes.add("tier_unreachable", "LMCache probe on %s timed out" % host, hosts=[host])
        return
    text = "%s\n%s" % (" ".join(str(result.get(k) or "") for k in ("error", "msg")), result.get("stderr_tail") or "")
    if str(result.get("remote_url") or "").startswith("fs:///"):
        causes.add("fs_url_no_host", "LMCache remote_url on %s is %s" % (host, result.get("remote_url")), hosts=[host])
    if result.get("stage") == "connect":
        causes.add("lmcache_remote_not_configured", "%s: %s" % (host, result.get("error")), hosts=[host])
        return
    if not causes_from_text(causes, text, host=host) and result.get("stage") in ("lookup", "compare", "load"):
        causes.add("tier_error", "%s: %s" % (host, result.get("error")), hosts=[host])


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
                          "reachable": not node.get("unreachable")})
    detect_config_causes(causes, instance_configs, lmcache_by_node, fs_by_node, expected, tier)

    stages = stages or {}
    out_stages = []
    for stage_id in STAGE_IDS:
        stage = _stage(stage_id, stage_id in required)
        raw = stages.get(stage_id)
        if stage_id == "instances":
            eval_instances(stage, raw, causes)
        elif stage_id == "tier_write":
            eval_tier_write(stage, raw, causes)
        elif stage_id == "local_hit":
            eval_local_hit(stage, raw, causes, settings)
        elif stage_id == "cross_instance":
            eval_cross_instance(stage, raw, causes, settings)
        elif stage_id == "router":
            eval_router(stage, raw, causes, settings)
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


def summary_lines(report):
    """A few lines for the end of the play."""
    lines = ["Validation %s: %s (%d pass, %d fail, %d skipped) - run %s" % (
        report["run"].get("id"), report["result"].upper(), report["counts"][PASS], report["counts"][FAIL],
        report["counts"][SKIPPED], report["run"].get("id"))]
    causes = dict((c["id"], c) for c in report["causes"])
    for stage in report["stages"]:
        flag = "" if stage["required"] or stage["status"] != FAIL else " (not required)"
        lines.append("  %d %-14s %-7s %s%s" % (stage["number"], stage["id"], stage["status"].upper(), stage["reason"], flag))
        for cid in stage["causes"]:
            lines.append("      cause %s: %s" % (cid, causes[cid]["message"]))
    return lines


def _md_escape(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_value(value):
    if isinstance(value, float):
        return "%g" % value
    if isinstance(value, list):
        return ", ".join(_md_value(v) for v in value)
    if value is None:
        return "-"
    return _md_escape(value)


def render_markdown(report):
    run = report["run"]
    out = ["# kvcache.offload validation report", "",
           "- Result: **%s** (%d pass, %d fail, %d skipped)" % (report["result"].upper(), report["counts"][PASS],
                                                                report["counts"][FAIL], report["counts"][SKIPPED]),
           "- Run: `%s`, started %s, finished %s" % (run.get("id"), run.get("started"), run.get("finished")),
           "- Tier: %s" % _md_value(run.get("tier_location") or report["fleet"]["expected"].get("tier")),
           "- Instances: %s" % ", ".join("%s/%s (%s)" % (e["host"], e["instance"], e["url"]) for e in report["fleet"]["endpoints"])]
    if run.get("lab_substitutes"):
        out.append("- LAB SUBSTITUTES: %s" % "; ".join(run["lab_substitutes"]))
    out += ["", "| # | stage | status | result |", "| --- | --- | --- | --- |"]
    for stage in report["stages"]:
        status = stage["status"].upper() + ("" if stage["required"] else " (optional)")
        out.append("| %d | %s | %s | %s |" % (stage["number"], _md_escape(stage["title"]), status, _md_escape(stage["reason"])))
    causes = dict((c["id"], c) for c in report["causes"])
    for stage in report["stages"]:
        out += ["", "## %d. %s: %s" % (stage["number"], stage["title"], stage["status"].upper()), "", _md_escape(stage["reason"])]
        if stage["numbers"]:
            out += ["", "| number | value |", "| --- | --- |"]
            for key, value in stage["numbers"].items():
                out.append("| %s | %s |" % (key, _md_value(value)))
        if stage["id"] == "instances" and stage["details"].get("instances"):
            out += ["", "| instance | /health | with key | TTFT s | without key |", "| --- | --- | --- | --- | --- |"]
            for row in stage["details"]["instances"]:
                cells = (row["host"], row["instance"], _md_value(row["health_status"]),
                         _md_value(row["completion_status"]), _md_value(row["ttft_s"]),
                         _md_value(row["without_key_status"]))
                out.append("| %s/%s | %s | %s | %s | %s |" % cells)
        if stage["causes"]:
            out += ["", "Causes detected:"]
            for cid in stage["causes"]:
                c = causes[cid]
                out.append("- **%s** (%s): %s. Fix: %s" % (cid, c["severity"], _md_escape(c["message"]), _md_escape(c["fix"])))
        elif stage["status"] == FAIL:
            out += ["", "No known cause detected: look at the journals of the instances (journalctl -u 'kvcache-vllm@*')."]
    others = [c for c in report["causes"] if not any(c["id"] in s["causes"] for s in report["stages"])]
    if others:
        out += ["", "## Other findings", ""]
        for c in others:
            out.append("- **%s** (%s): %s. Fix: %s" % (c["id"], c["severity"], _md_escape(c["message"]), _md_escape(c["fix"])))
    out += ["", "## Fleet configuration read from the nodes", "",
            "| instance | PYTHONHASHSEED | model | TP | KV dtype | connector | telemetry missing |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in report["fleet"]["instances"]:
        out.append("| %s/%s | %s | %s | %s | %s | %s | %s |" % (
            c["host"], c["instance"], _md_value(c["hash_seed"]), _md_value(c["model"]), _md_value(c["tensor_parallel_size"]),
            _md_value(c["kv_cache_dtype"]), _md_value(c["kv_connector"]), _md_value(c["telemetry_missing"] or "none")))
    out += ["", "| node | LMCache chunk_size | remote | fs tier mount | writable by service user |", "| --- | --- | --- | --- | --- |"]
    for n in report["fleet"]["nodes"]:
        lm = n.get("lmcache") or {}
        fs = n.get("fs_tier") or {}
        remote = lm.get("remote_url") or (",".join(lm.get("remote_storage_plugins") or []) + (
            " %s" % lm.get("fs_base_path") if lm.get("fs_base_path") else ""))
        mount = "-" if not fs else "%s (%s%s)" % (fs.get("mount_target"), fs.get("fstype"), ", ro" if fs.get("read_only") else "")
        cells = (n["host"], _md_value(lm.get("chunk_size")), _md_value(remote or lm.get("error")),
                 _md_value(mount), _md_value(fs.get("writable_by_service_user") if fs else None))
        out.append("| %s | %s | %s | %s | %s |" % cells)
    out.append("")
    return "\n".join(out)
