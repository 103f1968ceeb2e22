"""Unit tests for the vllm_instances filter and module_utils/vllm_instances (issue #18)."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.kvcache.offload.plugins.filter.vllm_instances import FilterModule, vllm_instances
from ansible_collections.kvcache.offload.plugins.module_utils.vllm_instances import derive_instances


def test_the_rule_order_published_listed_derived_unknown():
    hostvars = {
        "pub": {"vllm_effective_instances": [{"name": "a", "port": 1}], "vllm_instances": [{"name": "b", "port": 2}]},
        "listed": {"vllm_instances": [{"name": "b", "port": 2}], "ansible_facts": {"gpu_facts": {"count": 8}}},
        "derived": {"vllm_instances": [], "ansible_facts": {"gpu_facts": {"count": 3}}, "kvcache_tensor_parallel_size": 2},
        "count": {"vllm_gpu_count": "4", "ansible_facts": {"gpu_facts": {"count": 8}}},
        "unknown": {},
        "nogpu": {"ansible_facts": {"gpu_facts": {"count": 0}}},
    }
    got = vllm_instances(hostvars, list(hostvars))
    assert got["pub"] == [{"name": "a", "port": 1}]
    assert got["listed"] == [{"name": "b", "port": 2}]
    assert got["derived"] == [{"name": "gpu0", "port": 8000, "gpus": [0, 1]}]
    assert [i["name"] for i in got["count"]] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert got["unknown"] is None
    assert got["nogpu"] == []


def test_derivation_matches_the_vllm_role():
    assert derive_instances(8, 4, 8000) == [{"name": "gpu0", "port": 8000, "gpus": [0, 1, 2, 3]},
                                            {"name": "gpu4", "port": 8001, "gpus": [4, 5, 6, 7]}]
    assert derive_instances(2, 4) == []


@pytest.mark.parametrize("hvars, match", [
    ({"vllm_instances": "gpu0"}, "vllm_instances must be a list"),
    ({"ansible_facts": {"gpu_facts": {"count": 2}}, "vllm_base_port": "x"}, "vllm_base_port"),
    ({"vllm_gpu_count": -1}, "vllm_gpu_count"),
])
def test_bad_inputs_name_the_host_and_variable(hvars, match):
    with pytest.raises(AnsibleFilterError, match="host n: .*" + match):
        vllm_instances({"n": hvars}, ["n"])


def test_bad_arguments_and_registration():
    with pytest.raises(AnsibleFilterError):
        vllm_instances({}, "n")
    with pytest.raises(AnsibleFilterError, match="not in hostvars"):
        vllm_instances({}, ["n"])
    assert vllm_instances({}, None) == {}
    assert FilterModule().filters()["vllm_instances"] is vllm_instances


def test_derivation_defaults_mirror_the_roles():
    """The controller's derivation uses the vllm and kvcache roles' defaults for what a host does not set."""
    import os

    import yaml

    from ansible_collections.kvcache.offload.plugins.module_utils.vllm_instances import DERIVATION_DEFAULTS
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))

    def load(role):
        with open(os.path.join(root, "roles", role, "defaults", "main.yml")) as handle:
            return yaml.safe_load(handle)
    assert DERIVATION_DEFAULTS["vllm_base_port"] == load("vllm")["vllm_base_port"]
    assert DERIVATION_DEFAULTS["kvcache_tensor_parallel_size"] == load("kvcache")["kvcache_tensor_parallel_size"]
    assert "vllm_effective_instances" in open(os.path.join(root, "roles", "vllm", "tasks", "main.yml")).read()
