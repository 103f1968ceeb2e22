#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: lmcache_storage_probe
short_description: Store and read back a synthetic KV chunk through LMCache's own remote storage code
version_added: 0.1.0
description:
  - Runs a small Python program with the interpreter of a node's inference venv, so that LMCache's
    own storage code (StorageManager and its RemoteBackend, configured from the node's LMCache config
    file) does the I/O against the configured shared tier (fs or S3).
  - O(action=store) writes a chunk of seeded random data under a key derived from O(probe_id) and
    returns its sha256; O(action=load), typically on another node, reads the chunk with the same
    O(probe_id) back and returns its sha256, which is compared with O(expected_sha256).
  - This proves the tier end to end with LMCache's code, independent of vLLM, and works on CPU.
  - In-process mode configurations only (C(remote_url) or C(remote_storage_plugins)); the
    multiprocess server's L2 adapters are not covered.
author:
  - kvcache.offload developers (!UNKNOWN)
requirements:
  - lmcache 0.5.x and torch in the venv of O(python) (on the managed node).
  - The C(timeout) command (GNU coreutils) on the managed node, and C(runuser) (util-linux) for O(run_as).
options:
  python:
    description:
      - Interpreter of the venv LMCache is installed in, for example V(/opt/kvcache/venv/bin/python).
    type: path
    required: true
  mode:
    description:
      - V(inprocess) probes the remote backend of the node's LMCache config (O(config_file)), the storage code vLLM's
        in-process connector runs.
      - V(multiprocess) probes the L2 adapter of the node's C(lmcache server), built with LMCache's adapter factory from
        the server's own C(--l2-adapter) JSON (C(LMCACHE_L2_ADAPTER) in O(server_env_file)), which is the storage code
        the server runs.
    type: str
    choices: [inprocess, multiprocess]
    default: inprocess
  config_file:
    description:
      - The node's LMCache configuration file (what C(LMCACHE_CONFIG_FILE) points to for vLLM). Required with
        O(mode=inprocess).
    type: path
  server_env_file:
    description:
      - With O(mode=multiprocess), the C(lmcache server)'s environment file; only its C(LMCACHE_L2_ADAPTER) and
        C(PYTHONPATH) (where a plugin adapter such as the lmcache role's half-open S3 adapter is imported from) are read.
    type: path
    default: /etc/kvcache/lmcache-server.env
  action:
    description:
      - V(store) writes the chunk, V(load) reads it back.
    type: str
    required: true
    choices: [store, load]
  probe_id:
    description:
      - Identifies the chunk; use the same value for the store and the load.
    type: str
    required: true
  model:
    description:
      - Model field of the probe's key. Keep it apart from real model strings, so probe objects are
        recognizable in the tier (kvcache.offload.tier_inventory lists them under this name).
    type: str
    default: kvcache-offload-probe
  expected_sha256:
    description:
      - With O(action=load), the sha256 returned by the store; the task fails when the chunk read
        back differs.
    type: str
  environment:
    description:
      - Extra environment variables for the program, for example C(LMCACHE_*) overrides or the S3
        credentials LMCache reads. Values are not logged.
    type: dict
    default: {}
  env_files:
    description:
      - Environment files (systemd C(EnvironmentFile=) syntax, C(KEY=VALUE) lines) read by the module
        and passed to the program, for example the root-only S3 credentials file the vLLM units use.
        Values are not logged. A missing file is an error.
      - O(environment) wins over the files.
    type: list
    elements: path
    default: []
  run_as:
    description:
      - Run the program as this user (with C(runuser)), for example the engines' service user, so the
        probe has the same rights on the tier as vLLM. The module itself must run as root to switch users
        (C(become=true)); it reads O(env_files) before switching.
      - Omit to run as the user the module runs as.
    type: str
  backend:
    description:
      - Which of LMCache's backends carries the chunk in in-process mode. V(remote) the remote backend
        (C(remote_url) / C(remote_storage_plugins)); V(gds) LMCache's C(GdsBackend) (cuFile on C(gds_path), GPUDirect
        Storage; needs a GPU); V(auto) the GDS backend when the config has C(gds_path) and no remote backend, else the
        remote one.
    type: str
    default: auto
    choices: [auto, remote, gds]
  gds_stats:
    description:
      - With the GDS backend, the C(gds_stats) program; the probe runs C(gds_stats -p <its pid> -l 3) after its I/O and
        returns cuFile's own counters in RV(cufile_stats) (PER_GPU C(posix=) counts compat-mode I/O).
      - Needs O(cufile_json) for the statistics level.
    type: path
  cufile_json:
    description:
      - With O(gds_stats), the node's C(/etc/cufile.json); the probe runs with a private copy of it with
        C(profile.cufile_stats) 3 (C(CUFILE_ENV_PATH_JSON)), so gds_stats can read the counters. Nothing else differs.
    type: path
  timeout:
    description:
      - Seconds the whole program may run (import, connect, put or get); it is killed after that.
    type: float
    default: 120.0
