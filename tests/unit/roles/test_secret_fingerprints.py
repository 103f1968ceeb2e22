# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""No task prints a value derived from a secret, at any verbosity (issue #32 item 4).

The vllm and lmcache roles restart their services when a file they run from changes, the API
key file and the S3 credentials among them. They used to read a plain SHA-1 of those files in a
command task without no_log (printed at -v, and stored in the group-readable env files): a
checksum of a short or guessable key can be reversed by trying keys. Now:
- every task that reads a secret file (by the roles' names for them) is no_log;
- the only digests of files are roles/kvcache's keyed fingerprints (tasks/fingerprints.yml),
  which mix in a random root-only node key first.
"""

from __future__ import absolute_import, division, print_function

import glob
import os
import re

import yaml

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# The roles' names for files that hold a secret, and the files themselves.
SECRET_FILES = re.compile(r"__vllm_api_key_file|__vllm_s3_env_file|__lmcache_s3_env_file|s3-credentials\.env|api-key\.env")
DIGESTS = re.compile(r"\b(sha1sum|sha256sum|md5sum|sha512sum)\b|get_checksum|checksum_algorithm")
READERS = {"command", "shell", "stat", "slurp", "raw", "script"}


def _tasks(node):
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        for key in ("block", "rescue", "always"):
            if key in node:
                yield from _tasks(node[key])
        if not any(key in node for key in ("block", "rescue", "always")):
            yield node


def _module(task):
    for key in task:
        short = key.split(".")[-1]
        if short in READERS:
            return short
    return None


def _task_files():
    for path in sorted(glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml"))):
        with open(path) as handle:
            yield path, yaml.safe_load(handle) or []


def test_every_task_that_reads_a_secret_file_is_no_log():
    offenders = []
    for path, data in _task_files():
        for task in _tasks(data):
            module = _module(task)
            if module and SECRET_FILES.search(yaml.safe_dump(task)) and task.get("no_log") is not True:
                offenders.append("%s: %s" % (os.path.relpath(path, ROOT), task.get("name")))
    assert not offenders, "tasks that read a secret file without no_log: %s" % offenders


def test_the_only_file_digests_are_the_keyed_fingerprints():
    """A plain checksum anywhere else would be a value derived from a secret file's content
    (the venv's lock is not a secret, but one rule for all keeps the next copy honest)."""
    allowed = os.path.join(ROOT, "roles", "kvcache", "tasks", "fingerprints.yml")
    offenders = []
    for path, data in _task_files():
        if path == allowed:
            continue
        for task in _tasks(data):
            text = yaml.safe_dump(task)
            if DIGESTS.search(text) and SECRET_FILES.search(text):
                offenders.append("%s: %s" % (os.path.relpath(path, ROOT), task.get("name")))
    assert not offenders, offenders


def test_the_fingerprints_mix_in_a_root_only_node_key():
    with open(os.path.join(ROOT, "roles", "kvcache", "tasks", "fingerprints.yml")) as handle:
        tasks = list(_tasks(yaml.safe_load(handle)))
    assert tasks and all(task.get("no_log") is True for task in tasks), [t.get("name") for t in tasks]
    with open(os.path.join(ROOT, "roles", "kvcache", "vars", "main.yml")) as handle:
        variables = yaml.safe_load(handle)
    script = variables["__kvcache_fingerprint_script"]
    # The key is read before the file, into one digest.
    assert re.search(r'\{ cat "\$key"[^}]*; cat "\$f"; \} \| sha256sum', script), script
    make_key = tasks[0]["ansible.builtin.shell"]["cmd"]
    assert "umask 077" in make_key and "/dev/urandom" in make_key, make_key
