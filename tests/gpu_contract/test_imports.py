"""What imports on a machine without a GPU, in a fresh process of the contract venv with
nothing stubbed (conftest's import probe):
- every rendered connector, resolved by vLLM's connector factory (which imports its
  module), must import;
- every compiled extension of vllm and lmcache, loaded after torch, must either load or
  fail only because the CUDA driver (libcuda.so.1) is not here. Any other failure, such as
  an undefined symbol, means the extension was built against another torch than the one
  the lock installs: on a GPU node it would not load either."""
import pytest

from conftest import kv_transfer_configs

DRIVER = "libcuda.so.1"


def test_connectors_import_without_a_gpu(import_probe):
    configs = kv_transfer_configs()
    assert set(import_probe["connectors"]) == set(configs)
    failed = {text: found["error"] for text, found in import_probe["connectors"].items() if found["error"]}
    assert not failed, "\n".join("%s/%s: %s -> %s" % (*configs[t][0], t, e) for t, e in failed.items())


def test_compiled_extensions_load_against_the_locked_torch(import_probe):
    broken = {name: error for name, error in import_probe["extensions"].items()
              if error and DRIVER not in error}
    assert not broken, (
        "compiled extensions that do not load against this venv's torch (not for want of a GPU):\n"
        + "\n".join("%s: %s" % item for item in sorted(broken.items())))


@pytest.mark.parametrize("package", ["vllm", "lmcache"])
def test_which_extensions_need_the_driver(import_probe, package):
    """Says, in the test report, exactly which imports need the CUDA driver (checked on a GPU node)."""
    need = sorted(n for n, e in import_probe["extensions"].items() if n.startswith(package + ".") and e and DRIVER in e)
    load = sorted(n for n, e in import_probe["extensions"].items() if n.startswith(package + ".") and not e)
    print("%s: need %s: %s; load here: %s" % (package, DRIVER, need or "none", load or "none"))
    assert need or load, "no compiled extension of %s found" % package
