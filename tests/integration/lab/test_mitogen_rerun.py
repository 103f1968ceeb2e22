"""The Mitogen opt-in (docs/mitogen.md) on the lab: a no-op rerun of site.yml under Mitogen's
strategy, as the docs tell an operator to run it, must change nothing on any host and its
validation report must pass.

The same ansible-playbook call runs a second playbook after site.yml (STACK_PLAYBOOK, written
into the test's temp dir: ansible-lint cannot resolve Mitogen's action, so it is not a file of
the tree): its `mitogen_get_stack` action exists only under Mitogen's strategy, and it prints the connection
Mitogen ran each host over (`docker` for the lab's containers), so a rerun that fell back to
the vanilla executor fails here. The vanilla rerun is the execution environment's (eejob.py, through
ansible-runner, read by test_runner.py and test_execution_environment.py); this one is the opt-in's test in CI
(issue #24: "tested in CI at least by the lab's rerun test").

build/mitogen comes from `make mitogen` (scripts/lab-test.sh runs it before the tests).
"""
import json
import os
import re
import subprocess

from faultutil import ansible_env
from labutil import ROOT

MITOGEN_DIR = os.path.join(ROOT, "build", "mitogen")
RERUN_TIMEOUT = 1800
STACK_PLAYBOOK = """\
- name: Which executor ran the rerun
  hosts: kvcache_lab:localhost
  gather_facts: false
  tasks:
    - name: Mitogen's connection stack for this host
      mitogen_get_stack:
      register: __lab_mitogen_stack
      changed_when: false

    - name: Print it for the test
      ansible.builtin.debug:
        msg: "MITOGEN_STACK {{ inventory_hostname }} {{ __lab_mitogen_stack.result | map(attribute='method') | join(',') }}"
"""
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
# ansible.cfg prints results as YAML: `msg: MITOGEN_STACK <host> <method>[,<method>...]`
STACK = re.compile(r"MITOGEN_STACK (\S+) ([\w,-]+)")


def _changed_tasks(out):
    """(task, line) of every 'changed:' line of the default callback, for the failure message."""
    found, task = [], None
    for line in out.splitlines():
        if line.startswith("TASK ["):
            task = line[6:line.find("]")]
        elif line.startswith("changed:"):
            found.append((task, line[:160]))
    return found


def test_site_rerun_under_mitogen_changes_nothing_and_validates(tmp_path, lab_hosts):
    assert os.path.isdir(os.path.join(MITOGEN_DIR, "ansible_mitogen")), \
        "build/mitogen is missing: run `make mitogen` (scripts/lab-test.sh does before the tests)"
    env = ansible_env()
    # docs/mitogen.md "Enable it", plus Mitogen's action directory: STACK_PLAYBOOK names
    # mitogen_get_stack, which must resolve when the playbook is parsed.
    plugins = os.path.join(MITOGEN_DIR, "ansible_mitogen", "plugins")
    env.update(ANSIBLE_STRATEGY_PLUGINS=os.path.join(plugins, "strategy"), ANSIBLE_STRATEGY="mitogen_linear",
               ANSIBLE_ACTION_PLUGINS=os.path.join(plugins, "action"))
    report_dir = str(tmp_path / "reports")
    stack_playbook = tmp_path / "mitogen_stack.yml"
    stack_playbook.write_text(STACK_PLAYBOOK)
    proc = subprocess.run(
        ["ansible-playbook", "-i", "inventories/lab/hosts.yml", "-i", "inventories/lab-mitogen.yml",
         "playbooks/site.yml", str(stack_playbook),
         "-e", "validation_report_dir=%s" % report_dir],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=RERUN_TIMEOUT, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]

    stacks = dict((host, methods.split(",")) for host, methods in STACK.findall(proc.stdout))
    for host in lab_hosts:
        assert stacks.get(host) == ["docker"], ("not run over Mitogen's docker connection", host, stacks)
    assert stacks.get("localhost") == ["local"], stacks

    recap = dict((m[0], [int(n) for n in m[1:]]) for m in RECAP.findall(proc.stdout))
    assert set(lab_hosts) | {"localhost"} <= set(recap), recap
    changed = dict((host, n[1]) for host, n in recap.items() if n[1])
    assert changed == {}, "the lab is converged, yet the rerun under Mitogen changed: %s" % _changed_tasks(proc.stdout)
    assert all(n[2] == 0 and n[3] == 0 for n in recap.values()), recap

    with open(os.path.join(report_dir, "validation-latest.json"), encoding="utf-8") as handle:
        report = json.load(handle)
    assert report["result"] == "pass" and report["failed_required"] == [], \
        [(s["id"], s["status"], s["reason"]) for s in report["stages"] if s["status"] not in ("pass", "skipped")]
