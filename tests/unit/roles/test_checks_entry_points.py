# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A role's input checks have one name, and preflight runs every one through its entry point.

- The input checks of a role are tasks/checks.yml; no role has tasks/validate.yml (the word
  `validate` belongs to the validation role, the end-to-end proof) or a `validate` entry point.
- Every role with checks has a `checks` entry point in meta/argument_specs.yml that types
  every role-prefixed variable the checks read, and its main.yml runs them.
- The checks only check: no fact gathering in them (tasks/main.yml or preflight gathers).
- playbooks/preflight.yml runs every role's checks with `tasks_from: checks`, and every role
  it includes has an entry point named exactly like its tasks_from: ansible-core validates
  the entry point whose name is the tasks_from string, so `tasks_from: checks.yml` would
  run the checks with no type check at all.
- preflight.yml imports the stage playbooks in checks-only mode (kvcache_checks_only: true), where
  they include each role at kvcache's __kvcache_tasks_from (`checks`): in that mode no role is
  included at any other entry point (preflight changes nothing), unless the include is skipped
  (`when: not kvcache_checks_only | bool`).
"""

from __future__ import absolute_import, division, print_function

import glob
import os
import re

import pytest
import yaml

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLES = os.path.join(ROOT, "roles")
PREFLIGHT = os.path.join(ROOT, "playbooks", "preflight.yml")
COLLECTION = "kvcache.offload."
INCLUDE_ROLE = {"include_role", "import_role", "ansible.builtin.include_role", "ansible.builtin.import_role"}
# Modules that gather facts; the checks read facts, the caller gathers them.
GATHERING = {"setup", "ansible.builtin.setup", "gather_facts", "ansible.builtin.gather_facts",
             "include_vars", "ansible.builtin.include_vars", "gpu_facts", "kvcache.offload.gpu_facts",
             "package_facts", "ansible.builtin.package_facts", "service_facts", "ansible.builtin.service_facts"}
# kvcache_prune's entry point types what its sizing check reads (and its preflight mode),
# not every option of the pruner; the other roles' checks entry points reuse main's options.
SUBSET_ENTRY_POINTS = {"kvcache_prune"}


def load(path):
    with open(path) as handle:
        return yaml.safe_load(handle)


def role_names():
    return sorted(os.path.basename(path) for path in glob.glob(os.path.join(ROLES, "*")) if os.path.isdir(path))


def roles_with_checks():
    return {name for name in role_names() if os.path.exists(os.path.join(ROLES, name, "tasks", "checks.yml"))}


def entry_points(role):
    path = os.path.join(ROLES, role, "meta", "argument_specs.yml")
    if not os.path.exists(path):
        return {}
    return (load(path) or {}).get("argument_specs") or {}


def all_entry_points():
    return {name: entry_points(name) for name in role_names()}


def walk_tasks(tasks):
    """Every task of a list, blocks (block, rescue, always) included."""
    for task in tasks or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from walk_tasks(task.get(key))


IMPORT_PLAYBOOK = ("ansible.builtin.import_playbook", "import_playbook")
STAGE_ENTRY = "{{ __kvcache_tasks_from }}"
SKIPPED_IN_CHECKS_ONLY = "not kvcache_checks_only | bool"
FLEET_DEFAULTS = COLLECTION + "kvcache"


def expand(plays, base, import_vars=None):
    """The plays of a playbook with its imports followed: (play, the import's vars)."""
    for play in plays or []:
        target = next((play[key] for key in IMPORT_PLAYBOOK if key in play), None)
        if target is None:
            yield play, dict(import_vars or {})
            continue
        path = os.path.join(base, target)
        yield from expand(load(path), os.path.dirname(path), dict(import_vars or {}, **(play.get("vars") or {})))


def _conditions(task):
    when = task.get("when")
    return when if isinstance(when, list) else [when] if when else []


def role_includes(plays):
    """(play name, task name, role, tasks_from) for every role a playbook runs; tasks_from None means main.

    plays: plays, or (play, import vars) pairs from expand(). In checks-only mode (kvcache_checks_only in the
    import's vars) the stage entry point is `checks`, and an include skipped in that mode is left out."""
    for entry in plays or []:
        play, import_vars = entry if isinstance(entry, tuple) else (entry, {})
        checks_only = bool(import_vars.get("kvcache_checks_only"))
        for item in play.get("roles") or []:
            role = item if isinstance(item, str) else item.get("role") or item.get("name")
            yield play.get("name"), "roles:", role, None
        for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
            for task in walk_tasks(play.get(section)):
                for action in INCLUDE_ROLE & set(task):
                    if checks_only and SKIPPED_IN_CHECKS_ONLY in _conditions(task):
                        continue
                    args = task[action]
                    tasks_from = args.get("tasks_from")
                    if tasks_from == STAGE_ENTRY:
                        tasks_from = "checks" if checks_only else "main"
                    yield play.get("name"), task.get("name"), args["name"], tasks_from


def short(role):
    return role[len(COLLECTION):] if role.startswith(COLLECTION) else role


def preflight_problems(plays, specs, with_checks):
    """What is wrong with how a preflight playbook runs the roles' checks (empty: nothing)."""
    problems = []
    checked = set()
    for play, task, role, tasks_from in role_includes(plays):
        name = short(role)
        entry = "main" if tasks_from is None else tasks_from
        known = specs.get(name) or {}
        where = "%s / %s: %s" % (play, task, role)
        if entry not in known:
            problems.append("%s with tasks_from %r: no argument_specs entry point named %r (it has %s), so "
                            "ansible-core type-checks nothing before these tasks" % (where, tasks_from, entry, sorted(known)))
        if tasks_from is not None and os.path.splitext(tasks_from)[0] == "checks":
            if tasks_from != "checks":
                problems.append("%s: tasks_from %r; use 'checks', the entry point's name" % (where, tasks_from))
            else:
                checked.add(name)
    for name in sorted(set(with_checks) - checked):
        problems.append("role %s has tasks/checks.yml, but the preflight playbook does not run it with tasks_from: checks"
                        % name)
    return problems


def test_no_role_has_validate_tasks_or_entry_point():
    assert glob.glob(os.path.join(ROLES, "*", "tasks", "validate.yml")) == []
    assert [name for name, specs in all_entry_points().items() if "validate" in specs] == []


def test_the_roles_with_checks():
    # The eleven roles that had tasks/validate.yml, gds and observability; a new role with input checks
    # joins the list.
    assert roles_with_checks() == {
        "container_runtime", "gds", "inference_env", "kvcache_firewall", "kvcache_metrics_proxy", "kvcache_mount", "kvcache_prune",
        "lmcache", "nvidia_driver",
        "observability", "ontap_nfs", "router", "s3_store", "storagegrid_s3", "vllm"}


@pytest.mark.parametrize("role", sorted(roles_with_checks()))
def test_main_runs_the_checks(role):
    tasks = load(os.path.join(ROLES, role, "tasks", "main.yml"))
    included = [task.get("ansible.builtin.include_tasks") for task in walk_tasks(tasks)]
    assert "checks.yml" in included


@pytest.mark.parametrize("role", sorted(roles_with_checks()))
def test_checks_gather_no_facts(role):
    tasks = load(os.path.join(ROLES, role, "tasks", "checks.yml"))
    gathering = [(task.get("name"), sorted(GATHERING & set(task))) for task in walk_tasks(tasks) if GATHERING & set(task)]
    assert gathering == []


@pytest.mark.parametrize("role", sorted(roles_with_checks()))
def test_checks_entry_point_types_what_the_checks_read(role):
    specs = entry_points(role)
    assert "checks" in specs, "roles/%s/meta/argument_specs.yml has no checks entry point" % role
    options = set((specs["checks"] or {}).get("options") or {})
    with open(os.path.join(ROLES, role, "tasks", "checks.yml")) as handle:
        text = handle.read()
    # The role's public variables (role_name_*): not its internal ones (__role_name_*), not
    # filters (kvcache.offload.role_name_*), not a family named in a message (role_name_*).
    read = set(re.findall(r"(?<![A-Za-z0-9_.])%s_[a-z0-9_]*[a-z0-9](?![A-Za-z0-9_*])" % re.escape(role), text))
    assert sorted(read - options) == []
    if role not in SUBSET_ENTRY_POINTS:
        assert sorted(set(specs["main"]["options"]) - options) == []


def preflight_plays():
    return list(expand(load(PREFLIGHT), os.path.dirname(PREFLIGHT)))


def test_preflight_runs_every_roles_checks_by_entry_point():
    plays = preflight_plays()
    assert len(plays) > 10 and sum(1 for _play, v in plays if v.get("kvcache_checks_only")) > 8, "the stages were not imported"
    assert preflight_problems(plays, all_entry_points(), roles_with_checks()) == []


def test_preflight_includes_no_role_at_an_entry_point_that_changes_hosts():
    """In checks-only mode every stage include resolves to `checks`: nothing else of a role runs."""
    changing = ["%s / %s: %s at %s" % (play, task, role, tasks_from or "main")
                for play, task, role, tasks_from in role_includes(preflight_plays())
                if tasks_from != "checks" and role not in (FLEET_DEFAULTS, COLLECTION + "preflight")]
    assert changing == []


def test_the_stage_playbooks_include_every_role_at_the_stage_entry_point():
    """site.yml's stages and preflight's checks-only run are the same plays: one include, two entry points."""
    stages = [(play, v) for play, v in expand(load(os.path.join(ROOT, "playbooks", "site.yml")), os.path.join(ROOT, "playbooks"))
              if v.get("kvcache_checks_only")]
    assert stages, "site.yml does not import preflight.yml's checks-only stages"
    real = list(expand(load(os.path.join(ROOT, "playbooks", "site.yml")), os.path.join(ROOT, "playbooks")))
    names = [play.get("name") for play, v in real if not v.get("kvcache_checks_only") and play.get("name") != "Validate"]
    assert {play.get("name") for play, _vars in stages} <= set(names)


def test_checks_only_mode_resolves_the_stage_entry_point():
    play = {"name": "p", "tasks": [{"name": "t", "ansible.builtin.include_role": {"name": COLLECTION + "vllm",
                                                                                  "tasks_from": STAGE_ENTRY}},
                                   {"name": "ca", "ansible.builtin.include_role": {"name": COLLECTION + "ca_trust"},
                                    "when": SKIPPED_IN_CHECKS_ONLY}]}
    assert [i[2:] for i in role_includes([(play, {"kvcache_checks_only": True})])] == [(COLLECTION + "vllm", "checks")]
    assert [i[2:] for i in role_includes([(play, {})])] == [(COLLECTION + "vllm", "main"), (COLLECTION + "ca_trust", None)]


def _play(*tasks):
    return [{"name": "p", "roles": [{"role": "kvcache.offload.preflight"}], "tasks": list(tasks)}]


def _include(role, tasks_from):
    return {"name": "t", "ansible.builtin.include_role": {"name": COLLECTION + role, "tasks_from": tasks_from}}


SPECS = {"preflight": {"main": {}}, "lmcache": {"main": {}, "checks": {}}, "vllm": {"main": {}}}


def test_preflight_problems_refuses_the_file_name_form():
    problems = preflight_problems(_play(_include("lmcache", "checks.yml")), SPECS, {"lmcache"})
    assert any("no argument_specs entry point named 'checks.yml'" in p for p in problems)
    assert any("use 'checks'" in p for p in problems)
    assert any("role lmcache has tasks/checks.yml" in p for p in problems)


def test_preflight_problems_refuses_checks_without_an_entry_point():
    problems = preflight_problems(_play(_include("vllm", "checks")), SPECS, {"vllm"})
    assert problems == ["p / t: kvcache.offload.vllm with tasks_from 'checks': no argument_specs entry point named "
                        "'checks' (it has ['main']), so ansible-core type-checks nothing before these tasks"]


def test_preflight_problems_refuses_a_role_whose_checks_it_skips():
    problems = preflight_problems(_play(_include("lmcache", "checks")), SPECS, {"lmcache", "vllm"})
    assert problems == ["role vllm has tasks/checks.yml, but the preflight playbook does not run it with tasks_from: checks"]


def test_preflight_problems_accepts_the_entry_point_name():
    blocks = _play({"name": "b", "block": [_include("lmcache", "checks")]})
    assert preflight_problems(blocks, SPECS, {"lmcache"}) == []
