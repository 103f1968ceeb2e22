# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the validation read on the nodes, parsed: slurped files, instance env files and
their VLLM_ARGS, the LMCache config, and the fs tier's mount state.

The validation role reads the instance env files, the LMCache config, `findmnt` of the fs
tier and a write test as the service user on every node; these functions turn those raw
results into the settings the cause detection (validation_causes) compares. No verdicts here.
"""

from __future__ import annotations

import base64
import json
import os
import shlex

from ansible_collections.kvcache.offload.plugins.module_utils.envfile import parse_env_text

try:
    import yaml
    HAS_YAML = True
except ImportError:  # pragma: no cover - ansible-core depends on PyYAML
    yaml = None
    HAS_YAML = False

# Variables every engine unit must set so nothing phones home (FACTS: LMCache posts usage
# data to its vendor by default).
TELEMETRY_ENV = (("LMCACHE_TRACK_USAGE", "false"), ("DO_NOT_TRACK", "1"), ("VLLM_NO_USAGE_STATS", "1"))
TELEMETRY_PRESENT_ONLY = ("PROMETHEUS_MULTIPROC_DIR",)


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


FLEET_SEED = "the fleet's seed"
UNSET_SEEDS = (None, "", "random")


def label_seeds(instance_configs, expected):
    """Replace each PYTHONHASHSEED read from the nodes by a label, and the fleet's by FLEET_SEED.

    The seed is a fleet secret (LMCache object names derive from it; docs/security.md), so
    the report, its causes and its Markdown name which instances share a seed, never its value:
    the fleet's own value is FLEET_SEED, any other is 'another seed #N' (equal values, equal N),
    and an unset or 'random' seed keeps its (public) value. Returns (configs, expected), copies.
    """
    expected = dict(expected or {})
    want = expected.get("hash_seed")
    want = None if want in UNSET_SEEDS else str(want)
    others = {}
    out = []
    for config in instance_configs:
        if not config:
            out.append(config)
            continue
        config = dict(config)
        seed = config.get("hash_seed")
        if seed not in UNSET_SEEDS:
            seed = str(seed)
            if seed == want:
                config["hash_seed"] = FLEET_SEED
            else:
                config["hash_seed"] = others.setdefault(seed, "another seed #%d" % (len(others) + 1))
        out.append(config)
    if want is not None:
        expected["hash_seed"] = FLEET_SEED
    return out, expected


def lmcache_settings(text):
    """The sharing-relevant keys of an LMCache config (secrets never copied)."""
    out = {"readable": False, "error": None, "chunk_size": None, "remote_url": None, "remote_storage_plugins": None,
           "fs_base_path": None, "pre_caching_hash_algorithm": None, "local_cpu": None}
    if text is None:
        out["error"] = "missing"
        return out
    if "LMCACHE_SERVER_ARGS=" in text:
        return lmcache_server_settings(text, out)
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


def lmcache_server_settings(text, out):
    """The same keys from the multiprocess server's env file (LMCACHE_SERVER_ARGS, LMCACHE_L2_ADAPTER)."""
    env = parse_env_text(text)
    args = shlex.split(env.get("LMCACHE_SERVER_ARGS") or "")

    def flag(name, default=None):
        return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else default

    try:
        adapter = json.loads(env.get("LMCACHE_L2_ADAPTER") or "{}")
    except ValueError as exc:
        out["error"] = "LMCACHE_L2_ADAPTER is not JSON: %s" % exc
        return out
    try:
        out["chunk_size"] = int(flag("--chunk-size", 256))
    except ValueError:
        out["error"] = "--chunk-size is not a number: %s" % flag("--chunk-size")
        return out
    if adapter.get("type") == "plugin" and isinstance(adapter.get("adapter_params"), dict) \
            and str(adapter.get("class_name", "")).endswith("S3L2Adapter"):
        # the lmcache role's half-open S3 adapter (kvcache_s3_l2) through LMCache's plugin adapter: an s3 L2
        adapter = dict(adapter["adapter_params"], type="s3")
    out["readable"] = True
    out["mode"] = "multiprocess"
    out["remote_storage_plugins"] = [adapter.get("type")] if adapter.get("type") else None
    out["fs_base_path"] = adapter.get("base_path")
    out["remote_url"] = ("s3://%s" % adapter["s3_endpoint"]) if adapter.get("s3_endpoint") else None
    # the server's own default (lmcache 0.5.6: blake3) unless given
    out["pre_caching_hash_algorithm"] = flag("--hash-algorithm", "server default")
    out["local_cpu"] = True
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
