"""roles/vllm/templates/instance.env.j2 rendered by Ansible's own templating (issue #18):
every instance pins CUDA's device numbering to nvidia-smi's (PCI bus order) next to its GPUs."""
import os

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TEMPLATE = os.path.join(ROOT, "roles", "vllm", "templates", "instance.env.j2")


def render(item):
    variables = {
        "ansible_managed": "managed", "inventory_hostname": "gpu-a01", "item": item,
        "__vllm_api_key_file": "/etc/kvcache/vllm/api-key.env", "__vllm_tp": 1,
        "kvcache_model": "/models/m", "kvcache_served_model_name": "m", "vllm_bind_address": "10.0.0.1",
        "kvcache_kv_dtype": "auto", "vllm_gpu_memory_utilization": 0.9, "vllm_max_model_len": 0,
        "vllm_enforce_eager": False, "vllm_extra_args": [], "vllm_kv_connector": "none",
        "kvcache_hash_seed": 1, "vllm_hf_hub_offline": True, "__vllm_telemetry_env": {}, "vllm_extra_env": {},
        "__vllm_related": {"results": [{"stat": {}}] * 4}, "kvcache_lmcache_mode": "inprocess",
    }
    with open(TEMPLATE) as handle:
        source = handle.read()
    templar = Templar(loader=DataLoader(), variables=variables)
    try:  # ansible-core 2.19+: templates are trusted only when marked
        from ansible.template import trust_as_template
        source = trust_as_template(source)
    except ImportError:  # pragma: no cover
        pass
    lines = str(templar.template(source)).splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


@pytest.mark.parametrize("gpus, visible", [([0], "0"), ([4, 5, 6, 7], "4,5,6,7")])
def test_instance_sets_cuda_device_order_next_to_its_gpus(gpus, visible):
    env = render({"name": "gpu%d" % gpus[0], "port": 8000, "gpus": gpus})
    assert env["CUDA_VISIBLE_DEVICES"] == visible
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
