"""LMCache's side of every rendered point: the in-process config file loads with LMCache's
own loader (the one its vLLM connector calls) with no warning (an unknown, deprecated or
unparsable key fails), its extra_config keys are keys LMCache's code reads; the
multiprocess server's unit runs `lmcache server` with arguments its own CLI parses into
every config the server builds, and an --l2-adapter whose every key the adapter reads."""
import importlib.metadata
import json
import math
import os

import pytest

import contract
from conftest import POINTS, RENDERED, instance_files, rendered_path

INPROCESS = [p for p in POINTS if "lmcache-config.yaml" in RENDERED[p]]
MULTIPROCESS = [p for p in POINTS if "lmcache-server.env" in RENDERED[p]]


def first_instance_env(point):
    name = next(n for p, n in instance_files() if p == point)
    return contract.parse_env_file(RENDERED[point][name])


def test_both_modes_are_rendered():
    assert INPROCESS and MULTIPROCESS, "in-process points %s, multiprocess points %s" % (INPROCESS, MULTIPROCESS)


# The example's chunk size is derived (kvcache_chunk_size 0) from Llama-3.1-8B's config.json at the
# point's TP size: the smallest chunk whose object (one worker's KV) is on the tier's plateau
# (fs and GDS 32 MiB, s3 8 MiB; 128 KiB per token at TP 1, 64 KiB at TP 2, 16 KiB at TP 8).
DERIVED_CHUNK = {("fs", 1): 256, ("fs", 2): 512, ("fs", 8): 2048, ("s3", 1): 256, ("s3", 2): 256, ("s3", 8): 512}


@pytest.mark.parametrize("point", POINTS)
def test_the_chunk_size_is_derived_from_the_tier_and_the_model(point):
    from conftest import point_inputs

    inputs = point_inputs(point)
    assert inputs["kvcache_chunk_size_setting"] == 0, point
    expected = DERIVED_CHUNK[(inputs["tier"], int(inputs["tensor_parallel_size"]))]
    assert inputs["kvcache_chunk_size"] == expected, (point, inputs["kvcache_chunk_size"], expected)
    if point in INPROCESS:
        import yaml

        assert yaml.safe_load(RENDERED[point]["lmcache-config.yaml"])["chunk_size"] == expected, point
    else:
        assert "--chunk-size %d " % expected in RENDERED[point]["lmcache-server.env"], point


@pytest.mark.parametrize("point", INPROCESS)
def test_inprocess_config_loads_without_warnings(point):
    env = first_instance_env(point)
    assert env.get("LMCACHE_CONFIG_FILE"), "%s: the instance's environment names no LMCACHE_CONFIG_FILE" % point
    where = "%s/lmcache-config.yaml" % point
    config = contract.load_lmcache_config(rendered_path(point, "lmcache-config.yaml"), env, where)
    import yaml

    raw = yaml.safe_load(RENDERED[point]["lmcache-config.yaml"])
    for key, value in raw.items():
        if key != "extra_config":
            assert getattr(config, key) == value, "%s: %s is %r after loading, %r in the file" % (
                where, key, getattr(config, key), value)


@pytest.mark.parametrize("point", INPROCESS)
def test_inprocess_cpu_tier_fits_the_node(point):
    """In-process, every TP rank of every instance runs its own LMCache engine, and each
    allocates max_local_cpu_size GB of (pinned) CPU memory at start. The node's share for
    LMCache (lmcache_cpu_ram_fraction of its RAM, split over its workers) must hold all of them."""
    import yaml

    from conftest import point_inputs

    inputs = point_inputs(point)
    per_worker = yaml.safe_load(RENDERED[point]["lmcache-config.yaml"])["max_local_cpu_size"]
    workers = sum(len(instance.get("gpus") or [1]) for instance in inputs["instances"])
    budget = inputs["node_ram_mb"] / 1024 * inputs["lmcache_cpu_ram_fraction"]
    assert per_worker * workers <= budget + 0.1 * workers, (
        "%s: %d workers (the instances' TP ranks) x max_local_cpu_size %.1f GB = %.1f GB, but the node's "
        "LMCache share is %.1f GB (%.0f GB RAM x lmcache_cpu_ram_fraction %s); the role split it over "
        "lmcache_workers_per_node=%d workers (fix: roles/lmcache/defaults/main.yml, count the instances the vllm "
        "role derives from the GPUs when vllm_instances is empty)"
        % (point, workers, per_worker, per_worker * workers, budget, inputs["node_ram_mb"] / 1024,
           inputs["lmcache_cpu_ram_fraction"], inputs["lmcache_workers_per_node"]))


