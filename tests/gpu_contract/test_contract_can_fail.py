"""The contract can fail: real rendered files, broken one way each, go through the same
checkers the contract tests use, and each is refused with a message that names it."""
import json
import re

import pytest

import contract
from conftest import POINTS, RENDERED, instance_files, rendered_path


def first(mode):
    point, name = next((p, n) for p, n in instance_files() if p.startswith(mode + "-"))
    return point, name, contract.parse_env_file(RENDERED[point][name])


def visible_gpus(env):
    return len(env["CUDA_VISIBLE_DEVICES"].split(","))


def cli_of(env):
    return env["VLLM_ARGS"].split() + ["--kv-transfer-config", env["VLLM_KV_TRANSFER_CONFIG"]]


def test_the_unbroken_file_passes(vllm_parser, model_dir):
    _point, name, env = first("inprocess")
    contract.parse_vllm_cli(vllm_parser, cli_of(env), model_dir, name, visible_gpus(env))


@pytest.mark.parametrize("good,bad", [
    ("--kv-cache-dtype", "--kv-cache-dtyp"),
    ("--tensor-parallel-size", "--tensor-paralel-size"),
    ("--gpu-memory-utilization", "--gpu-mem-utilization"),
])
def test_a_misspelled_flag_is_refused(vllm_parser, model_dir, good, bad):
    _point, name, env = first("inprocess")
    cli = [bad if a == good else a for a in cli_of(env)]
    assert bad in cli
    with pytest.raises(contract.ContractError, match=re.escape(bad.lstrip("-"))):
        contract.parse_vllm_cli(vllm_parser, cli, model_dir, name, visible_gpus(env))


def test_an_instance_with_fewer_gpus_than_its_tensor_parallel_size_is_refused(vllm_parser, model_dir):
    _point, name, env = next((p, n, contract.parse_env_file(RENDERED[p][n])) for p, n in instance_files()
                             if "-tp8/" in p + "/")
    with pytest.raises(contract.ContractError, match="World size"):
        contract.parse_vllm_cli(vllm_parser, cli_of(env), model_dir, name, visible_gpus(env) - 1)


def test_a_kv_cache_dtype_vllm_does_not_offer_is_refused(vllm_parser, model_dir):
    _point, name, env = first("inprocess")
    cli = cli_of(env)
    cli[cli.index("--kv-cache-dtype") + 1] = "fp4_e9"
    with pytest.raises(contract.ContractError, match="fp4_e9"):
        contract.parse_vllm_cli(vllm_parser, cli, model_dir, name, visible_gpus(env))


def test_an_unknown_kv_transfer_key_is_refused(vllm_parser, model_dir):
    _point, name, env = first("multiprocess")
    kv = json.loads(env["VLLM_KV_TRANSFER_CONFIG"])
    kv["kv_conector_extra_config"] = kv.pop("kv_connector_extra_config")
    cli = env["VLLM_ARGS"].split() + ["--kv-transfer-config", json.dumps(kv)]
    with pytest.raises(contract.ContractError, match="kv_conector_extra_config"):
        contract.parse_vllm_cli(vllm_parser, cli, model_dir, name, visible_gpus(env))


@pytest.mark.parametrize("mode,field,bad", [
    ("inprocess", "kv_connector", "LMCacheConnectorV2"),
    ("multiprocess", "kv_connector", "LMCacheMPConector"),
    ("multiprocess", "kv_connector_module_path", "lmcache.integration.vllm.lmcache_mp_connectr"),
])
def test_a_wrong_connector_is_refused(cuda_boundary, mode, field, bad):  # pylint: disable=unused-argument
    _point, name, env = first(mode)
    kv = json.loads(env["VLLM_KV_TRANSFER_CONFIG"])
    kv[field] = bad
    config = contract.kv_transfer_config(json.dumps(kv), name)
    with pytest.raises(contract.ContractError, match=re.escape(bad)):
        contract.connector_class(config, name)


def test_an_unset_variable_in_execstart_is_refused():
    point, name, env = first("inprocess")
    exec_start = contract.unit_directives(RENDERED[point]["kvcache-vllm@.service"], "ExecStart")[0]
    del env["VLLM_KV_TRANSFER_CONFIG"]
    with pytest.raises(contract.ContractError, match="VLLM_KV_TRANSFER_CONFIG"):
        contract.expand_exec(exec_start, env)


