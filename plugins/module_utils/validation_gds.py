# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stage 7 of the validation: GPUDirect Storage carried the LMCache probe's KV on every node.

Each node of the node play (roles/validation/tasks/nodes_gds.yml) registers, at once on every
node: gds_facts before (gdscheck -p and the nvidia-fs counters), findmnt of gds_path, a store
and a load of its own chunk through LMCache's GdsBackend (lmcache_storage_probe backend=gds, two
processes, so the load reads from the file and not from the store's memory), optionally cuFile's
own counters of the probe processes (gds_stats -l 3), and gds_facts after. This file turns that
into one row per node and the causes of each way the I/O can fall back to POSIX. It judges with
plugins/module_utils/gds.py (the parsers and the nvidia-fs counter verdict).
"""

from __future__ import annotations

import json

from ansible_collections.kvcache.offload.plugins.module_utils import gds as g

GDS_OFF = ("GDS is off (kvcache_tier fs with kvcache_fs_gds: true turns it on): the KV tier uses POSIX I/O "
           "by design, no GPUDirect path to prove")

# gdscheck readiness problems (gds.readiness) -> the validation's cause.
_READINESS_CAUSE = {
    "nvidia_fs_not_loaded": "gds_nvidia_fs_not_loaded",
    "compat_allowed": "gds_compat_mode",
    "compat_forced": "gds_compat_mode",
    "fs_unsupported": "gds_fs_unsupported",
    "fs_not_listed": "gds_fs_unsupported",
}
# Causes of the nvidia-fs counter verdict (gds.gds_path_verdict) -> the validation's cause.
_PATH_CAUSE = {
    "nvidia_fs_not_loaded": "gds_nvidia_fs_not_loaded",
    "io_stats_disabled": "gds_counters_static",
    "no_gds_reads": "gds_counters_static",
    "no_gds_writes": "gds_counters_static",
    "gds_io_errors": "gds_io_errors",
    "page_cache_writes": "gds_io_errors",
    "dma_errors": "gds_io_errors",
    "cufile_compat_io": "gds_compat_mode",
}


def _ran(result):
    return isinstance(result, dict) and bool(result) and not result.get("skipped")


def rdma_mount(findmnt, path):
    """{checked, fstype, options, rdma, target, source} of the findmnt --json of gds_path."""
    state = {"checked": False, "path": path, "target": None, "source": None, "fstype": None, "options": None,
             "rdma": None}
    if not _ran(findmnt) or findmnt.get("rc") not in (0, None):
        return state
    try:
        fss = json.loads(findmnt.get("stdout") or "{}").get("filesystems") or []
    except ValueError:
        return state
    if not fss:
        return state
    fs = fss[0]
    options = [o.strip() for o in str(fs.get("options") or "").split(",")]
    state.update(checked=True, target=fs.get("target"), source=fs.get("source"), fstype=fs.get("fstype"),
                 options=",".join(options))
    state["rdma"] = str(fs.get("fstype") or "").startswith("nfs") and ("proto=rdma" in options or "proto=rdma6" in options)
    return state


def _cufile_posix(result):
    text = (result or {}).get("cufile_stats") if isinstance(result, dict) else None
    if not text:
        return None
    parsed = g.parse_cufile_stats(text)
    if not parsed["gpus"]:
        return None
    return g.cufile_compat_io(parsed)


def _probe_text(result):
    if not isinstance(result, dict):
        return "no result"
    if result.get("unreachable"):
        return "unreachable: %s" % (result.get("msg") or "")
    return "%s: %s" % (result.get("stage") or "error", result.get("error") or result.get("msg") or "failed")


def judge_node(host, raw, causes, filesystem="NFS"):
    """One node's row {host, ok, reads, writes, ...}; adds the causes it finds."""
    raw = raw or {}
    row = {"host": host, "ok": False, "problems": []}
    before = raw.get("before") or {}
    after = raw.get("after") or {}
    store = raw.get("store") or {}
    load = raw.get("load") or {}
    problems = row["problems"]

    def cause(cause_id, what):
        causes.add(cause_id, "%s: %s" % (host, what), hosts=[host])
        problems.append(what)

    if any(isinstance(r, dict) and r.get("unreachable") for r in (before, after, store, load)):
        cause("node_unreachable", "the node became unreachable during the GDS stage")
        return row

    facts_before = before.get("gds") or {}
    facts_after = after.get("gds") or {}
    # gdscheck -p readiness: the ways GDS is off before any I/O.
    for problem in before.get("problems") or []:
        cause_id = _READINESS_CAUSE.get(problem.get("code"), "gds_not_ready")
        cause(cause_id, "gdscheck -p: %s" % problem.get("what"))
    row["gdscheck"] = {"release": (facts_before.get("gdscheck") or {}).get("gds_release"),
                       "nvidia_fs": (facts_before.get("gdscheck") or {}).get("nvidia_fs_version"),
                       "compat_mode": facts_before.get("compat_mode")}

    mount = rdma_mount(raw.get("mount"), raw.get("gds_path"))
    row["mount"] = mount
    if not mount["checked"]:
        cause("gds_no_rdma_mount", "findmnt found no mount for gds_path %s" % raw.get("gds_path"))
    elif not mount["rdma"]:
        cause("gds_no_rdma_mount", "gds_path %s lies on %s (%s, %s): not NFS over RDMA (proto=rdma)" % (
            raw.get("gds_path"), mount["target"], mount["fstype"], mount["options"]))

    # LMCache's own GDS backend: a store and a load in two processes.
    for action, result in (("store", store), ("load", load)):
        if not result.get("ok"):
            cause("gds_probe_failed", "LMCache GdsBackend %s failed (%s)" % (action, _probe_text(result)))
        elif result.get("use_gds") is False:
            cause("gds_lmcache_posix", "LMCache's GdsBackend ran with use_gds false on %s (fstype %s): POSIX I/O" % (
                result.get("gds_path"), result.get("gds_fstype")))
        elif result.get("use_direct_io") is False:
            cause("gds_lmcache_posix", "LMCache's GdsBackend opened its files without O_DIRECT (use_direct_io false): "
                                       "cuFile takes the GDS path only for O_DIRECT files")
    if store.get("ok") and load.get("ok") and store.get("sha256") != load.get("sha256"):
        cause("gds_probe_failed", "the chunk read back through GDS differs from the one stored (sha256)")

    # The nvidia-fs counters around the probe, and cuFile's own count of POSIX (compat) I/O.
    if not _ran(after):
        cause("gds_probe_failed", "the nvidia-fs counters were not read after the probe (%s)" % _probe_text(after))
    else:
        verdict = g.gds_path_verdict(facts_before.get("nvfs"), facts_after.get("nvfs"))
        row["reads"], row["writes"] = verdict["reads"], verdict["writes"]
        row["read_mib"] = g._delta(facts_before.get("nvfs"), facts_after.get("nvfs"), "reads", "mib") \
            if facts_before.get("nvfs") and facts_after.get("nvfs") else None
        row["write_mib"] = g._delta(facts_before.get("nvfs"), facts_after.get("nvfs"), "writes", "mib") \
            if facts_before.get("nvfs") and facts_after.get("nvfs") else None
        for item in verdict["causes"]:
            cause(_PATH_CAUSE.get(item["code"], "gds_counters_static"), item["what"])
        if facts_after.get("nvfs") is not None and facts_before.get("nvfs") is None:
            cause("gds_counters_static", "no nvidia-fs counters before the probe to compare with")
    posix = [p for p in (_cufile_posix(store), _cufile_posix(load)) if p]
    if posix:
        row["cufile_posix"] = {"reads": sum(p["reads"] for p in posix), "writes": sum(p["writes"] for p in posix)}
        if row["cufile_posix"]["reads"] or row["cufile_posix"]["writes"]:
            cause("gds_compat_mode", "cuFile served %(reads)d reads and %(writes)d writes through POSIX (gds_stats "
                                     "posix=): compat mode carried the probe" % row["cufile_posix"])
    row["ok"] = not problems
    return row


