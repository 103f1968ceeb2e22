# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""inference_env's tested sets (files/tested/): a tested pair resolves within the exact versions
it was tested with, so that a node converged today and one converged next month get the same
packages (the GPU contract checks the venv against it: tests/gpu_contract/test_tested_set.py)."""

from __future__ import absolute_import, division, print_function

import os
import re

import yaml

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLE = os.path.join(ROOT, "roles", "inference_env")
TESTED = os.path.join(ROLE, "files", "tested")
NAME = re.compile(r"^(cuda|cpu)-(.+)-(\d[^-]*)-lmcache-(\d[^-]*)-py(\d+\.\d+)-([a-z0-9_]+)\.txt$")


def _yaml(*parts):
    with open(os.path.join(ROLE, *parts)) as handle:
        return yaml.safe_load(handle)


def _pins(name):
    with open(os.path.join(TESTED, name)) as handle:
        lines = [line for line in handle.read().splitlines() if line.strip() and not line.startswith("#")]
    assert all(re.match(r"^[A-Za-z0-9_.-]+==[^\s;]+$", line) for line in lines), name
    return dict(line.split("==", 1) for line in lines)


def test_every_tested_pair_has_a_set_for_the_python_and_machine_it_was_tested_on():
    matrix = _yaml("vars", "main.yml")["__inference_env_matrix"]
    names = os.listdir(TESTED)
    for profile, entry in matrix.items():
        for vllm, lmcache in entry.get("tested", [[entry["vllm"], entry["lmcache"]]]):
            wanted = "%s-%s-%s-lmcache-%s-py3.11-x86_64.txt" % (profile, entry["package"], vllm, lmcache)
            assert wanted in names, "no tested set %s: run scripts/tested-set.sh %s" % (wanted, profile)


def test_each_set_pins_its_own_pair_and_the_matrix_torch():
    matrix = _yaml("vars", "main.yml")["__inference_env_matrix"]
    for name in os.listdir(TESTED):
        found = NAME.match(name)
        assert found, "%s: not <profile>-<package>-<vllm>-lmcache-<lmcache>-py<X.Y>-<machine>.txt" % name
        profile, package, vllm, lmcache = found.group(1, 2, 3, 4)
        pins = _pins(name)
        assert package == matrix[profile]["package"], name
        assert pins[package] == vllm and pins["lmcache"] == lmcache, name
        if [vllm, lmcache] == [matrix[profile]["vllm"], matrix[profile]["lmcache"]]:
            assert pins["torch"] == matrix[profile]["torch"], name
        assert "boto3" in pins, "%s: the S3 adapter's boto3 (requirements.in.j2) is not in the set" % name


def test_the_cpu_set_keeps_the_cuda_builds_it_overrides_out():
    excluded = _yaml("vars", "main.yml")["__inference_env_cpu_excluded"]
    for name in os.listdir(TESTED):
        if name.startswith("cpu-"):
            assert not set(excluded) & set(_pins(name)), name


def test_the_resolution_reads_the_set_and_a_new_set_resolves_again():
    resolve = _yaml("tasks", "resolve.yml")
    names = [task["name"] for task in resolve]
    write = names.index("Write the tested set the pins resolve within (constraints.txt)")
    compile_ = names.index("Resolve vllm, lmcache and their dependencies with uv pip compile")
    assert write < compile_
    assert "'--constraint', 'constraints.txt'" in resolve[compile_]["ansible.builtin.command"]["argv"]
    assert resolve[write]["ansible.builtin.copy"]["dest"].endswith("/constraints.txt")
    with open(os.path.join(ROLE, "templates", "requirements.in.j2")) as handle:
        template = handle.read()
    # requirements.in carries each set's digest: a changed set changes it, and the role resolves again
    assert "for path in __inference_env_tested_sets" in template and "hash('sha256')" in template
