#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: validation_report
short_description: Judge the validation stages, name the causes of failures and write the report
version_added: 0.1.0
description:
  - Takes the raw results the C(kvcache.offload.validation) role collected (registered results of
    M(kvcache.offload.chat_probe), M(kvcache.offload.metrics_snapshot), M(kvcache.offload.tier_inventory),
    M(kvcache.offload.lmcache_storage_probe), and what it read on the nodes) and decides per stage
    pass, fail or skipped, with numbers.
  - Detects causes from the nodes' configuration (PYTHONHASHSEED, model string, TP size, KV dtype and KV
    connector of every instance env file; chunk_size, hash algorithm and an C(fs:///) URL in every
    LMCache config; a missing, read-only or unwritable fs tier; missing telemetry variables) and from
    the errors (403, DNS, S3 addressing, timeouts, refused connections), and attaches them to the
    stages they explain.
  - Writes the report as JSON (schema in docs/validation-report.md) and Markdown into O(report_dir),
    named after O(report_name), plus copies named C(validation-latest.json) and C(validation-latest.md).
  - Returns C(changed=false) by design, also when it writes files. The report is a record of the
    run (like a log), not managed state; every run writes a new, timestamped pair of files, so
    reporting a change would make every run of C(site.yml) non-idempotent.
  - The module never fails because a stage failed; the role fails the play after the report is
    written (see RV(failed_required)).
author:
  - kvcache.offload developers (!UNKNOWN)
requirements:
  - PyYAML (an ansible-core dependency) to read the LMCache configs.
options:
  run:
    description:
      - Facts about the run that go into the report as they are (C(id), C(started), C(controller),
        C(tier_location), C(lab_substitutes), ...).
      - C(nodes_in_play) (the nodes the node part ran on) tells a node left out by a C(--limit) from one that did not
        finish.
    type: dict
    default: {}
  expected:
    description:
      - The fleet's settings from the inventory, compared with what the nodes run.
      - Keys used C(hash_seed), C(model), C(chunk_size), C(tier) (fs or s3), C(fs_path), C(s3_bucket),
        C(lmcache_mode), C(fs_must_be_mount).
    type: dict
    default: {}
  instances:
    description:
      - The instances validated, C(host), C(instance), C(url).
    type: list
    elements: dict
    default: []
  nodes:
    description:
      - What the node part of the validation registered on each node, as a mapping node -> result (the role passes
        every node of the group; C({}) for a node without a result). A result carries C(run_id), C(host), C(unreachable),
        C(msg), C(env_slurps), C(lmcache_slurp), C(findmnt), C(write_test) (what was read for the cause analysis),
        C(instances), C(health), C(authed), C(unauthed) (stage 1's registered loop results) and C(lmcache_store) /
        C(lmcache_load) (its part of stage 6).
      - A node whose result is missing or of another run (C(run_id) is not C(run.id)) is reported not validated, with the
        reason (left out of the node play when it is not in C(run.nodes_in_play), else the play did not finish on it).
      - A list of results (each with C(host)) is accepted too and taken as validated.
      - Only the settings named in the description are copied from the files into the report.
    type: raw
    default: []
  stages:
    description:
      - Registered results of the controller's stages by stage id - C(tier_write) and C(local_hit) C({a, before, probe,
        metrics, after, listed_on}), C(cross_instance) C({a, b, cold, hit, metrics}), C(router) C({a, url, router_hosts,
        health, probe, metrics}), C(routing) C({a, url, router_hosts, health, implementation, policy, min_ratio, instances,
        answering, backends, probe}) (probe - a registered C(kvcache.offload.routing_probe) result).
        Stage 1 and stage 6 are read from O(nodes) unless given here.
      - The module decides which stages could not run and why (no instance answered, no second instance, no router host,
        a router that does not answer) and reports the stages not in C(settings.selected_stages) as not selected.
      - A stage given as a dict with C(skipped=true) and a C(reason) is reported skipped; a missing one as not run.
      - The shapes are described in docs/roles/validation.md.
    type: dict
    default: {}
  settings:
    description:
      - C(selected_stages) (the stages to report, the others are not selected; all when absent), C(required_stages)
        (stage ids whose failure fails the run), C(node_group) and C(router_group) (named in skip reasons),
        C(router_required) (a router host that does not answer fails stage 5 instead of skipping it),
        C(min_external_tokens), C(min_local_hit_tokens), C(require_ttft_drop).
    type: dict
    default: {}
  report_dir:
    description:
      - Directory for the report files; created when missing. Omit to write nothing.
    type: path
  report_name:
    description:
      - Base name of the report files (without extension).
    type: str
    default: validation
