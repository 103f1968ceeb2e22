# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""examples/runner/kvcache_runner.py run the way docs/ansible-runner.md says: from a fresh shell.

A portal's worker does not activate the venv: the command is `<venv>/bin/python
examples/runner/kvcache_runner.py ...` with a PATH that has no ansible-playbook on it.
ansible-runner starts `ansible-playbook` by name, so before the example led the job's PATH
with the venv's bin directory the job ended with status failed, rc 127 ("The command was not
found or was not executable: ansible-playbook").
"""

from __future__ import absolute_import, division, print_function

import json
import os
import subprocess
import sys

import pytest

__metaclass__ = type

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "runner", "kvcache_runner.py")
VENV_PYTHON = sys.executable  # the tool venv's Python (make unit runs pytest from it)
sys.path.insert(0, os.path.dirname(EXAMPLE))
import kvcache_runner  # noqa: E402  pylint: disable=wrong-import-position,import-error

PLAYBOOK = """\
- name: One task of the collection, on the controller
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Read the router backends through the collection's filter
      ansible.builtin.debug:
        msg: "{{ {'n1': {'ansible_host': '10.0.0.1', 'vllm_instances': [{'port': 8000}],
                 'kvcache_model': 'm'}} | kvcache.offload.router_backends(['n1']) }}"
"""
INVENTORY = "localhost ansible_connection=local ansible_python_interpreter={python}\n"


def _fresh_shell_env(tmp_path):
    """What a portal worker's shell has: no venv on PATH, no ANSIBLE_* variables."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
            "DO_NOT_TRACK": "1"}


def _project(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "check.yml").write_text(PLAYBOOK)
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "hosts").write_text(INVENTORY.format(python=VENV_PYTHON))
    return project, inventory


@pytest.mark.skipif(not os.path.isfile(os.path.join(os.path.dirname(VENV_PYTHON), "ansible-playbook")),
                    reason="needs the tool venv's ansible-playbook next to its Python (make venv)")
def test_the_documented_command_runs_from_a_fresh_shell(tmp_path):
    project, inventory = _project(tmp_path)
    env = _fresh_shell_env(tmp_path)
    proc = subprocess.run(
        [VENV_PYTHON, EXAMPLE, "--private-data-dir", str(tmp_path / "job"), "--ident", "job-1",
         "--project-dir", str(project), "--inventory", str(inventory),
         "--collections-path", os.path.join(ROOT, "build", "collections"), "--playbook", "check.yml"],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["status"], summary["rc"]) == ("successful", 0), summary
    assert summary["failed_tasks"] == []
    stdout = (tmp_path / "job" / "artifacts" / "job-1" / "stdout").read_text()
    assert "http://10.0.0.1:8000" in stdout  # the collection's filter ran in the job


def test_the_job_path_starts_with_the_interpreters_bin_directory(tmp_path, monkeypatch):
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    exe = bindir / "ansible-playbook"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bindir / "python"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    project, inventory = _project(tmp_path)
    kvcache_runner.prepare_private_data_dir(str(tmp_path / "job"), str(project), str(inventory), "j")
    envvars = json.loads((tmp_path / "job" / "env" / "envvars").read_text())
    assert envvars["PATH"].split(os.pathsep) == [str(bindir), "/usr/bin", "/bin"]


def test_no_ansible_playbook_anywhere_is_refused_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    project, inventory = _project(tmp_path)
    with pytest.raises(ValueError, match="--ansible-bin-dir"):
        kvcache_runner.prepare_private_data_dir(str(tmp_path / "job"), str(project), str(inventory), "j")
    assert not (tmp_path / "job").exists()  # refused before anything was written


def test_a_given_bin_directory_without_ansible_playbook_is_refused(tmp_path):
    project, inventory = _project(tmp_path)
    with pytest.raises(ValueError, match="holds no executable ansible-playbook"):
        kvcache_runner.prepare_private_data_dir(str(tmp_path / "job"), str(project), str(inventory), "j",
                                                ansible_bin_dir=str(tmp_path))