notes:
  - In check mode O(action=store) writes nothing and returns no hash; O(action=load) reads and runs.
  - The usage telemetry of LMCache and vLLM is switched off for the program (C(LMCACHE_TRACK_USAGE=false),
    C(DO_NOT_TRACK=1), C(VLLM_NO_USAGE_STATS=1)).
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: partial
    details: A store is skipped in check mode; a load runs.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
"""

EXAMPLES = r"""
- name: Store a synthetic chunk from the first node
  kvcache.offload.lmcache_storage_probe:
    python: /opt/kvcache/venv/bin/python
    config_file: /etc/kvcache/lmcache-config.yaml
    action: store
    probe_id: "validate-{{ ansible_date_time.epoch }}"
  delegate_to: "{{ groups['kvcache_nodes'][0] }}"
  run_once: true
  register: stored

- name: Read it back on every other node, bit-exact
  kvcache.offload.lmcache_storage_probe:
    python: /opt/kvcache/venv/bin/python
    config_file: /etc/kvcache/lmcache-config.yaml
    action: load
    probe_id: "{{ stored.probe_id }}"
    expected_sha256: "{{ stored.sha256 }}"
  when: inventory_hostname != groups['kvcache_nodes'][0]
"""

RETURN = r"""
probe_id:
  description: The probe id.
  returned: always
  type: str
action:
  description: The action.
  returned: always
  type: str
ok:
  description: The store landed (and C(contains) finds it), or the load returned the chunk.
  returned: always
  type: bool
key:
  description: LMCache's key string of the probe chunk.
  returned: when the program got that far
  type: str
  sample: kvcache-offload-probe@8@0@5c1f...@bfloat16
sha256:
  description: SHA-256 of the chunk's bytes.
  returned: when the chunk was written or read
  type: str
bytes:
  description: Size of the chunk in bytes.
  returned: when the chunk was written or read
  type: int
exists:
  description: LMCache's remote backend reports the key as present.
  returned: when the program got that far
  type: bool
match:
  description: With O(expected_sha256), the chunk read back is identical.
  returned: when action is load and expected_sha256 is given
  type: bool
connector:
  description: LMCache's remote connector class (for example FSConnector, S3Connector), or C(GdsBackend).
  returned: when connected
  type: str
backend:
  description: C(gds) when LMCache's GdsBackend carried the chunk.
  returned: with the GDS backend
  type: str
gds_path:
  description: The GDS backend's path, its file system type (C(gds_fstype)), C(use_gds) (false is LMCache's POSIX
    fallback) and C(use_direct_io) are returned with it.
  returned: with the GDS backend
  type: str
cufile_stats:
  description: Output of C(gds_stats -p <pid> -l 3) for the probe process (C(cufile_stats_error) when it could not run).
  returned: with the GDS backend and O(gds_stats)
  type: str
remote_url:
  description: C(remote_url) from the LMCache config.
  returned: when the config was read
  type: str
remote_storage_plugins:
  description: C(remote_storage_plugins) from the LMCache config.
  returned: when the config was read
  type: list
  elements: str
lmcache_version:
  description: LMCache version in the venv.
  returned: when LMCache imported
  type: str
stage:
  description:
    - Where it failed, one of cufile_json (the private copy of O(cufile_json) could not be made), import, connect,
      store, lookup, load, storage, timeout, program.
  returned: on failure
  type: str
error:
  description: The failure message.
  returned: on failure
  type: str
elapsed:
  description: Seconds the program ran.
  returned: when the program reported
  type: float
stderr_tail:
  description: The last lines of the program's stderr (LMCache logs), for diagnosis.
  returned: on failure
  type: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kvcache.offload.plugins.module_utils.envfile import parse_env_text
from ansible_collections.kvcache.offload.plugins.module_utils.lmcache_probe import SCRIPT, parse_output
from ansible_collections.kvcache.offload.plugins.module_utils.shared_args import timeout_spec


def argument_spec():
    spec = dict(
        python=dict(type="path", required=True),
        mode=dict(type="str", default="inprocess", choices=["inprocess", "multiprocess"]),
        config_file=dict(type="path"),
        server_env_file=dict(type="path", default="/etc/kvcache/lmcache-server.env"),
        action=dict(type="str", required=True, choices=["store", "load"]),
        probe_id=dict(type="str", required=True),
        model=dict(type="str", default="kvcache-offload-probe"),
        expected_sha256=dict(type="str"),
        environment=dict(type="dict", default={}, no_log=True),
        env_files=dict(type="list", elements="path", default=[]),
        run_as=dict(type="str"),
        backend=dict(type="str", default="auto", choices=["auto", "remote", "gds"]),
        gds_stats=dict(type="path"),
        cufile_json=dict(type="path"),
    )
    spec.update(timeout_spec(120.0))
    return spec


