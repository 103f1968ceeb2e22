"""roles/kvcache's defaults are the only place a fleet-wide default is written (issue #36 item 2).

kubespray's way: one defaults role every play sees. Every play of the collection's playbooks
lists kvcache.offload.kvcache first, every role that reads a fleet-wide setting depends on it,
and so nothing outside roles/kvcache writes `kvcache_<x> | default(<literal>)` again: such a
restatement drifts (validation's GDS path once fell back to kvcache_fs_path, where the real
default is kvcache_fs_path/gds).
"""
import os
import re

import pytest
import yaml

from test_hash_seed import repository_files

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
KVCACHE_DEFAULTS = os.path.join(ROOT, "roles", "kvcache", "defaults", "main.yml")
SCAN = ("roles", "playbooks", "molecule", "tests", "inventories", "extensions", "site.yml")
# A bare kvcache_* variable (not an attribute: `case.vars.kvcache_x`, `hostvars[h].kvcache_x`
# are another host's or a test case's values) piped to default() of a literal: a string, a
# number, true/false/none, an empty list or dict.
RESTATED = re.compile(r"""(?<![\w.\['"])(kvcache_\w+)\s*\|\s*default\(\s*(?:'[^']*'|"[^"]*"|-?\d[\d.]*|true|false|none|\[\]|\{\})\s*[,)]""",
                      re.IGNORECASE)
# Playbooks that are tools around the platform (the lab, AWX), not stages of it: they read no kvcache_* setting.
TOOL_PLAYBOOKS = ("awx_credential_types.yml", "lab_down.yml", "lab_info.yml", "lab_up.yml")


def restatements(paths):
    found = []
    for path in paths:
        if path.startswith(os.path.join(ROOT, "roles", "kvcache") + os.sep):
            continue
        with open(path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                for match in RESTATED.finditer(line):
                    found.append("%s:%d %s" % (os.path.relpath(path, ROOT), number, match.group(0).strip()))
    return found


def test_no_kvcache_variable_gets_a_literal_default_outside_roles_kvcache():
    found = restatements(repository_files(SCAN, (".yml", ".yaml", ".j2")))
    assert not found, ("restated defaults (give the default once, in roles/kvcache/defaults/main.yml or the owning "
                       "role's defaults, and let the play see it):\n" + "\n".join(found))


@pytest.mark.parametrize("line, hit", [
    ("when: kvcache_tier | default('fs') == 'fs'", True),
    ('x: "{{ kvcache_service_uid | default(2470) }}"', True),
    ("x: {{ kvcache_fs_gds|default(false) | bool }}", True),
    ("x: {{ kvcache_lab_volumes | default([]) }}", True),
    ("x: {{ hostvars[h].kvcache_tier | default('fs') }}", False),
    ("x: {{ case.vars.kvcache_mount_server | default('') }}", False),
    ("x: {{ __kvcache_firewall_body | default('') }}", False),
    ("x: {{ hostvars[h].kvcache_tier | default(kvcache_tier) }}", False),
    ("x: {{ kvcache_fs_gds_path | default(kvcache_fs_path) }}", False),
])
def test_the_scan_tells_a_restatement_from_another_hosts_value(tmp_path, line, hit):
    path = tmp_path / "t.yml"
    path.write_text(line + "\n")
    assert bool(restatements([str(path)])) is hit


def _plays(path):
    with open(path, encoding="utf-8") as handle:
        for play in yaml.safe_load(handle) or []:
            if "import_playbook" not in play and "ansible.builtin.import_playbook" not in play:
                yield play


def _role_name(entry):
    return entry if isinstance(entry, str) else entry.get("role") or entry.get("name")


def stage_plays():
    directory = os.path.join(ROOT, "playbooks")
    for name in sorted(os.listdir(directory)):
        if name.endswith(".yml") and name not in TOOL_PLAYBOOKS:
            for play in _plays(os.path.join(directory, name)):
                yield name, play


def test_every_play_sees_the_fleet_defaults_first():
    plays = list(stage_plays())
    assert len(plays) > 20, "the playbooks were not found"
    missing = ["%s: %s" % (name, play.get("name")) for name, play in plays
               if not play.get("roles") or _role_name(play["roles"][0]) != "kvcache.offload.kvcache"]
    assert not missing, "plays whose first role is not kvcache.offload.kvcache (the fleet defaults):\n" + "\n".join(missing)


def _fleet_variables():
    with open(KVCACHE_DEFAULTS, encoding="utf-8") as handle:
        return set(yaml.safe_load(handle))


def test_every_role_that_reads_a_fleet_setting_depends_on_roles_kvcache():
    names = _fleet_variables()
    assert {"kvcache_tier", "kvcache_service_uid", "kvcache_upgrade_serial"} <= names
    variable = re.compile(r"(?<![\w.\['\"])(%s)\b" % "|".join(sorted(names, key=len, reverse=True)))
    missing = []
    for role in sorted(os.listdir(os.path.join(ROOT, "roles"))):
        if role == "kvcache":
            continue
        base = os.path.join(ROOT, "roles", role)
        readers = []
        for sub in ("defaults", "vars", "tasks", "templates", "handlers"):
            for top, _dirs, files in os.walk(os.path.join(base, sub)):
                for name in files:
                    with open(os.path.join(top, name), encoding="utf-8", errors="replace") as handle:
                        # Jinja expressions and when: conditions; prose in msg: text names variables too
                        text = "\n".join(re.findall(r"\{\{.*?\}\}|\{%.*?%\}|^\s*(?:when|that|-)\b.*$", handle.read(), re.S | re.M))
                    if variable.search(text):
                        readers.append(os.path.relpath(os.path.join(top, name), base))
        if not readers:
            continue
        with open(os.path.join(base, "meta", "main.yml"), encoding="utf-8") as handle:
            dependencies = [_role_name(d) for d in (yaml.safe_load(handle).get("dependencies") or [])]
        if "kvcache.offload.kvcache" not in dependencies:
            missing.append("%s (reads them in %s)" % (role, ", ".join(readers[:3])))
    assert not missing, "roles that read kvcache_* settings without depending on kvcache.offload.kvcache: " + "; ".join(missing)


def test_every_play_that_reads_the_playbooks_shared_vars_sees_the_fleet_defaults():
    """playbooks/vars/*.yml read fleet defaults (kvcache_router_drain_timeout): a test play that loads one
    lists kvcache.offload.kvcache as the collection's plays do (molecule/router_container once did not)."""
    missing = []
    for path in repository_files(("molecule", "tests"), (".yml",)):
        with open(path, encoding="utf-8") as handle:
            if "playbooks/vars/" not in handle.read():
                continue
        for play in _plays(path):
            if any("playbooks/vars/" in str(f) for f in play.get("vars_files") or []):
                if "kvcache.offload.kvcache" not in [_role_name(r) for r in play.get("roles") or []]:
                    missing.append("%s: %s" % (os.path.relpath(path, ROOT), play.get("name")))
    assert not missing, "plays loading playbooks/vars/ without the fleet defaults: %s" % missing
