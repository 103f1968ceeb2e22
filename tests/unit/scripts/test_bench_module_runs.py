"""Module runs per host: the callback that counts them and the summary bench.json carries."""
import json
import os
import subprocess
import sys

import pytest

import bench_common

ROOT = bench_common.ROOT
PLAYBOOK = """\
- name: Count
  hosts: all
  gather_facts: false
  tasks:
    - name: A template is a stat, then a copy when the file changes
      ansible.builtin.template:
        src: {src}
        dest: "{out}/{{{{ inventory_hostname }}}}"
        mode: "0644"
    - name: set_fact runs no module
      ansible.builtin.set_fact:
        seen: true
    - name: A command delegated to the controller runs there
      ansible.builtin.command: "true"
      delegate_to: localhost
      changed_when: false
"""


def _write(path, rows):
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
        handle.write("not json\n\n")


def test_count_module_runs_per_target_module_and_task(tmp_path):
    log = tmp_path / "runs.jsonl"
    _write(str(log), [
        {"host": "n1", "target": "n1", "play": "p1", "task": "t1", "module": "ansible.legacy.stat"},
        {"host": "n1", "target": "n1", "play": "p1", "task": "t1", "module": "ansible.legacy.copy"},
        {"host": "n2", "target": "n2", "play": "p1", "task": "t1", "module": "ansible.legacy.stat"},
        {"host": "n2", "target": "localhost", "play": "p0", "task": "t2", "module": "ansible.builtin.uri"},
    ])
    got = bench_common.count_module_runs(str(log), nodes=["n1", "n2", "n3"])
    assert got["total"] == 4
    assert got["per_target"] == {"localhost": 1, "n1": 2, "n2": 1}
    assert got["per_node"] == pytest.approx(1.0)  # (2 + 1 + 0) / 3
    assert got["controller"] == 1
    assert got["by_module"][0] == ["ansible.builtin.stat", 2]
    assert got["by_task"][0] == ["t1", 3]
    assert got["per_play"] == [["p1", 3, pytest.approx(1.0)], ["p0", 1, 0.0]]  # in the order they ran
    assert bench_common.count_module_runs(str(tmp_path / "missing")) is None


@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(sys.executable), "ansible-playbook")),
                    reason="needs the tool venv (make venv)")
def test_the_callback_counts_what_really_ran(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    src = tmp_path / "src.j2"
    src.write_text("x\n")
    playbook = tmp_path / "pb.yml"
    playbook.write_text(PLAYBOOK.format(src=src, out=out))
    inventory = tmp_path / "hosts"
    inventory.write_text("h1\nh2\n\n[all:vars]\nansible_connection=local\nansible_python_interpreter=%s\n" % sys.executable)
    counts = []
    for run in (1, 2):
        log = tmp_path / ("runs-%d.jsonl" % run)
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), **bench_common.module_runs_env(str(log)))
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
                               str(playbook)], env=env, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        counts.append(bench_common.count_module_runs(str(log), nodes=["h1", "h2"]))
    first, second = counts
    # First run: stat + copy per host, and the delegated command on the controller for each.
    assert first["per_target"] == {"h1": 2, "h2": 2, "localhost": 2}, first
    # Rerun: the template finds the file unchanged (stat, then file for the mode); still 2 each.
    assert second["per_target"] == {"h1": 2, "h2": 2, "localhost": 2}, second
    modules = dict(second["by_module"])
    assert modules["ansible.builtin.stat"] == 2 and modules["ansible.builtin.command"] == 2
    assert "ansible.builtin.copy" in dict(first["by_module"]) and "ansible.builtin.copy" not in modules
    # per play: the playbook's one play, 2 runs per node (the controller's runs are not a node's)
    assert second["per_play"] == [["Count", 6, 2.0]], second


def test_per_node_without_a_node_list_is_every_target_but_the_controller(tmp_path):
    log = tmp_path / "runs.jsonl"
    _write(str(log), [{"target": "n1"}, {"target": "n1"}, {"target": "n2"}, {"target": "localhost"}])
    assert bench_common.count_module_runs(str(log))["per_node"] == pytest.approx(1.5)
    _write(str(log), [{"target": "localhost"}])
    assert bench_common.count_module_runs(str(log))["per_node"] is None


def test_bench_md_has_the_module_runs_per_play():
    import bench_converge
    runs = {"total": 5, "per_node": 2.0, "controller": 1, "by_module": [], "by_task": [["t", 5]],
            "per_play": [["Preflight checks on every host", 3, 1.5], ["Monitoring", 2, None], ["Empty", 0, 0.0]]}
    lines = bench_converge._per_play_lines(runs)  # pylint: disable=protected-access
    assert "| Preflight checks on every host | 3 | 1.5 |" in lines
    assert "| Monitoring | 2 | - |" in lines
    assert not [line for line in lines if "Empty" in line]
    assert bench_converge._per_play_lines({"per_play": []}) == []  # pylint: disable=protected-access
