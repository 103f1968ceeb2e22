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


def test_the_role_derives_with_the_filter_one_implementation():
    """roles/vllm derives its instances with the vllm_derive_instances filter, the same code
    (derive_instances) the router and the monitoring run on the controller: no Jinja copy."""
    import os

    import yaml

    from ansible_collections.kvcache.offload.plugins.filter.vllm_instances import vllm_derive_instances
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
    with open(os.path.join(root, "roles", "vllm", "vars", "main.yml")) as handle:
        role_vars = yaml.safe_load(handle)
    derived = role_vars["__vllm_derived_instances"]
    assert "kvcache.offload.vllm_derive_instances(" in derived, derived
    assert "for " not in derived and "range(" not in derived, derived
    assert FilterModule().filters()["vllm_derive_instances"] is vllm_derive_instances
    # the filter and the controller's rule agree, for every TP that divides the HGX node or not
    for count in (0, 1, 2, 7, 8):
        for tp in (1, 2, 4, 8):
            hvars = {"vllm_gpu_count": count, "kvcache_tensor_parallel_size": tp, "vllm_base_port": 9000}
            assert vllm_derive_instances(count, tp, 9000, "n") == vllm_instances({"n": hvars}, ["n"])["n"]


@pytest.mark.parametrize("count, tp, port", [
    (8, 1, 8000), ("8", "2", "8000"), (2, 4, 8000), (0, 1, 8000)])
def test_vllm_derive_instances_is_the_rule(count, tp, port):
    from ansible_collections.kvcache.offload.plugins.filter.vllm_instances import vllm_derive_instances
    got = vllm_derive_instances(count, tp, port, "n")
    assert got == derive_instances(int(count), int(tp), int(port))
    assert len(got) == int(count) // int(tp)
    assert all(len(i["gpus"]) == int(tp) for i in got)


@pytest.mark.parametrize("args, match", [
    ((8, 0, 8000), "host gpu-a01: kvcache_tensor_parallel_size is 0. Fix: set kvcache_tensor_parallel_size"),
    ((8, "two", 8000), "kvcache_tensor_parallel_size is 'two'"),
    ((-1, 1, 8000), "vllm_gpu_count is -1"),
    ((8, 1, "x"), "vllm_base_port is 'x'"),
    ((True, 1, 8000), "vllm_gpu_count is True"),
])
def test_vllm_derive_instances_names_the_variable(args, match):
    from ansible_collections.kvcache.offload.plugins.filter.vllm_instances import vllm_derive_instances
    with pytest.raises(AnsibleFilterError, match=match):
        vllm_derive_instances(*args, host="gpu-a01")