def _tail(text, lines=30):
    return "\n".join((text or "").splitlines()[-lines:])


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True,
                           required_if=[("mode", "inprocess", ("config_file",))])
    p = module.params
    result = dict(changed=False, probe_id=p["probe_id"], action=p["action"], ok=False)
    if p["timeout"] <= 0:
        module.fail_json(msg="timeout must be positive", **result)
    if "@" in p["model"] or "@" in p["probe_id"]:
        module.fail_json(msg="model and probe_id must not contain '@' (LMCache's key separator)", **result)
    if not os.access(p["python"], os.X_OK):
        result.update(stage="program", error="%s is not an executable interpreter" % p["python"])
        module.fail_json(msg="cannot run the LMCache probe: %s" % result["error"], **result)
    l2_adapter = None
    server_path = None
    if p["mode"] == "multiprocess":
        try:
            with open(p["server_env_file"]) as handle:
                server_env = parse_env_text(handle.read())
            l2_adapter = server_env.get("LMCACHE_L2_ADAPTER")
            # a plugin adapter (the lmcache role's half-open S3 adapter) is imported from the server's PYTHONPATH
            server_path = server_env.get("PYTHONPATH")
        except (IOError, OSError) as exc:
            result.update(stage="program", error="cannot read the LMCache server's env file: %s" % exc)
            module.fail_json(msg="cannot run the LMCache probe: %s" % result["error"], **result)
        if not l2_adapter:
            result.update(stage="connect", error="no LMCACHE_L2_ADAPTER in %s" % p["server_env_file"])
            module.fail_json(msg="cannot run the LMCache probe: %s" % result["error"], **result)
    elif not os.path.isfile(p["config_file"]):
        result.update(stage="program", error="LMCache config %s does not exist" % p["config_file"])
        module.fail_json(msg="cannot run the LMCache probe: %s" % result["error"], **result)
    if module.check_mode and p["action"] == "store":
        result["msg"] = "check mode: nothing stored"
        module.exit_json(**result)

    args = {"action": p["action"], "probe_id": p["probe_id"], "model": p["model"], "config_file": p["config_file"],
            "timeout": p["timeout"], "mode": p["mode"], "backend": p["backend"], "gds_stats": p["gds_stats"],
            "cufile_json": p["cufile_json"]}
    env = {}
    for path in p["env_files"]:
        try:
            with open(path) as handle:
                values = parse_env_text(handle.read())
        except (IOError, OSError) as exc:
            result.update(stage="program", error="cannot read env file %s: %s" % (path, exc))
            module.fail_json(msg="cannot run the LMCache probe: %s" % result["error"], **result)
        for value in values.values():
            if value:
                module.no_log_values.add(value)
        env.update(values)
    env.update((str(k), str(v)) for k, v in p["environment"].items())
    env.update(LMCACHE_TRACK_USAGE="false", DO_NOT_TRACK="1", VLLM_NO_USAGE_STATS="1")
    if l2_adapter:
        env["LMCACHE_L2_ADAPTER"] = l2_adapter
    if server_path:
        env["PYTHONPATH"] = server_path
    prefix = []
    if p["run_as"]:
        runuser = module.get_bin_path("runuser")
        if os.geteuid() != 0 or not runuser:
            result.update(stage="program", error="run_as needs root and runuser (util-linux) on the node")
            module.fail_json(msg="cannot run the LMCache probe: %s" % result["error"], **result)
        prefix = [runuser, "-u", p["run_as"], "--"]
    # coreutils timeout bounds the whole program, import of torch included.
    cmd = ["timeout", "--kill-after=10", "%.3f" % p["timeout"]] + prefix + [p["python"], "-c", SCRIPT, json.dumps(args)]
    rc, out, err = module.run_command(cmd, environ_update=env)
    report = parse_output(out)
    if report is None:
        stage = "timeout" if rc in (124, 137) else "program"
        message = ("the probe ran longer than %ss" % p["timeout"]) if stage == "timeout" else ("the probe printed no result (rc=%s)" % rc)
        result.update(stage=stage, error=message, stderr_tail=_tail(err))
        module.fail_json(msg="LMCache storage probe failed: %s" % message, **result)

    for key in ("ok", "key", "sha256", "bytes", "exists", "connector", "remote_url", "remote_storage_plugins",
                "lmcache_version", "stage", "error", "elapsed", "backend", "gds_path", "gds_fstype", "use_gds",
                "use_direct_io", "cufile_stats", "cufile_stats_error"):
        if key in report:
            result[key] = report[key]
    result["ok"] = bool(report.get("ok"))
    result["changed"] = p["action"] == "store" and result["ok"]
    if p["action"] == "load" and p["expected_sha256"]:
        result["match"] = result["ok"] and report.get("sha256") == p["expected_sha256"].lower()
    if not result["ok"]:
        result["stderr_tail"] = _tail(err)
        module.fail_json(msg="LMCache storage probe %s failed at %s: %s" % (p["action"], report.get("stage"), report.get("error")), **result)
    if result.get("match") is False:
        result.update(stage="compare", error="the chunk read back differs from the one stored")
        module.fail_json(msg="LMCache storage probe: %s (sha256 %s, expected %s)" % (result["error"], report.get("sha256"), p["expected_sha256"]),
                         **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