@pytest.mark.parametrize("point", MULTIPROCESS)
def test_server_l1_fits_the_node(point):
    """Multiprocess: one server per node holds the whole L1 (--l1-size-gb)."""
    from conftest import point_inputs

    inputs = point_inputs(point)
    args = contract.parse_env_file(RENDERED[point]["lmcache-server.env"])["LMCACHE_SERVER_ARGS"].split()
    l1 = float(args[args.index("--l1-size-gb") + 1])
    budget = inputs["node_ram_mb"] / 1024 * inputs["lmcache_cpu_ram_fraction"]
    assert l1 <= budget + 0.1, "%s: --l1-size-gb %.1f is more than the node's LMCache share %.1f GB" % (point, l1, budget)


@pytest.mark.parametrize("point", INPROCESS)
def test_inprocess_extra_config_keys_are_read(point, lmcache_strings):
    import yaml

    extra = yaml.safe_load(RENDERED[point]["lmcache-config.yaml"]).get("extra_config") or {}
    unread = contract.unread_keys(sorted(extra), *lmcache_strings)
    assert not unread, "%s/lmcache-config.yaml: extra_config keys %s appear nowhere in LMCache's code: ignored" % (
        point, unread)


def server_argv(point):
    env = contract.parse_env_file(RENDERED[point]["lmcache-server.env"])
    unit = RENDERED[point]["kvcache-lmcache.service"]
    exec_start = contract.unit_directives(unit, "ExecStart")
    assert len(exec_start) == 1, "%s: kvcache-lmcache.service has %d ExecStart= lines" % (point, len(exec_start))
    return contract.expand_exec(exec_start[0], env)


@pytest.mark.parametrize("point", MULTIPROCESS)
def test_server_unit_runs_lmcaches_console_script(point):
    argv = server_argv(point)
    script = os.path.basename(argv[0])
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")
               if ep.dist is not None and ep.dist.name.lower() == "lmcache"}
    assert script in scripts, "%s: ExecStart runs %s, not a console script of lmcache (%s)" % (point, argv[0], scripts)
    assert scripts[script] == "lmcache.cli.main:main", "%s: %s is %s" % (point, script, scripts[script])
    assert argv[1] == "server", "%s: ExecStart runs `%s %s`" % (point, script, argv[1])