def test_an_unknown_lmcache_key_is_refused(tmp_path):
    point = next(p for p in POINTS if "lmcache-config.yaml" in RENDERED[p])
    _p, _n, env = first("inprocess")
    broken = tmp_path / "lmcache-config.yaml"
    broken.write_text(RENDERED[point]["lmcache-config.yaml"] + "max_local_cpu_sise: 5.0\n")
    with pytest.raises(contract.ContractError, match="max_local_cpu_sise"):
        contract.load_lmcache_config(str(broken), env, str(broken))
    # and the unbroken file loads
    contract.load_lmcache_config(rendered_path(point, "lmcache-config.yaml"), env, point)


def test_an_unread_extra_config_key_is_found(lmcache_strings):
    assert contract.unread_keys(["remote_storage_plugin.fs.base_path", "s3_num_io_threads",
                                 "remote_storage_plugin.fs.bsae_path", "s3_num_io_threadz"],
                                *lmcache_strings) == ["remote_storage_plugin.fs.bsae_path", "s3_num_io_threadz"]


def server_argv(point):
    env = contract.parse_env_file(RENDERED[point]["lmcache-server.env"])
    return env, contract.unit_directives(RENDERED[point]["kvcache-lmcache.service"], "ExecStart")[0]


def test_a_misspelled_server_flag_is_refused():
    point = next(p for p in POINTS if "lmcache-server.env" in RENDERED[p])
    env, exec_start = server_argv(point)
    env["LMCACHE_SERVER_ARGS"] = env["LMCACHE_SERVER_ARGS"].replace("--l1-size-gb", "--l1-size-gib")
    with pytest.raises(contract.ContractError, match="l1-size-gib"):
        contract.lmcache_server_parse(contract.expand_exec(exec_start, env)[1:], point)


def test_an_unread_l2_adapter_key_is_found():
    point = next(p for p in POINTS if "lmcache-server.env" in RENDERED[p] and "-s3-" in p)
    env, exec_start = server_argv(point)
    adapter = json.loads(env["LMCACHE_L2_ADAPTER"])
    # the s3 tier's adapter is the lmcache role's half-open one through LMCache's plugin adapter
    # (lmcache_s3_retry_after_seconds > 0): its s3 keys are in adapter_params
    keys = adapter["adapter_params"] if adapter.get("type") == "plugin" else adapter
    keys["s3_regoin"] = keys["s3_region"]
    env["LMCACHE_L2_ADAPTER"] = json.dumps(adapter)
    args, configs = contract.lmcache_server_parse(contract.expand_exec(exec_start, env)[1:], point)
    adapters = configs["parse_args_to_config"].l2_adapter_config.adapters
    assert contract.l2_adapter_unread_keys(args.l2_adapter[0], adapters[0], point) == (
        ["adapter_params.s3_regoin"] if adapter.get("type") == "plugin" else ["s3_regoin"])


def test_a_call_the_callee_does_not_take_is_found(cuda_boundary):  # pylint: disable=unused-argument
    """vLLM's built-in MP connector -> LMCache's LMCacheMPSchedulerAdapter(server_url=...)."""
    calls = contract.cross_calls("vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector", "lmcache")
    problems = [p for p in map(contract.check_call, calls) if p]
    assert any("LMCacheMPSchedulerAdapter" in p and "server_url" in p for p in problems), problems


def test_an_override_that_drops_a_parameter_is_found(cuda_boundary):  # pylint: disable=unused-argument
    """A connector method that no longer takes what vLLM's interface passes."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    _point, name, env = first("multiprocess")
    cls = contract.connector_class(contract.kv_transfer_config(env["VLLM_KV_TRANSFER_CONFIG"], name), name)
    assert not contract.override_problems(cls, KVConnectorBase_V1)

    def get_num_new_matched_tokens(self, request):  # drops num_computed_tokens
        return 0, False

    broken = type("BrokenConnector", (cls,), {"get_num_new_matched_tokens": get_num_new_matched_tokens,
                                              "__module__": "lmcache.broken"})
    get_num_new_matched_tokens.__module__ = "lmcache.broken"
    problems = contract.override_problems(broken, KVConnectorBase_V1)
    assert any("get_num_new_matched_tokens" in p and "num_computed_tokens" in p for p in problems), problems
