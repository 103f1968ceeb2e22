"""roles/lmcache/defaults/main.yml: lmcache_workers_per_node, rendered by Ansible's own templating.

The LMCache CPU tier per worker is the node's share of RAM divided by this count, so it must be
the number of TP ranks the node really runs: the vllm role's derived instances (the same filter,
vllm_derive_instances) or the listed ones, each counted at its own tensor_parallel_size. The old
Jinja copy of the derivation counted listed instances at the fleet's TP: a node listing one TP-2
and one TP-1 instance got 2 workers at TP 1 (4 at TP 2) instead of 3.

Rendered in a child interpreter with Ansible's collection loader over build/collections (where
tests/unit/conftest.py links this checkout), so kvcache.offload.* filters resolve as in a
playbook run without installing the loader into the test process.
"""
import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DEFAULTS = os.path.join(ROOT, "roles", "lmcache", "defaults", "main.yml")
COLLECTIONS = os.path.join(ROOT, "build", "collections")

RENDER = r"""
import json, sys
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=[sys.argv[1]])._install()
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
source, cases = json.load(sys.stdin)
out = []
for variables in cases:
    out.append(int(Templar(loader=DataLoader(), variables=variables).template(trust_as_template(source))))
print(json.dumps(out))
"""

LISTED = [{"name": "big", "port": 8000, "gpus": [0, 1], "tensor_parallel_size": 2},
          {"name": "small", "port": 8001, "gpus": [2]}]
CASES = {
    # derived from the GPUs: every TP rank of every instance the vllm role derives
    "8 GPUs tp1": ({"vllm_gpu_count": 8, "kvcache_tensor_parallel_size": 1}, 8),
    "8 GPUs tp2": ({"vllm_gpu_count": 8, "kvcache_tensor_parallel_size": 2}, 8),
    "8 GPUs tp8": ({"vllm_gpu_count": 8, "kvcache_tensor_parallel_size": 8}, 8),
    "2 GPUs tp1": ({"vllm_gpu_count": 2, "kvcache_tensor_parallel_size": 1}, 2),
    "7 GPUs tp2": ({"vllm_gpu_count": 7, "kvcache_tensor_parallel_size": 2}, 6),
    "no GPU": ({"vllm_gpu_count": 0, "kvcache_tensor_parallel_size": 1}, 1),
    # listed instances win over the GPU count, each at its own TP
    "listed tp mix": ({"vllm_instances": LISTED, "vllm_gpu_count": 8, "kvcache_tensor_parallel_size": 1}, 3),
    "listed tp mix, fleet tp2": ({"vllm_instances": LISTED, "vllm_gpu_count": 8, "kvcache_tensor_parallel_size": 2}, 4),
    "listed one": ({"vllm_instances": [{"name": "cpu0", "port": 8000}], "vllm_gpu_count": 8,
                    "kvcache_tensor_parallel_size": 1}, 1),
    # Issue #34 defect 3: without the vllm role's defaults (rolling_upgrade.yml includes lmcache
    # before vllm with include_role, which does not publish them): the node's gpu_facts. Failed
    # on the old default: vllm_gpu_count undefined -> 0 GPUs -> one worker.
    "gpu facts only, 8 GPUs tp1": ({"ansible_facts": {"gpu_facts": {"count": 8}}, "kvcache_tensor_parallel_size": 1}, 8),
    "gpu facts only, 8 GPUs tp2": ({"ansible_facts": {"gpu_facts": {"count": 8}}, "kvcache_tensor_parallel_size": 2}, 8),
    "inventory count wins over facts": ({"vllm_gpu_count": 4, "ansible_facts": {"gpu_facts": {"count": 8}},
                                         "kvcache_tensor_parallel_size": 1}, 4),
}


def source():
    with open(DEFAULTS, encoding="utf-8") as handle:
        return yaml.safe_load(handle)["lmcache_workers_per_node"]


@pytest.fixture(scope="module")
def rendered():
    names = sorted(CASES)
    cases = [dict(CASES[name][0], inventory_hostname="gpu-a01") for name in names]
    proc = subprocess.run([sys.executable, "-c", RENDER, COLLECTIONS], input=json.dumps([source(), cases]),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(names, json.loads(proc.stdout)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_workers_are_the_tp_ranks_of_the_nodes_instances(rendered, name):
    assert rendered[name] == CASES[name][1]


def test_the_derivation_is_the_vllm_roles_filter():
    assert "kvcache.offload.vllm_derive_instances(" in source() and "//" not in source(), source()


def test_the_role_finds_the_gpus_before_it_sizes_anything():
    """nodes.yml alone runs lmcache before vllm (which gathers gpu_facts) with no preflight before
    it: the role itself finds the GPUs first when nothing did, so lmcache_workers_per_node counts
    the derived instances there as in site.yml. Failed on the old role: no such task, one worker."""
    with open(os.path.join(ROOT, "roles", "lmcache", "tasks", "main.yml"), encoding="utf-8") as handle:
        tasks = yaml.safe_load(handle)
    names = [t.get("name", "") for t in tasks]
    gather = [i for i, t in enumerate(tasks) if "kvcache.offload.gpu_facts" in t]
    assert gather, names
    task = tasks[gather[0]]
    assert "ansible_facts['gpu_facts'] is not defined" in task["when"], task
    # before the checks, the chunk size and either mode's configuration read the worker count
    readers = ("checks.yml", "chunk_size.yml", "inprocess.yml", "multiprocess.yml")
    first_use = min(i for i, t in enumerate(tasks) if str(t.get("ansible.builtin.include_tasks", "")) in readers)
    assert gather[0] < first_use, names