notes:
  - In check mode the report is built and returned but no file is written.
extends_documentation_fragment:
  - kvcache.offload.read_only
"""

EXAMPLES = r"""
- name: Judge the stages and write the report
  kvcache.offload.validation_report:
    run:
      id: "{{ run_id }}"
    expected:
      hash_seed: "{{ kvcache_hash_seed }}"
      tier: fs
      fs_path: /mnt/kvcache
    instances: "{{ instances }}"
    nodes: "{{ node_results }}"
    stages: "{{ controller_stages }}"
    settings:
      required_stages: [instances, tier_write, local_hit, cross_instance, router, lmcache_probe]
    report_dir: "{{ playbook_dir }}/../build/reports"
    report_name: "validation-{{ run_id }}"
  delegate_to: localhost
  register: report
"""

RETURN = r"""
report:
  description: The whole report (the JSON file's content); schema in docs/validation-report.md.
  returned: always
  type: dict
result:
  description: C(pass) when no required stage failed, else C(fail).
  returned: always
  type: str
  sample: pass
failed_required:
  description: Ids of the required stages that failed.
  returned: always
  type: list
  elements: str
summary:
  description: A few lines for people, one per stage with its causes.
  returned: always
  type: list
  elements: str
paths:
  description: Files written (C(json), C(markdown), C(latest_json), C(latest_markdown)); empty in check mode.
  returned: always
  type: dict
"""

import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kvcache.offload.plugins.module_utils.validation_render import render_markdown, summary_lines
from ansible_collections.kvcache.offload.plugins.module_utils.validation_stages import build_report


def argument_spec():
    return dict(
        run=dict(type="dict", default={}),
        expected=dict(type="dict", default={}),
        instances=dict(type="list", elements="dict", default=[]),
        nodes=dict(type="raw", default=[], no_log=False),
        stages=dict(type="dict", default={}),
        settings=dict(type="dict", default={}),
        report_dir=dict(type="path"),
        report_name=dict(type="str", default="validation"),
    )


def _write(path, text):
    """Write atomically (temp file in the same directory, then rename)."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.rename(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    if "/" in p["report_name"] or not p["report_name"]:
        module.fail_json(msg="report_name must be a plain file name without '/'")
    report = build_report(p["run"], p["expected"], p["instances"], p["nodes"], p["stages"], p["settings"])
    markdown = render_markdown(report)
    text = json.dumps(report, indent=2, sort_keys=False) + "\n"
    paths = {}
    if p["report_dir"] and not module.check_mode:
        try:
            if not os.path.isdir(p["report_dir"]):
                os.makedirs(p["report_dir"], mode=0o755)
            paths = {
                "json": os.path.join(p["report_dir"], p["report_name"] + ".json"),
                "markdown": os.path.join(p["report_dir"], p["report_name"] + ".md"),
                "latest_json": os.path.join(p["report_dir"], "validation-latest.json"),
                "latest_markdown": os.path.join(p["report_dir"], "validation-latest.md"),
            }
            for key, content in (("json", text), ("markdown", markdown), ("latest_json", text), ("latest_markdown", markdown)):
                _write(paths[key], content)
        except OSError as exc:
            module.fail_json(msg="cannot write the report into %s: %s" % (p["report_dir"], exc), report=report,
                             result=report["result"], failed_required=report["failed_required"],
                             summary=summary_lines(report), paths={})
    # changed=False by design: the report is a record of the run, not managed state (see DOCUMENTATION).
    module.exit_json(changed=False, report=report, result=report["result"], failed_required=report["failed_required"],
                     summary=summary_lines(report), paths=paths)


if __name__ == "__main__":
    main()
