"""roles/vllm/tasks/main.yml: vllm_restart_pending, rendered by Ansible's own templating from the
task file as Ansible reads it (YAML, then Jinja).

An instance marked for a restart by an earlier run that did not get to the rolling restart (the
mark `<conf dir>/<name>.restart-pending` is still there) must be in vllm_restart_pending, so that
the next run's rolling-restart play restarts it (playbooks/nodes.yml). With the escaped dot in
the folded scalar the regex saw a backslash, and such marks were never matched (issue #24, found
while merging the role's two finds).
"""
import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TASKS = os.path.join(ROOT, "roles", "vllm", "tasks", "main.yml")
TASK_NAME = "Say which instances wait for a restart (vllm_restart_pending)"
CONF = "/etc/kvcache/vllm"


def expression():
    with open(TASKS, encoding="utf-8") as handle:
        tasks = yaml.safe_load(handle)
    task = [t for t in tasks if t.get("name") == TASK_NAME]
    assert len(task) == 1, "task %r not found in %s" % (TASK_NAME, TASKS)
    return task[0]["ansible.builtin.set_fact"]["vllm_restart_pending"]


def pending(marked_now, files, instances=("cpu0", "cpu1")):
    """marked_now: instance names the marking task changed in this run; files: what the role's
    find of the configuration directory returned (settings files and marks)."""
    found = {"files": [{"path": "%s/%s" % (CONF, name)} for name in files]}
    variables = {
        "__vllm_instances": [{"name": name} for name in instances],
        # the marking task loops over (settings result, is-active result) pairs
        "__vllm_marked": {"results": [
            dict({"changed": name in marked_now, "item": [{"item": {"name": name}}, {}]},
                 **({} if name in marked_now else {"skipped": True}))
            for name in instances]},
        # the finds of the configuration directory (one since issue #24, two before)
        "__vllm_conf_found": found,
        "__vllm_marked_before": {"files": [f for f in found["files"] if f["path"].endswith(".restart-pending")]},
    }
    templar = Templar(loader=DataLoader(), variables=variables)
    source = expression()
    try:  # ansible-core 2.19+: templates are trusted only when marked
        from ansible.template import trust_as_template
        source = trust_as_template(source)
    except ImportError:  # pragma: no cover
        pass
    return list(templar.template(source))


def test_a_mark_left_by_an_earlier_run_is_pending():
    assert pending([], ["cpu0.env", "cpu1.env", "cpu1.restart-pending"]) == ["cpu1"]


@pytest.mark.parametrize("marked_now, files, expected", [
    # nothing marked, nothing left: the rerun that changes nothing
    ([], ["cpu0.env", "cpu1.env"], []),
    # marked in this run (in check mode the mark is not written: the task's result says it)
    (["cpu0"], ["cpu0.env", "cpu1.env"], ["cpu0"]),
    # both: sorted, once each
    (["cpu0"], ["cpu0.env", "cpu0.restart-pending", "cpu1.restart-pending"], ["cpu0", "cpu1"]),
    # a mark of an instance that left the inventory is not pending (its settings go)
    ([], ["cpu0.env", "old.restart-pending"], []),
    # a settings file is not a mark
    ([], ["cpu0.env", "cpu1.env", "restart-pending.env"], []),
])
def test_pending_instances(marked_now, files, expected):
    assert pending(marked_now, files) == expected
