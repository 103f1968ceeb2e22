"""The GPU contract: the settings the roles render for a GPU node, checked against the
real code of the pinned CUDA builds of vLLM and LMCache (no GPU needed).

Run by `make gpu-contract` (scripts/gpu-contract.sh) with the contract venv's own Python
(build/gpu-contract/pins-<vllm>-<lmcache>/venv: exactly the lock inference_env installs
on a GPU node); never collected by `make unit` or `make integration`. The environment:
  GPU_CONTRACT_RENDERED  rendered.json from tests/gpu_contract/playbooks/render.yml
  GPU_CONTRACT_INFO      current.json from tests/gpu_contract/playbooks/venv.yml
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(ROOT, "build", "gpu-contract")
if HERE not in sys.path:
    sys.path.insert(0, HERE)

for _key, _value in {"DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1",
                     "LMCACHE_TRACK_USAGE": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                     "LMCACHE_DISABLE_BANNER": "1"}.items():
    os.environ[_key] = _value

import contract  # noqa: E402  pylint: disable=wrong-import-position


def _load(name, default):
    path = os.environ.get(name, default)
    with open(path, encoding="utf-8") as handle:
        return path, json.load(handle)


RENDERED_PATH, RENDERED = _load("GPU_CONTRACT_RENDERED", os.path.join(BUILD, "rendered.json"))
INFO_PATH, INFO = _load("GPU_CONTRACT_INFO", os.path.join(BUILD, "current.json"))
RENDERED_DIR = os.path.join(os.path.dirname(RENDERED_PATH), "rendered")
POINTS = sorted(RENDERED)


def point_inputs(point):
    return json.loads(RENDERED[point]["point.json"])


def instance_files():
    """(point, dtype/instance.env) of every rendered instance."""
    return [(point, name) for point in POINTS for name in sorted(RENDERED[point]) if name.endswith(".env")
            and "/" in name]


def write_rendered():
    """The rendered files, one per path, for people to read (build/gpu-contract/rendered/)."""
    for point, files in RENDERED.items():
        for name, text in files.items():
            path = os.path.join(RENDERED_DIR, point, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)


def rendered_path(point, name):
    return os.path.join(RENDERED_DIR, point, name)


def kv_transfer_configs():
    """{JSON text: [(point, instance file)]} of every distinct --kv-transfer-config rendered."""
    found = {}
    for point, name in instance_files():
        env = contract.parse_env_file(RENDERED[point][name])
        if "VLLM_KV_TRANSFER_CONFIG" in env:
            found.setdefault(env["VLLM_KV_TRANSFER_CONFIG"], []).append((point, name))
    return found


def extension_modules(package):
    """The package's compiled extension modules (top level), by file name, not imported."""
    import importlib.util

    base = os.path.dirname(importlib.util.find_spec(package).origin)
    return sorted("%s.%s" % (package, f.split(".")[0]) for f in os.listdir(base) if f.endswith(".so"))


# The import probe: a process of its own, with nothing stubbed, started with the session
# and read by test_imports.py. It builds each rendered KVTransferConfig and lets vLLM's
# connector factory import the connector's module, then imports every compiled extension
# of vllm and lmcache after torch.
PROBE = r'''
import importlib, json, sys
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
out = {"connectors": {}, "extensions": {}}
for text in json.loads(sys.argv[2]):
    try:
        cls = KVConnectorFactory.get_connector_class(KVTransferConfig(**json.loads(text)))
        out["connectors"][text] = {"class": "%s.%s" % (cls.__module__, cls.__qualname__), "error": None}
    except BaseException as exc:
        out["connectors"][text] = {"class": None, "error": "%s: %s" % (type(exc).__name__, exc)}
import torch  # the compiled extensions link against its libraries
for name in sys.argv[3].split(","):
    try:
        importlib.import_module(name)
        out["extensions"][name] = None
    except BaseException as exc:
        out["extensions"][name] = "%s: %s" % (type(exc).__name__, exc)
with open(sys.argv[1], "w") as handle:
    json.dump(out, handle)
'''


def pytest_report_header(config):  # pylint: disable=unused-argument
    return "GPU contract: %s %s + lmcache %s (venv %s; marked tested in the matrix: %s); %d rendered points" % (
        INFO.get("package", "vllm"), INFO.get("vllm"), INFO.get("lmcache"), INFO.get("venv"),
        "yes" if INFO.get("tested") else "no", len(POINTS))


def pytest_configure(config):
    write_rendered()
    out = os.path.join(os.path.dirname(RENDERED_PATH), "import-probe.json")
    if os.path.exists(out):
        os.remove(out)
    extensions = extension_modules("vllm") + extension_modules("lmcache")
    config.gpu_contract_probe = (out, subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-c", PROBE, out, json.dumps(sorted(kv_transfer_configs())), ",".join(extensions)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))


def pytest_unconfigure(config):
    probe = getattr(config, "gpu_contract_probe", None)
    if probe and probe[1].poll() is None:
        probe[1].kill()
        probe[1].wait()


@pytest.fixture(scope="session")
def import_probe(request):
    """What the import probe found: {"connectors": {json: {class, error}}, "extensions": {name: error}}."""
    out, proc = request.config.gpu_contract_probe
    output = proc.communicate(timeout=900)[0]
    if proc.returncode != 0:
        pytest.fail("the import probe failed (rc %d): %s" % (proc.returncode, output[-3000:]))
    with open(out, encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="session")
def cuda_boundary():
    """Select vLLM's CUDA platform (contract.select_cuda_platform); the import that needed
    the driver, or None on a machine that has one."""
    return contract.select_cuda_platform()


def vllm_entry_module():
    """The module the rendered vLLM unit runs with `python -m` (the same in every point)."""
    modules = set()
    for point in POINTS:
        exec_start = contract.unit_directives(RENDERED[point]["kvcache-vllm@.service"], "ExecStart")[0].split()
        modules.add(exec_start[exec_start.index("-m") + 1])
    assert len(modules) == 1, "the rendered units run different modules: %s" % modules
    return modules.pop()


@pytest.fixture(scope="session")
def vllm_parser(cuda_boundary):  # pylint: disable=redefined-outer-name,unused-argument
    """vLLM's parser, built the way the unit's entry point builds it."""
    return contract.vllm_parser(vllm_entry_module())


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """An existing directory standing in for the node's model path (the model is not here)."""
    return str(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="session")
def lmcache_strings():
    """String constants of LMCache's code: the keys it reads by name."""
    return contract.string_constants(contract.package_modules("lmcache"))