def gds_raw(validated, expected, settings):
    """Stage 7's input from the nodes' results, or why it does not run."""
    expected = expected or {}
    if not expected.get("gds"):
        return {"skipped": True, "reason": GDS_OFF}
    nodes = [(host, r.get("gds")) for host, r in validated]
    ran = [(host, raw) for host, raw in nodes if isinstance(raw, dict) and raw and not raw.get("skipped")]
    if not ran:
        return {"skipped": True, "reason": "no node of %s ran the GDS probe" % settings.get("node_group", "the node group")}
    return {"nodes": ran, "gds_path": expected.get("gds_path")}


def eval_gds_path(stage, raw, causes, skipped):
    """Judge stage 7. skipped(stage, raw) is validation_stages._skipped."""
    if skipped(stage, raw):
        return stage
    rows = [judge_node(host, dict(node_raw, gds_path=node_raw.get("gds_path") or raw.get("gds_path")), causes)
            for host, node_raw in raw.get("nodes") or []]
    good = [r for r in rows if r["ok"]]
    stage["numbers"] = {"nodes": len(rows), "nodes_on_gds": len(good),
                        "nvfs_reads": sum(r.get("reads") or 0 for r in rows),
                        "nvfs_writes": sum(r.get("writes") or 0 for r in rows)}
    stage["details"] = {"gds_path": raw.get("gds_path"), "nodes": rows}
    bad = [r for r in rows if not r["ok"]]
    if bad:
        stage["status"] = "fail"
        stage["reason"] = "; ".join("%s: %s" % (r["host"], ", ".join(r["problems"])) for r in bad)
    else:
        stage["status"] = "pass"
        stage["reason"] = "LMCache's GdsBackend stored and loaded bit-exact through nvidia-fs on %s (reads +%d, " \
                          "writes +%d, no error, no compat-mode I/O)" % (
                              ", ".join(r["host"] for r in rows), stage["numbers"]["nvfs_reads"],
                              stage["numbers"]["nvfs_writes"])
    return stage
