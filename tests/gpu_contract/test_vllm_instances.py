"""Every vLLM instance the roles render for a GPU node starts with a command line the
pinned vLLM accepts: the unit's ExecStart, expanded with the instance's environment file
the way systemd does, parsed by vLLM's own parser, its serve-argument checks and
AsyncEngineArgs.from_cli_args, for every point of the matrix (mode x tier x tensor-parallel
size x KV cache dtype) and every instance of the 8-GPU node.

Where this stops (see docs/gpu-acceptance.md): EngineArgs.create_engine_config() builds
ModelConfig, which inspects the model's architecture by asking torch for the GPU's compute
capability (torch.cuda.get_device_capability -> "Found no NVIDIA driver"). Everything up to
there runs; the engine config itself is a GPU node's job.
"""
import json

import pytest

import contract
from conftest import RENDERED, POINTS, instance_files, point_inputs


def instance_argv(point, name):
    """What systemd would run for this instance: (argv, the instance's environment)."""
    env = contract.parse_env_file(RENDERED[point][name])
    unit = RENDERED[point]["kvcache-vllm@.service"]
    exec_start = contract.unit_directives(unit, "ExecStart")
    assert len(exec_start) == 1, "%s: kvcache-vllm@.service has %d ExecStart= lines" % (point, len(exec_start))
    return contract.expand_exec(exec_start[0], env), env


@pytest.mark.parametrize("point", POINTS)
def test_unit_runs_the_api_server_module_with_vllms_parser(point):
    """ExecStart runs `python -m MODULE`, and MODULE's main() builds its parser from the
    pieces this contract builds it from (contract.vllm_parser)."""
    argv, _env = instance_argv(point, next(n for p, n in instance_files() if p == point))
    assert argv[0].endswith("/bin/python") and argv[1] == "-m", "%s: ExecStart is %s" % (point, argv[:3])
    main = contract.entry_point_main(argv[2])
    parts = contract.entry_point_parts(main)
    assert sorted(parts) == sorted(contract.ENTRY_NAMES), "%s: %s.%s uses only %s" % (
        point, main.__module__, main.__qualname__, sorted(parts))


@pytest.mark.parametrize("point,name", instance_files(), ids=["%s/%s" % pn for pn in instance_files()])
def test_instance_command_line_parses(point, name, vllm_parser, model_dir):
    argv, env = instance_argv(point, name)
    where = "%s/%s" % (point, name)
    gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    _args, engine = contract.parse_vllm_cli(vllm_parser, argv[3:], model_dir, where, len(gpus))
    inputs = point_inputs(point)
    dtype = name.split("/")[0]
    # What the engine got is what the point asked for (a flag lost in the unit fails here).
    assert engine.tensor_parallel_size == inputs["tensor_parallel_size"], where
    assert engine.kv_cache_dtype == dtype, where
    assert len(gpus) == engine.tensor_parallel_size, (
        "%s: CUDA_VISIBLE_DEVICES=%s gives %d GPUs for tensor-parallel size %d"
        % (where, env.get("CUDA_VISIBLE_DEVICES"), len(gpus), engine.tensor_parallel_size))
    rendered_kv = env.get("VLLM_KV_TRANSFER_CONFIG")
    if rendered_kv is None:
        assert engine.kv_transfer_config is None, where
    else:
        wanted = json.loads(rendered_kv)
        got = engine.kv_transfer_config
        assert got is not None, "%s: --kv-transfer-config did not reach the engine" % where
        for key, value in wanted.items():
            assert getattr(got, key) == value, "%s: kv_transfer_config.%s is %r, rendered %r" % (
                where, key, getattr(got, key), value)


def test_cuda_platform_is_selected(cuda_boundary):
    """The parser above was built for vLLM's CUDA platform class, not a CPU or unknown one."""
    from vllm.platforms import current_platform

    assert current_platform.device_type == "cuda", current_platform
    assert type(current_platform).__module__ == "vllm.platforms.cuda"
    if cuda_boundary is not None:
        assert "libcuda.so.1" in cuda_boundary, (
            "%s failed to import for another reason than the missing CUDA driver: %s"
            % (contract.CUDA_KERNELS, cuda_boundary))
