# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cause catalogue of the validation report and the detection of causes.

CAUSES names every cause (severity, the stages it can explain, the fix); Causes collects the
ones found during a run. Causes are found in the nodes' configuration (detect_config_causes,
fed by validation_settings) and in failed results: error texts, tier_inventory,
chat_probe and lmcache_storage_probe results. The stage judges (validation_stages) call these.
"""

from __future__ import annotations

import re


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
                      "restarts it."),
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
    "routing_requests_failed": ("error", ("routing",),
                                "Requests through the router failed: check the router (systemctl status / journalctl of "
                                "its service on the router host, GET /health) and that every backend answers."),
    "routing_backends_differ": ("error", ("routing",),
                                "The router's backend list differs from the fleet's instances: re-run playbooks/router.yml "
                                "(the router role derives its backends from the inventory) so every instance, and only "
                                "they, are routed to."),
    "routing_unattributed": ("warning", ("routing",),
                             "Some requests could not be attributed to one instance (no instance's vllm:prompt_tokens "
                             "grew, or several did: other traffic on the fleet during the probe). Run the validation "
                             "when the fleet is idle, or check the instances' /metrics."),
    "routing_policy_unjudged": ("warning", ("routing",),
                                "The report knows no pass rule for this routing policy (cache-aware: cache_aware, "
                                "prefixaware, kvaware; cache-blind: round_robin, roundrobin, random, power_of_two): the "
                                "stage shows the numbers without judging them."),
    "node_unreachable": ("error", ("lmcache_probe", "tier_write", "gds_path"),
                         "Ansible could not reach the node: check the connection (SSH / docker) to it."),
    "node_left_out": ("warning", ("instances",),
                      "The node was not in the validation's node play (a --limit, or validation_node_group set only in "
                      "the inventory): its instances were not checked. Run playbooks/validate.yml without the --limit "
                      "(or -e validation_node_group=<group>) to validate it."),
    "node_not_validated": ("error", ("instances",),
                           "The node was in the validation's node play but did not finish it (it became unreachable "
                           "or a task failed): see the play's output for that node, fix the connection, run again."),
    "gds_nvidia_fs_not_loaded": ("error", ("gds_path",),
                                 "nvidia_fs is not loaded (no /proc/driver/nvidia-fs/stats, gdscheck shows no nvidia_fs "
                                 "version): no I/O can take the GDS path. Run the gds role (it installs nvidia-fs for the "
                                 "driver branch and loads it); check dkms status and dmesg."),
    "gds_compat_mode": ("error", ("gds_path",),
                        "cuFile may or did fall back to POSIX (compat mode): set properties.allow_compat_mode and "
                        "force_compat_mode false in /etc/cufile.json (gds_allow_compat_mode: false, the gds role's "
                        "default), then fix what gdscheck -p names; gds_stats posix= counts compat-mode I/O."),
    "gds_no_rdma_mount": ("error", ("gds_path",),
                          "kvcache_fs_gds_path must lie on an NFS mount with proto=rdma (the kvcache_mount role with "
                          "RDMA): over TCP, or on a local directory, cuFile has no GDS path for NFS."),
    "gds_fs_unsupported": ("error", ("gds_path",),
                           "gdscheck -p does not list NFS as supported (or lists only compat): load rpcrdma and "
                           "nvidia_fs, mount with proto=rdma, and use an RDMA stack NVIDIA supports for NFS "
                           "(gds_rdma_stack, MOFED 5.1 and later)."),
    "gds_not_ready": ("error", ("gds_path",),
                      "gdscheck -p names what else keeps GDS from the tier (GPU, driver, RDMA devices, IOMMU): "
                      "follow its fix; the gds role refuses such a node before engines start."),
    "gds_counters_static": ("error", ("gds_path",),
                            "The nvidia-fs read/write counters did not grow while LMCache's GdsBackend stored and "
                            "loaded: the I/O did not take the GDS path (POSIX). With IO stats disabled "
                            "(rw_stats_enabled=0) they cannot grow: gds_nvfs_rw_stats: true. Else read cufile.log "
                            "(gds_cufile_log_dir) and gdscheck -p."),
    "gds_io_errors": ("error", ("gds_path",),
                      "nvidia-fs counted I/O errors, page-cache writes or DMA mapping errors during the probe: read "
                      "dmesg (nvidia-fs) and cufile.log; check IOMMU (off or pt) and the mount (proto=rdma)."),
    "gds_lmcache_posix": ("error", ("gds_path",),
                          "LMCache's GdsBackend itself chose POSIX I/O: it turns use_gds off on tmpfs/overlayfs when "
                          "use_gds is not set, and cuFile needs O_DIRECT files (extra_config.use_direct_io: true). "
                          "The lmcache role sets both with kvcache_fs_gds: re-run the nodes stage."),
    "gds_probe_failed": ("error", ("gds_path",),
                         "LMCache's GdsBackend could not store or load the probe chunk (or it came back different): "
                         "the error names the stage; cuFile errors (compat mode off) show a missing GDS path."),
    "lmcache_l2_disabled": ("error", ("tier_write", "cross_instance", "router", "lmcache_probe"),
                            "The node's LMCache server has given up on its L2 store: its S3 adapter's circuit breaker "
                            "opened after 3 connection errors in a row and stores and loads nothing, though the store "
                            "may answer again. With lmcache_s3_retry_after_seconds > 0 (the default, the collection's "
                            "half-open adapter) it tries again by itself that many seconds after it opened: validate again "
                            "then. With 0 (LMCache 0.5.6's own adapter) it never does: mark the node's server for the rolling "
                            "restart (touch /etc/kvcache/lmcache-server.restart-pending on the node) and run "
                            "playbooks/nodes.yml, which restarts it and its engines node by node, drained from the router."),
    "s3_expired_false_hits": ("warning", ("local_hit", "cross_instance", "router"),
                              "LMCache 0.5.6's S3 connector caches the size of every object an engine stored or found, "
                              "for the life of the process: once the bucket's expiration rule deletes the object, that "
                              "engine's lookups keep reporting the chunk (its load fails, vLLM recomputes, and the engine "
                              "never stores it again). Restart the engines more often than the expiration "
                              "(playbooks/rolling_upgrade.yml, no downtime), or raise storagegrid_s3_expiration_days above "
                              "their planned lifetime; see docs/roles/validation.md, 'Deleted objects'."),
    "router_unhealthy": ("error", ("router",),
                         "The router answers but fails the probe: check its backends and logs (roles/router)."),
}


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
                           "; %s do not run with the fleet's kvcache_hash_seed (values are not shown: the seed "
                           "is a fleet secret)" % ", ".join(_label(c) for c in odd) if want is not None else ""),
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


def detect_l2_disabled(causes, host, adapters):
    """L2 adapters of a node's LMCache server whose circuit breaker is open (error lmcache_l2_disabled).

    adapters: storage_manager.l2_adapters of the server's GET /status (None when not read)."""
    if not isinstance(adapters, list):
        return []
    found = []
    for index, adapter in enumerate(adapters):
        if isinstance(adapter, dict) and adapter.get("connection_disabled"):
            found.append("%s: adapter %d (%s, %s) has its circuit breaker open after %s connection failures%s" % (
                host, index, adapter.get("type") or "?", adapter.get("endpoint") or "no endpoint",
                adapter.get("connection_failures"),
                "; it tries S3 again %s s after it opened" % adapter["retry_after_seconds"]
                if adapter.get("retry_after_seconds") else "; it never tries again until the server restarts"))
    for text in found:
        causes.add("lmcache_l2_disabled", text, hosts=[host])
    return found


def detect_expired_false_hits(causes, host, uptime, expiration_days):
    """Engines that have run longer than the s3 tier's expiration rule (warning s3_expired_false_hits).

    uptime: the registered `<unit> <MainPID> <seconds>` lines of diagnose_node.yml."""
    try:
        days = int(expiration_days or 0)
    except (TypeError, ValueError):
        return []
    if days <= 0 or not isinstance(uptime, dict) or uptime.get("rc") not in (0, None):
        return []
    old = []
    for line in (uptime.get("stdout") or "").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit() and int(parts[2]) > days * 86400:
            old.append("%s (%.1f days)" % (parts[0], int(parts[2]) / 86400.0))
    if old:
        causes.add("s3_expired_false_hits", "%s: %s ran longer than the bucket's %d-day expiration" % (
            host, ", ".join(old), days), hosts=[host])
    return old
