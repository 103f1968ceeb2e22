#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gds_facts
short_description: Read GPUDirect Storage readiness (gdscheck -p) and the nvidia-fs I/O counters of a node
version_added: 0.1.0
description:
  - >-
    Runs C(gdscheck -p) and parses it (both the C(Supported)/C(Unsupported) format of GDS 1.0 to 1.13 and the
    newer format that lists data paths, for example C(NFS : p2pdma, compat)), reads C(/proc/driver/nvidia-fs/stats)
    and the C(rw_stats_enabled) parameter of the nvidia_fs module.
  - Returns what keeps GDS from carrying the KV tier in RV(problems) (nvidia_fs not loaded, NFS not supported,
    compat mode on, RDMA devices of cufile.json not configured, GPU or driver not supported), each with a fix.
  - With O(baseline) (the RV(gds.nvfs) of an earlier call), says whether the I/O between the two calls went
    through GDS (RV(path)), that is, the nvidia-fs read and write counters grew, no errors, no page-cache writes, and, with
    O(cufile_stats_file), cuFile served no I/O in compat mode (POSIX).
  - Reads only; changes nothing.
author:
  - kvcache.offload contributors (@kvcache-offload)
options:
  gdscheck_path:
    description:
      - The gdscheck program. Empty looks for C(gdscheck) under C(/usr/local/cuda/gds/tools), then on C(PATH).
    type: path
    default: ""
  run_gdscheck:
    description: Run gdscheck. False reads only the nvidia-fs files (the validation's probe does this between its two calls).
    type: bool
    default: true
  gdscheck_output_file:
    description: Parse this file instead of running gdscheck. Only tests and offline analysis use it.
    type: path
  filesystem:
    description: The storage type of the KV tier as gdscheck names it in DRIVER CONFIGURATION.
    type: str
    default: NFS
  rdma_dev_addrs:
    description:
      - The addresses C(/etc/cufile.json) lists in C(properties.rdma_dev_addr_list). When not empty, gdscheck must
        report the RDMA devices configured and none down.
    type: list
    elements: str
    default: []
  allow_compat_mode:
    description: Accept compat mode (POSIX fallback) being on. Off, so a fallback is a problem and never a silent slowdown.
    type: bool
    default: false
  nvfs_stats_file:
    description: The nvidia-fs statistics file.
    type: path
    default: /proc/driver/nvidia-fs/stats
  rw_stats_param:
    description: The nvidia_fs module parameter that turns its read/write counters on.
    type: path
    default: /sys/module/nvidia_fs/parameters/rw_stats_enabled
  baseline:
    description: RV(gds.nvfs) of an earlier call; the counters' growth since then decides RV(path).
    type: dict
  cufile_stats_file:
    description:
      - Output of C(gds_stats -p PID -l 3) for an engine (needs C(profile.cufile_stats) 3 in cufile.json). Its
        PER_GPU C(posix=) counts are compat-mode I/O.
    type: path
  expect:
    description: Which I/O the probe made between O(baseline) and this call.
    type: list
    elements: str
    choices: [read, write]
    default: [read, write]
  fail_on_problems:
    description: Fail when RV(problems) is not empty, or when RV(path) is not ok.
    type: bool
    default: false
requirements:
  - Linux; the GDS tools (gds-tools, part of nvidia-gds) for gdscheck.
notes:
  - nvidia-fs counts reads and writes only with C(rw_stats_enabled=1) (the gds role sets it); with it off the counters
    prove nothing and RV(path) says so.
extends_documentation_fragment:
  - kvcache.offload.read_only
"""

EXAMPLES = r"""
- name: GDS readiness before any engine starts
  kvcache.offload.gds_facts:
    rdma_dev_addrs: "{{ gds_rdma_dev_addrs }}"
  register: gds

- name: Counters before the probe (gdscheck not needed)
  kvcache.offload.gds_facts:
    run_gdscheck: false
  register: before

- name: After the probe, KV reads and writes must have gone through GDS
  kvcache.offload.gds_facts:
    run_gdscheck: false
    baseline: "{{ before.gds.nvfs }}"
    fail_on_problems: true
"""

RETURN = r"""
gds:
  description: What the node reports.
  returned: always
  type: dict
  contains:
    gdscheck_path:
      description: The gdscheck that ran, or null.
      type: str
    gdscheck_rc:
      description: Its return code, or null.
      type: int
    gdscheck:
      description:
        - Parsed gdscheck -p (format C(status) or C(modes), gds_release, nvidia_fs_version, libcufile_version, drivers
          (per storage type status, modes, gds, compat), rdma, properties, gpus, platform), or null.
      type: dict
    compat_mode:
      description: C(allowed) and C(forced) from the CUFILE CONFIGURATION section.
      type: dict
    nvfs:
      description: Parsed C(/proc/driver/nvidia-fs/stats) (reads, writes, errors, io_stats, gpus, ...), or null when nvidia_fs is not loaded.
      type: dict
    rw_stats_enabled:
      description: The C(rw_stats_enabled) parameter of nvidia_fs, or null when unreadable.
      type: bool
    cufile_stats:
      description: Parsed O(cufile_stats_file), or null.
      type: dict
problems:
  description: What keeps GDS from carrying the tier, each with C(code), C(what) and C(fix); empty when ready.
  returned: always
  type: list
  elements: dict
  sample: [{"code": "compat_allowed", "what": "compat mode is on ...", "fix": "set properties.allow_compat_mode false ..."}]
path:
  description: With O(baseline), whether the I/O since then went through GDS (C(ok), C(reads), C(writes) growth, C(causes)).
  returned: when baseline is given
  type: dict
ansible_facts:
  description: The same RV(gds) as C(gds_facts).
  returned: always
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kvcache.offload.plugins.module_utils import gds as g

GDSCHECK_CANDIDATES = ("/usr/local/cuda/gds/tools/gdscheck", "/usr/local/cuda/gds/tools/gdscheck.py")


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def find_gdscheck(module, path):
    if path:
        return path if os.access(path, os.X_OK) else None
    for candidate in GDSCHECK_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return module.get_bin_path("gdscheck")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gdscheck_path=dict(type="path", default=""),
            run_gdscheck=dict(type="bool", default=True),
            gdscheck_output_file=dict(type="path"),
            filesystem=dict(type="str", default="NFS"),
            rdma_dev_addrs=dict(type="list", elements="str", default=[]),
            allow_compat_mode=dict(type="bool", default=False),
            nvfs_stats_file=dict(type="path", default="/proc/driver/nvidia-fs/stats"),
            rw_stats_param=dict(type="path", default="/sys/module/nvidia_fs/parameters/rw_stats_enabled"),
            baseline=dict(type="dict"),
            cufile_stats_file=dict(type="path"),
            expect=dict(type="list", elements="str", choices=["read", "write"], default=["read", "write"]),
            fail_on_problems=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    facts = {"gdscheck_path": None, "gdscheck_rc": None, "gdscheck": None, "compat_mode": None,
             "nvfs": None, "rw_stats_enabled": None, "cufile_stats": None}
    problems = []

    text = None
    if p["gdscheck_output_file"]:
        text = _read(p["gdscheck_output_file"])
        if text is None:
            module.fail_json(msg="Cannot read %s" % p["gdscheck_output_file"], gds=facts, problems=[])
    elif p["run_gdscheck"]:
        path = find_gdscheck(module, p["gdscheck_path"])
        if path is None:
            problems.append({"code": "gdscheck_missing",
                             "what": "gdscheck not found (%s)" % (p["gdscheck_path"] or ", ".join(GDSCHECK_CANDIDATES) + ", PATH"),
                             "fix": "install the GDS tools (nvidia-gds / gds-tools-<cuda>) with the gds role"})
        else:
            rc, out, err = module.run_command([path, "-p"])
            facts["gdscheck_path"], facts["gdscheck_rc"] = path, rc
            text = out + ("\n" + err if err else "")
    if text is not None:
        parsed = g.parse_gdscheck(text)
        facts["gdscheck"] = parsed
        facts["compat_mode"] = g.compat_mode(parsed["properties"])
        problems.extend(g.readiness(parsed, filesystem=p["filesystem"], rdma_dev_addrs=p["rdma_dev_addrs"],
                                    allow_compat=p["allow_compat_mode"]))

    stats = _read(p["nvfs_stats_file"])
    if stats is not None:
        facts["nvfs"] = g.parse_nvfs_stats(stats)
    param = _read(p["rw_stats_param"])
    if param is not None:
        facts["rw_stats_enabled"] = g.to_bool(param.strip())
    if p["cufile_stats_file"]:
        cufile = _read(p["cufile_stats_file"])
        if cufile is None:
            module.fail_json(msg="Cannot read %s" % p["cufile_stats_file"], gds=facts, problems=problems)
        facts["cufile_stats"] = g.parse_cufile_stats(cufile)

    result = {"changed": False, "gds": facts, "problems": problems, "ansible_facts": {"gds_facts": facts}}
    if p["baseline"] is not None:
        result["path"] = g.gds_path_verdict(p["baseline"], facts["nvfs"], cufile_stats=facts["cufile_stats"],
                                            expect_reads="read" in p["expect"], expect_writes="write" in p["expect"])
    if p["fail_on_problems"]:
        bad = ["%s: %s. Fix: %s" % (x["code"], x["what"], x["fix"]) for x in problems]
        if "path" in result and not result["path"]["ok"]:
            bad += ["%s: %s. Fix: %s" % (x["code"], x["what"], x["fix"]) for x in result["path"]["causes"]]
        if bad:
            result.pop("changed")
            module.fail_json(msg="GPUDirect Storage is not carrying the KV tier: " + " | ".join(bad), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
