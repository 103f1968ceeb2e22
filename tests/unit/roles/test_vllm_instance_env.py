"""roles/vllm/templates/instance.env.j2 rendered by Ansible's own templating (issue #18):
every instance pins CUDA's device numbering to nvidia-smi's (PCI bus order) next to its GPUs."""
import os

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TEMPLATE = os.path.join(ROOT, "roles", "vllm", "templates", "instance.env.j2")


def render(item, **overrides):
    variables = {
        "ansible_managed": "managed", "inventory_hostname": "gpu-a01", "item": item,
        "__vllm_api_key_file": "/etc/kvcache/vllm/api-key.env", "__vllm_tp": 1,
        "kvcache_model": "/models/m", "kvcache_served_model_name": "m", "vllm_bind_address": "10.0.0.1",
        "kvcache_kv_dtype": "auto", "vllm_gpu_memory_utilization": 0.9, "vllm_max_model_len": 0,
        "vllm_enforce_eager": False, "vllm_extra_args": [], "vllm_kv_connector": "none",
        "kvcache_hash_seed": 1, "vllm_hf_hub_offline": True, "__vllm_telemetry_env": {}, "vllm_extra_env": {},
        "__vllm_related": {"results": [{"stat": {}}] * 4}, "kvcache_lmcache_mode": "inprocess",
        "vllm_max_tokens": 8192, "vllm_max_num_seqs": 0, "vllm_max_n": 16,
    }
    variables.update(overrides)
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


def test_client_limits_and_compile_caches_are_rendered():
    """Issue #35: the limits reach vLLM, and the run-time compiles build outside /tmp."""
    env = render({"name": "gpu0", "port": 8000, "gpus": [0]}, vllm_max_tokens=4096, vllm_max_num_seqs=64, vllm_max_n=8)
    args = env["VLLM_ARGS"].strip("'").split()
    assert "--override-generation-config.max_new_tokens=4096" in args
    assert args[args.index("--max-num-seqs") + 1] == "64"
    assert env["VLLM_MAX_N_SEQUENCES"] == "8"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/var/lib/kvcache/cache/inductor"
    assert env["TRITON_CACHE_DIR"] == "/var/lib/kvcache/cache/triton"


def test_limits_at_zero_render_no_flag():
    env = render({"name": "gpu0", "port": 8000, "gpus": [0]}, vllm_max_tokens=0, vllm_max_num_seqs=0)
    assert "--override-generation-config" not in env["VLLM_ARGS"] and "--max-num-seqs" not in env["VLLM_ARGS"]


def test_every_argument_survives_systemds_split_of_vllm_args():
    """The unit passes $VLLM_ARGS, which systemd splits at whitespace and strips of quotes: an
    argument with a quote in it (JSON) reaches vLLM broken ({max_new_tokens:8192}: the engine did not
    start, issue #35's first try)."""
    env = render({"name": "gpu0", "port": 8000, "gpus": [0]}, vllm_max_tokens=4096, vllm_max_num_seqs=64)
    value = env["VLLM_ARGS"]
    assert value.startswith("'") and value.endswith("'")
    assert not set(value[1:-1]) & set("\"'\\"), value
