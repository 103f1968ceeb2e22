"""roles/lmcache/tasks/chunk_size.yml: the derived chunk size follows the TP of this node's own
instances (issue #34 defect 9), rendered by Ansible's own templating.

One LMCache worker stores 1/TP of a chunk's KV, so the chunk that puts an object on the tier's
plateau grows with TP (docs/benchmarks.md, "Chunk size"). The old task derived it from the
fleet-wide kvcache_tensor_parallel_size alone: a node whose listed instances run at TP 2 got the
TP-1 chunk (Llama-3.1-8B on fs: 256 tokens, 16 MiB objects per worker, half the plateau).
Instances of one node that differ share one chunk size (one server, one config file): the
largest TP's, so every instance's objects are at least the plateau size.

Rendered in a child interpreter with Ansible's collection loader over build/collections (as
tests/unit/roles/test_lmcache_workers_per_node.py does).
"""
import base64
import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TASKS = os.path.join(ROOT, "roles", "lmcache", "tasks", "chunk_size.yml")
COLLECTIONS = os.path.join(ROOT, "build", "collections")
# Llama-3.1-8B's config.json (the fleet's fixture): 32 layers, 8 KV heads, head size 128, bf16.
MODEL = os.path.join(ROOT, "tests", "integration", "fleet", "fixtures", "model", "config.json")

RENDER = r"""
import json, sys
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=[sys.argv[1]])._install()
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
task_vars, fact, cases = json.load(sys.stdin)
out = []
for variables in cases:
    variables = dict(variables)
    for name, source in task_vars.items():  # the task's own vars first, as Ansible does
        variables[name] = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(source))
    out.append(int(Templar(loader=DataLoader(), variables=variables).template(trust_as_template(fact))))
print(json.dumps(out))
"""

TP2 = {"name": "tp2", "port": 8000, "gpus": [0, 1], "tensor_parallel_size": 2}
TP1 = {"name": "tp1", "port": 8001, "gpus": [2]}
TP8 = {"name": "tp8", "port": 8000, "gpus": list(range(8)), "tensor_parallel_size": 8}
CASES = {
    # derived instances: all at the fleet's TP
    "derived tp1 fs": ({"kvcache_tensor_parallel_size": 1}, 256),
    "derived tp2 fs": ({"kvcache_tensor_parallel_size": 2}, 512),
    "derived tp8 s3": ({"kvcache_tensor_parallel_size": 8, "kvcache_tier": "s3"}, 512),
    # listed instances: their own TP, not the fleet's
    "listed tp2, fleet tp1": ({"vllm_instances": [dict(TP2, port=8000)], "kvcache_tensor_parallel_size": 1}, 512),
    "listed tp8, fleet tp1": ({"vllm_instances": [TP8], "kvcache_tensor_parallel_size": 1}, 2048),
    "listed without tp, fleet tp2": ({"vllm_instances": [TP1], "kvcache_tensor_parallel_size": 2}, 512),
    "listed tp1 only, fleet tp8": ({"vllm_instances": [dict(TP1, tensor_parallel_size=1)],
                                    "kvcache_tensor_parallel_size": 8}, 256),
    # a mix on one node: the largest TP's chunk (the TP-1 instance's objects are then 64 MiB)
    "mixed tp2 + tp1": ({"vllm_instances": [TP2, TP1], "kvcache_tensor_parallel_size": 1}, 512),
    "gds, listed tp2": ({"vllm_instances": [TP2], "kvcache_tensor_parallel_size": 1, "kvcache_fs_gds": True}, 512),
    # a pinned chunk size wins
    "pinned": ({"vllm_instances": [TP8], "kvcache_chunk_size": 1024}, 1024),
}


def task():
    with open(TASKS, encoding="utf-8") as handle:
        tasks = yaml.safe_load(handle)
    return next(t for t in tasks if "lmcache_chunk_size" in t.get("ansible.builtin.set_fact", {}))


@pytest.fixture(scope="module")
def rendered():
    with open(MODEL, "rb") as handle:
        content = base64.b64encode(handle.read()).decode()
    base = {"kvcache_chunk_size": 0, "kvcache_tensor_parallel_size": 1, "kvcache_tier": "fs", "kvcache_fs_gds": False, "kvcache_kv_dtype": "auto",
            "__lmcache_model_config": {"content": content}, "inventory_hostname": "gpu-a01"}
    names = sorted(CASES)
    the_task = task()
    cases = [dict(base, **CASES[name][0]) for name in names]
    payload = [the_task.get("vars", {}), the_task["ansible.builtin.set_fact"]["lmcache_chunk_size"], cases]
    proc = subprocess.run([sys.executable, "-c", RENDER, COLLECTIONS], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(names, json.loads(proc.stdout)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_chunk_follows_the_tp_of_the_nodes_instances(rendered, name):
    assert rendered[name] == CASES[name][1]
