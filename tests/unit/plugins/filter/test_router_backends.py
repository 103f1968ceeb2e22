"""Unit tests for the router_backends filter (kvcache.offload)."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.kvcache.offload.plugins.filter.router_backends import FilterModule, router_backends

HOSTVARS = {
    "gpu1": {
        "ansible_host": "10.0.0.11",
        "kvcache_model": "/models/qwen",
        "kvcache_served_model_name": "qwen",
        "vllm_instances": [
            {"name": "gpu1-0", "port": 8000, "gpus": [0], "tensor_parallel_size": 1},
            {"name": "gpu1-1", "port": 8001, "gpus": [1], "tensor_parallel_size": 1},
        ],
    },
    "gpu2": {
        "ansible_host": "10.0.0.12",
        "kvcache_model": "/models/qwen",
        "vllm_instances": [{"name": "gpu2-0", "port": "8000", "gpus": [0, 1], "tensor_parallel_size": 2}],
    },
    "router": {"ansible_host": "10.0.0.10"},
}


def test_every_instance_of_every_host_in_inventory_order():
    got = router_backends(HOSTVARS, ["gpu1", "gpu2"])
    assert got == [
        {"url": "http://10.0.0.11:8000", "model": "qwen", "host": "gpu1", "instance": "gpu1-0"},
        {"url": "http://10.0.0.11:8001", "model": "qwen", "host": "gpu1", "instance": "gpu1-1"},
        # no served name on gpu2: falls back to kvcache_model
        {"url": "http://10.0.0.12:8000", "model": "/models/qwen", "host": "gpu2", "instance": "gpu2-0"},
    ]


def test_adding_a_node_appends_its_backends():
    hostvars = dict(HOSTVARS, gpu3={"ansible_host": "10.0.0.13", "kvcache_served_model_name": "qwen",
                                    "vllm_instances": [{"name": "gpu3-0", "port": 8000}]})
    before = router_backends(hostvars, ["gpu1", "gpu2"])
    after = router_backends(hostvars, ["gpu1", "gpu2", "gpu3"])
    assert after[:3] == before
    assert after[3]["url"] == "http://10.0.0.13:8000"


def test_host_without_instances_or_address():
    hostvars = {"n1": {"vllm_instances": [{"port": 9000}]}, "n2": {}}
    got = router_backends(hostvars, ["n1", "n2"], default_model="fallback")
    assert got == [{"url": "http://n1:9000", "model": "fallback", "host": "n1", "instance": "n1-0"}]


def test_empty_inputs_give_empty_list():
    assert not router_backends(HOSTVARS, [])
    assert not router_backends(HOSTVARS, None)
    assert not router_backends({"r": {}}, ["r"])


def test_model_none_when_unknown():
    got = router_backends({"n": {"vllm_instances": [{"port": 1}], "kvcache_model": ""}}, ["n"])
    assert got[0]["model"] is None


def test_ipv6_and_scheme():
    got = router_backends({"n": {"ansible_host": "fd00::5", "vllm_instances": [{"port": 8443}]}}, ["n"], scheme="https")
    assert got[0]["url"] == "https://[fd00::5]:8443"


@pytest.mark.parametrize("setting,scheme", [
    (None, "http"),  # the kvcache role's default (read from the role)
    (False, "http"), ("false", "http"),
    (True, "https"), ("true", "https"), ("yes", "https"),
])
def test_the_scheme_follows_the_hosts_engine_tls(setting, scheme):
    node = {"ansible_host": "10.0.0.11", "vllm_instances": [{"port": 8000}]}
    if setting is not None:
        node["kvcache_engine_tls"] = setting
    assert router_backends({"n": node}, ["n"])[0]["url"] == "%s://10.0.0.11:8000" % scheme
    # an explicit scheme (the deprecated router_backend_scheme / validation_instance_scheme) wins
    assert router_backends({"n": node}, ["n"], scheme="http")[0]["url"] == "http://10.0.0.11:8000"


def test_an_engine_tls_that_is_not_a_boolean_names_the_fix():
    node = {"ansible_host": "10.0.0.11", "vllm_instances": [{"port": 8000}], "kvcache_engine_tls": "maybe"}
    with pytest.raises(AnsibleFilterError, match="kvcache_engine_tls is 'maybe'.*Fix"):
        router_backends({"n": node}, ["n"])


@pytest.mark.parametrize("instances,fragment", [
    ({"port": 8000}, "must be a list"),
    ("8000", "must be a list"),
    (["8000"], "is not a mapping"),
    ([{"name": "x"}], "has port None"),
    ([{"port": 0}], "has port 0"),
    ([{"port": 70000}], "has port 70000"),
    ([{"port": "abc"}], "has port 'abc'"),
    ([{"port": True}], "has port True"),
    ([{"port": 8000}, {"port": 8000}], "same URL"),
])
def test_malformed_instances_name_the_host(instances, fragment):
    with pytest.raises(AnsibleFilterError) as err:
        router_backends({"badhost": {"vllm_instances": instances}}, ["badhost"])
    assert "badhost" in str(err.value)
    assert fragment in str(err.value)
    assert "Fix:" in str(err.value)


def test_unknown_host_and_bad_groups():
    with pytest.raises(AnsibleFilterError, match="ghost"):
        router_backends({}, ["ghost"])
    with pytest.raises(AnsibleFilterError, match="groups must be a list"):
        router_backends({}, "gpu1")


def test_hostvars_that_raise_on_lookup():
    class Raising(dict):
        def get(self, key, default=None):
            if key == "kvcache_served_model_name":
                raise RuntimeError("undefined")
            return super().get(key, default)
    got = router_backends({"n": Raising(vllm_instances=[{"port": 1}], kvcache_model="m")}, ["n"])
    assert got[0]["model"] == "m"


def test_registered_as_filter():
    assert FilterModule().filters()["router_backends"] is router_backends


# Issue #18: nodes without vllm_instances (the example inventory) run instances the vllm role
# derives from their GPUs; the router must list those, not an empty backend list.
DERIVED = {
    "gpu-a01": {"ansible_host": "10.20.0.11", "kvcache_served_model_name": "llama",
                "kvcache_tensor_parallel_size": 1, "ansible_facts": {"gpu_facts": {"count": 8}}},
    "gpu-a02": {"ansible_host": "10.20.0.12", "kvcache_served_model_name": "llama", "vllm_instances": [],
                "kvcache_tensor_parallel_size": 1, "ansible_facts": {"gpu_facts": {"count": 2}}},
}


def test_derived_instances_from_gpu_facts_are_backends():
    got = router_backends(DERIVED, ["gpu-a01", "gpu-a02"])
    assert [b["url"] for b in got] == (["http://10.20.0.11:%d" % p for p in range(8000, 8008)]
                                       + ["http://10.20.0.12:8000", "http://10.20.0.12:8001"])
    assert [b["instance"] for b in got][:2] == ["gpu0", "gpu1"]


def test_derived_instances_follow_tensor_parallel_size_and_base_port():
    hostvars = {h: dict(v, kvcache_tensor_parallel_size=2, vllm_base_port=9000) for h, v in DERIVED.items()}
    got = router_backends(hostvars, ["gpu-a01", "gpu-a02"])
    assert [(b["host"], b["instance"], b["url"].rsplit(":", 1)[1]) for b in got] == [
        ("gpu-a01", "gpu0", "9000"), ("gpu-a01", "gpu2", "9001"), ("gpu-a01", "gpu4", "9002"),
        ("gpu-a01", "gpu6", "9003"), ("gpu-a02", "gpu0", "9000")]


def test_published_instances_win_over_derivation():
    hostvars = {"gpu-a01": dict(DERIVED["gpu-a01"], vllm_effective_instances=[{"name": "x", "port": 8100}])}
    got = router_backends(hostvars, ["gpu-a01"])
    assert [(b["instance"], b["url"]) for b in got] == [("x", "http://10.20.0.11:8100")]


def test_unknown_instances_give_no_backend_and_bad_tp_names_the_variable():
    assert not router_backends({"n": {"kvcache_model": "m"}}, ["n"])
    with pytest.raises(AnsibleFilterError, match="kvcache_tensor_parallel_size"):
        router_backends({"n": dict(DERIVED["gpu-a01"], kvcache_tensor_parallel_size=0)}, ["n"])