@pytest.mark.parametrize("point", MULTIPROCESS)
def test_server_arguments_parse(point):
    argv = server_argv(point)
    where = "%s/lmcache-server.env" % point
    with contract.warnings_logged(("lmcache",)) as records:
        args, configs = contract.lmcache_server_parse(argv[1:], where)
    mp = configs["parse_args_to_mp_server_config"]
    from conftest import point_inputs

    inputs = point_inputs(point)
    assert mp.chunk_size == inputs["kvcache_chunk_size"], where
    # The fleet's hash seed names the objects: vLLM's sha256_cbor from a NONE_HASH it makes from
    # PYTHONHASHSEED, not LMCache 0.5.6's default blake3 (a constant start; docs/roles/lmcache.md).
    assert mp.hash_algorithm == "sha256_cbor", "%s: --hash-algorithm %s" % (where, mp.hash_algorithm)
    # Sized from the node's instances (issue #21 item 3): one store/retrieve thread per LMCache
    # worker (TP rank), and the node's whole RAM share as L1 (not a per-worker share).
    assert mp.max_gpu_workers == inputs["lmcache_workers_per_node"] == sum(
        int(i.get("tensor_parallel_size", inputs["tensor_parallel_size"])) for i in inputs["instances"]), where
    node_gb = math.floor(inputs["node_ram_mb"] / 1024 * inputs["lmcache_cpu_ram_fraction"] * 10) / 10
    assert float(args.l1_size_gb) == pytest.approx(node_gb), "%s: --l1-size-gb %s, node share %s" % (
        where, args.l1_size_gb, node_gb)
    adapters = configs["parse_args_to_config"].l2_adapter_config.adapters
    assert len(adapters) == len(args.l2_adapter) == 1, "%s: %d L2 adapters" % (where, len(adapters))
    unread = contract.l2_adapter_unread_keys(args.l2_adapter[0], adapters[0], where)
    assert not unread, "%s: --l2-adapter keys %s are never read by %s: ignored" % (
        where, unread, type(adapters[0]).__name__)
    spec = json.loads(args.l2_adapter[0])
    if spec.get("type") == "plugin":
        # the lmcache role's half-open S3 adapter, as LMCache's plugin adapter loads it: the module imports with
        # the pinned LMCache and its config class takes the rendered adapter_params
        import sys

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                        "roles", "lmcache", "files"))
        module = __import__(spec["module_path"])
        cfg = getattr(module, spec["class_name"] + "Config").from_dict(dict(spec["adapter_params"]))
        assert cfg.retry_after_seconds == spec["adapter_params"]["retry_after_seconds"] > 0, where
        assert issubclass(getattr(module, spec["class_name"]),
                          __import__("lmcache.v1.distributed.l2_adapters.s3_l2_adapter",
                                     fromlist=["S3L2Adapter"]).S3L2Adapter), where
    # A warning while building the server's configs: only the one about pinned memory on a
    # machine without a GPU (l1-use-lazy needs it) is expected here.
    unexpected = [r.getMessage() for r in records if "memory pinning" not in r.getMessage()]
    assert not unexpected, "%s: LMCache warned: %s" % (where, unexpected)


_NONE_HASHES = (
    "import json\n"
    "from lmcache.v1.multiprocess.token_hasher import TokenHasher\n"
    "def h(algorithm):\n"
    "    value = TokenHasher(256, algorithm).none_hash\n"
    "    return value.hex() if isinstance(value, bytes) else str(value)\n"
    "print(json.dumps({'rendered': h(%r), 'blake3': h('blake3')}))\n")


def test_the_rendered_hash_algorithm_is_seeded_by_the_fleets_hash_seed():
    """The multiprocess server's object names start from its TokenHasher's NONE_HASH. With the
    rendered --hash-algorithm (sha256_cbor) the CUDA builds take it from vLLM's init_none_hash, which
    PYTHONHASHSEED (kvcache_hash_seed) makes: two seeds, two starts. LMCache's own default, blake3,
    gives the same start under both seeds (what the role's choice avoids). Two server-like processes
    under two seeds (about 25 s: each imports vLLM)."""
    import subprocess
    import sys

    point = MULTIPROCESS[0]
    argv = server_argv(point)
    algorithm = argv[argv.index("--hash-algorithm") + 1]
    starts = []
    for seed in ("1357913579", "2468024680"):
        out = subprocess.run([sys.executable, "-c", _NONE_HASHES % algorithm], capture_output=True, text=True,
                             timeout=300, env=dict(os.environ, PYTHONHASHSEED=seed), check=True).stdout
        starts.append(json.loads(next(line for line in out.splitlines() if line.startswith('{"rendered"'))))
    assert starts[0]["rendered"] != starts[1]["rendered"], "%s: --hash-algorithm %s ignores PYTHONHASHSEED: %s" % (
        point, algorithm, starts)
    assert starts[0]["blake3"] == starts[1]["blake3"], starts
