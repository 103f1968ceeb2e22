"""Stage 7's probe against the pinned LMCache: every name the GDS path of the validation's
storage probe (plugins/module_utils/lmcache_probe.py, gds_io) calls exists in LMCache's real
GdsBackend with the arguments the probe passes. The CUDA part (cuFile, GPU memory) stops at the
hardware boundary; up to it the names must match, or stage 7 fails on the first GPU node."""
import importlib.util
import inspect
import os
import re

from lmcache.v1 import storage_backend
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.storage_backend.gds_backend import GdsBackend

HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC = importlib.util.spec_from_file_location(
    "kvcache_lmcache_probe", os.path.join(HERE, "..", "..", "plugins", "module_utils", "lmcache_probe.py"))
lmcache_probe = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(lmcache_probe)


def test_the_storage_manager_files_the_gds_backend_under_the_name_the_probe_looks_up():
    assert '"storage_backends", None) or {}).get("GdsBackend")' in lmcache_probe.SCRIPT
    source = inspect.getsource(storage_backend.CreateStorageBackends)
    assert "GdsBackend(" in source and "storage_backends[str(gds_backend)]" in source
    assert inspect.getsource(GdsBackend.__str__).strip().endswith("return self.__class__.__name__")


def params(func):
    return list(inspect.signature(func).parameters)


def test_gds_backend_methods_take_what_the_probe_passes():
    assert params(GdsBackend.allocate)[:4] == ["self", "shapes", "dtypes", "fmt"]
    assert params(GdsBackend.submit_put_task)[:3] == ["self", "key", "memory_obj"]
    assert params(GdsBackend.contains)[:2] == ["self", "key"]
    assert params(GdsBackend.get_blocking) == ["self", "key"]
    assert MemoryFormat.KV_2LTD is not None
    for call in ("gds.allocate(", "gds.submit_put_task(key, obj)", "gds.contains(key)", "gds.get_blocking(key)",
                 "MemoryFormat.KV_2LTD"):
        assert call in lmcache_probe.SCRIPT, call


def test_the_attributes_the_probe_reports_are_set_by_gds_backend():
    init = inspect.getsource(GdsBackend.__init__)
    for attr in re.findall(r'getattr\(gds, "(\w+)"', lmcache_probe.SCRIPT) + ["put_tasks"]:
        assert re.search(r"self\.%s\s*(:[^=]+)?=" % attr, init), attr
