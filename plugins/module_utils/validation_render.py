# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The validation report as text: the summary lines for the end of the play and the
Markdown report for people (the JSON is the report dict of validation_stages.build_report).
"""

from __future__ import annotations

from ansible_collections.kvcache.offload.plugins.module_utils.validation_stages import FAIL, PASS, SKIPPED


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
    if "s3_expired_false_hits" in causes:
        lines.append("  warning s3_expired_false_hits: %s" % causes["s3_expired_false_hits"]["message"])
    for node in report["fleet"]["nodes"]:
        if node.get("validated") is False:
            lines.append("  not validated: %s (%s)" % (node["host"], node.get("reason")))
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
        if stage["id"] == "routing" and stage["details"].get("sessions"):
            out += ["", "| session | instances used | repeat turns on a holding instance | GPU prefix cache | shared tier | "
                    "recomputed | failed | unattributed |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
            for row in stage["details"]["sessions"]:
                src = row.get("sources") or {}
                out.append("| %s | %s | %s/%s | %s | %s | %s | %s | %s |" % (
                    row["session"], _md_escape(", ".join(row["instances_used"]) or "-"), row["repeat_on_holding_instance"],
                    row["repeat_turns"], src.get("gpu_prefix_cache", 0), src.get("shared_tier", 0), src.get("recomputed", 0),
                    row["failed"], row["unattributed"]))
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
        if n.get("validated") is False:
            out.append("| %s | not validated: %s | | | |" % (n["host"], _md_escape(n.get("reason"))))
            continue
        cells = (n["host"], _md_value(lm.get("chunk_size")), _md_value(remote or lm.get("error")),
                 _md_value(mount), _md_value(fs.get("writable_by_service_user") if fs else None))
        out.append("| %s | %s | %s | %s | %s |" % cells)
    out.append("")
    return "\n".join(out)
