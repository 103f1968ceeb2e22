"""The Mitogen opt-in (docs/mitogen.md): its configuration really runs tasks under Mitogen's
strategy and connection, and the module-run count of the benchmark still counts them.

Needs build/mitogen (`build/venv/bin/pip install --no-deps --target build/mitogen -r
requirements-mitogen.txt`, or `python scripts/bench.py --mitogen ...`, which installs it);
skipped without it.
"""
import os
import subprocess
import sys

import pytest
import yaml

import bench_common
import bench_converge
import bench_rerun

ROOT = bench_common.ROOT
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
HAVE_MITOGEN = os.path.isdir(os.path.join(bench_converge.MITOGEN_DIR, "ansible_mitogen"))

PLAYBOOK = """\
- name: Under which strategy and connection
  hosts: all
  gather_facts: false
  tasks:
    - name: Mitogen's connection stack (this action exists only under Mitogen's strategy)
      mitogen_get_stack:
      register: stack
    - name: A template is a stat, then a copy when the file changes
      ansible.builtin.template:
        src: {src}
        dest: "{out}/{{{{ inventory_hostname }}}}"
        mode: "0644"
    - name: Write what ran
      ansible.builtin.copy:
        content: "{{{{ {{'stack': stack.result | default([]) | map(attribute='method') | list, 'skipped': stack.skipped | default(false)}} | to_json }}}}"
        dest: "{out}/{{{{ inventory_hostname }}}}.stack"
        mode: "0644"
"""


def _run(tmp_path, env_extra, name):
    out = tmp_path / name
    out.mkdir()
    src = tmp_path / "src.j2"
    src.write_text("x\n")
    playbook = tmp_path / ("%s.yml" % name)
    playbook.write_text(PLAYBOOK.format(src=src, out=out))
    inventory = tmp_path / "hosts"
    # `local` is one of the connections Mitogen replaces by its short name (as `docker` and `ssh`).
    inventory.write_text("h1\nh2\n\n[all:vars]\nansible_connection=local\nansible_python_interpreter=%s\n"
                         % sys.executable)
    log = tmp_path / ("%s-runs.jsonl" % name)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), **bench_common.module_runs_env(str(log)))
    env.update(env_extra)
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(inventory), str(playbook)], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    return proc, out, bench_common.count_module_runs(str(log), nodes=["h1", "h2"])


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason="needs the tool venv (make venv)")
@pytest.mark.skipif(not HAVE_MITOGEN, reason="needs build/mitogen (pip install --target build/mitogen "
                                             "-r requirements-mitogen.txt)")
def test_the_opt_in_loads_mitogen_and_the_count_still_counts(tmp_path):
    env = bench_converge.mitogen_strategy_env()
    # The playbook names Mitogen's action, which has to resolve when the playbook is parsed,
    # before the strategy (which adds Mitogen's plugin directories) is loaded.
    env["ANSIBLE_ACTION_PLUGINS"] = os.path.join(bench_converge.MITOGEN_DIR, "ansible_mitogen", "plugins", "action")
    proc, out, runs = _run(tmp_path, env, "mitogen")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in ("h1", "h2"):
        ran = yaml.safe_load((out / ("%s.stack" % host)).read_text())
        # Mitogen's own connection ran the tasks: its stack names the method (local)
        assert ran == {"stack": ["local"], "skipped": False}, ran
        assert (out / host).read_text() == "x\n"
    # The callback counts Mitogen's module runs too (its ActionModuleMixin._execute_module):
    # a template of a new file is a stat and a copy, the copy of the report the same.
    assert runs["per_target"] == {"h1": 4, "h2": 4}, runs


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason="needs the tool venv (make venv)")
def test_without_the_opt_in_there_is_no_mitogen(tmp_path):
    # The default configuration never loads Mitogen, even when it is installed: its action
    # does not resolve, so the play stops at it.
    proc, _out, _runs = _run(tmp_path, {}, "vanilla")
    assert proc.returncode != 0
    assert "couldn't resolve module/action 'mitogen_get_stack'" in proc.stdout + proc.stderr


def test_the_lab_variant_inventory_keeps_the_addresses():
    with open(os.path.join(ROOT, "inventories", "lab-mitogen.yml"), encoding="utf-8") as handle:
        variant = yaml.safe_load(handle)
    with open(os.path.join(ROOT, "inventories", "lab", "hosts.yml"), encoding="utf-8") as handle:
        lab = yaml.safe_load(handle)
    lab_group = variant["all"]["children"]["kvcache_lab"]
    groups = lab["all"]["children"]
    # every host's settings, wherever the lab inventory writes them (lab-monitor's are in kvcache_monitoring)
    defined = {}
    for group in groups.values():
        for name, settings in (group.get("hosts") or {}).items():
            defined.setdefault(name, {}).update(settings or {})
    members = set(groups["kvcache_lab"].get("hosts") or {})
    for child in groups["kvcache_lab"]["children"]:
        members |= set(groups[child]["hosts"])
    lab_hosts = {name: defined[name] for name in members}
    assert set(lab_group["hosts"]) == set(lab_hosts)
    for name, settings in lab_group["hosts"].items():
        # Mitogen's docker connection by its short name, to the container the lab names; never
        # a changed ansible_host (the host's network address the roles use)
        assert settings == {"ansible_connection": "docker", "ansible_ssh_host": lab_hosts[name]["ansible_docker_host"]}


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason="needs the tool venv (make venv)")
def test_the_lab_inventory_directory_does_not_carry_the_opt_in():
    """The runner example, the EE job and portals pass the inventory DIRECTORY (inventories/lab),
    and Ansible parses every file in it: the Mitogen variant inside it put every run of the lab
    on its host variables (connection `docker`, ansible_ssh_host), opted in or not."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    env.pop("ANSIBLE_INVENTORY", None)
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-inventory"), "-i",
                           os.path.join(ROOT, "inventories", "lab"), "--host", "lab-node1"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    host = yaml.safe_load(proc.stdout)
    assert host["ansible_connection"] == "community.docker.docker", host["ansible_connection"]
    assert "ansible_ssh_host" not in host


def test_bench_rerun_variants():
    v = bench_rerun.parse_variant("after=.:mitogen")
    assert v["label"] == "after" and v["mitogen"] is True and os.path.isabs(v["tree"])
    argv = bench_rerun.variant_argv(v)
    assert argv[-1] == os.path.join(v["tree"], "playbooks", "site.yml")
    assert argv[1:5] == ["-i", bench_rerun.LAB_INVENTORY, "-i", bench_rerun.MITOGEN_INVENTORY]
    assert bench_rerun.variant_env(v)["ANSIBLE_STRATEGY"] == "mitogen_linear"
    plain = bench_rerun.parse_variant("before=/tmp/old")
    assert "-i" not in bench_rerun.variant_argv(plain)[3:] and "ANSIBLE_STRATEGY" not in bench_rerun.variant_env(plain)
    for bad in ("noequals", "x=", "x=.:fast"):
        with pytest.raises(ValueError):
            bench_rerun.parse_variant(bad)
