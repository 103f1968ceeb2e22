"""GPUDirect Storage (kvcache_fs_gds) points: the LMCache config selects LMCache's own GDS backend
on the fs tier's mount, with the keys its GdsBackend reads, and no second (fs connector) copy; the
gds role's cufile.json is strict JSON whose every setting is one the pinned libcufile knows
(its dotted key names are strings in libcufile.so), with compat mode off; and the Python module
`cufile` GdsBackend imports when it starts comes from the pinned wheels and has the API it calls."""
import glob
import inspect
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

import contract
from conftest import INFO, POINTS, RENDERED, instance_files, point_inputs, rendered_path

GDS = [p for p in POINTS if "cufile.json" in RENDERED[p]]


def test_gds_points_are_rendered():
    assert GDS, "no point renders cufile.json: render.yml lost its kvcache_fs_gds points"
    assert all(point_inputs(p)["kvcache_fs_gds"] for p in GDS)
    assert not [p for p in POINTS if p not in GDS and point_inputs(p).get("kvcache_fs_gds")]
    # render.yml sets no mode for these points: roles/kvcache derives in-process from
    # kvcache_fs_gds (issue #21 item 3: multiprocess is the default otherwise).
    assert {point_inputs(p)["mode"] for p in GDS} == {"inprocess"}
    assert {point_inputs(p)["lmcache_mode"] for p in GDS} == {"inprocess"}


@pytest.mark.parametrize("point", GDS)
def test_lmcache_config_selects_the_gds_backend(point):
    inputs = point_inputs(point)
    name = next(n for p, n in instance_files() if p == point)
    env = contract.parse_env_file(RENDERED[point][name])
    where = "%s/lmcache-config.yaml" % point
    config = contract.load_lmcache_config(rendered_path(point, "lmcache-config.yaml"), env, where)
    assert config.gds_path == inputs["kvcache_fs_gds_path"], where
    assert config.use_gds is True and config.gds_backend == "cufile", where
    assert isinstance(config.gds_buffer_size, int) and config.gds_buffer_size > 0, where
    assert not config.remote_storage_plugins, "%s: the fs connector would store every chunk a second time" % where
    assert (config.extra_config or {}).get("use_direct_io") is True, (
        "%s: without extra_config.use_direct_io LMCache 0.5.6 opens files without O_DIRECT and cuFile cannot take "
        "the GDS path" % where)
    raw = yaml.safe_load(RENDERED[point]["lmcache-config.yaml"])
    assert "remote_storage_plugin.fs.base_path" not in (raw.get("extra_config") or {}), where


def test_lmcache_builds_a_gds_backend_from_gds_path():
    """The code the keys above drive: CreateStorageBackends adds GdsBackend when gds_path is set,
    GdsBackend reads use_gds, gds_backend, gds_buffer_size and extra_config use_direct_io, and
    opens its files through cufile.CuFile with use_direct_io."""
    from lmcache.v1 import storage_backend
    from lmcache.v1.storage_backend import gds_backend
    from lmcache.v1.storage_backend.path_sharder import PathSharder

    create = inspect.getsource(storage_backend.CreateStorageBackends)
    assert "config.gds_path is not None" in create and "GdsBackend(" in create
    source = inspect.getsource(gds_backend.GdsBackend)
    for needle in ("config.use_gds", "config.gds_backend", "config.gds_buffer_size", '"use_direct_io"',
                   "use_direct_io=self.use_direct_io"):
        assert needle in source, needle
    for point in GDS:
        path = point_inputs(point)["kvcache_fs_gds_path"]
        sharder = PathSharder(raw_csv=path, strategy="by_gpu", dst_device="cuda:0")
        assert sharder.all_paths == [path] and sharder.selected == path


def libcufile():
    import nvidia

    found = []
    for root in nvidia.__path__:
        found += glob.glob(os.path.join(root, "**", "libcufile.so*"), recursive=True)
    found = [f for f in found if "rdma" not in os.path.basename(f)]
    assert found, "the contract venv has no libcufile (nvidia-cufile wheel)"
    with open(found[0], "rb") as handle:
        return found[0], handle.read()


def leaves(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from leaves(value, prefix + key + ".")
        else:
            yield prefix + key


@pytest.mark.parametrize("point", GDS)
def test_cufile_json_is_what_libcufile_reads(point):
    cufile = json.loads(RENDERED[point]["cufile.json"])
    assert cufile["properties"]["allow_compat_mode"] is False, "%s: compat mode on by default" % point
    assert cufile["properties"]["rdma_dev_addr_list"] == point_inputs(point)["gds_rdma_dev_addrs"]
    path, binary = libcufile()
    unknown = [key for key in leaves(cufile) if key.encode() not in binary]
    assert not unknown, "%s/cufile.json: %s are no settings %s knows" % (point, unknown, path)


def test_libcufile_check_can_fail():
    binary = libcufile()[1]
    assert b"properties.allow_compat_mode" in binary
    assert b"properties.allow_compat_modes" not in binary


# --- the Python module LMCache's GdsBackend imports when it starts (issue #34 defect 6) ---
# lmcache/v1/storage_backend/gds_backend.py (0.5.6), GdsBackend.__init__ with gds_backend "cufile":
# `import cufile`, then `cufile.CuFileDriver()`; every transfer `cufile.CuFile(path, mode,
# use_direct_io=...)` as a context manager, `.read(ptr, size, file_offset=, dev_offset=)` and
# `.write(...)` alike. The module is the cufile-python distribution (LMCache requires it); at import
# it loads the C library by the name in its bindings (ctypes.CDLL), which the dynamic loader must find.
CUFILE_PROBE = r"""
import importlib.metadata, inspect, json, sys
import cufile
def params(func):
    return list(inspect.signature(func).parameters)
print(json.dumps({
    "file": cufile.__file__,
    "dists": importlib.metadata.packages_distributions().get("cufile", []),
    "driver": callable(cufile.CuFileDriver),
    "init": params(cufile.CuFile.__init__),
    "read": params(cufile.CuFile.read),
    "write": params(cufile.CuFile.write),
    "context": all(hasattr(cufile.CuFile, m) for m in ("__enter__", "__exit__")),
}))
"""


def cufile_library_names():
    """The library names the cufile module's bindings load (ctypes.CDLL / cdll.LoadLibrary), read, not imported."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("cufile")
    assert spec is not None and spec.submodule_search_locations, (
        "the contract venv has no Python module 'cufile': LMCache's GdsBackend imports it when it starts "
        "(gds_backend: cufile), so every engine with the GDS tier would fail; the cufile-python wheel provides it")
    names = []
    for path in glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.py")):
        with open(path, encoding="utf-8") as handle:
            for node in ast.walk(ast.parse(handle.read(), path)):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                        "CDLL", "LoadLibrary") and node.args and isinstance(node.args[0], ast.Constant):
                    names.append(node.args[0].value)
    return spec, names


def test_gds_backend_imports_the_cufile_module():
    from lmcache.v1.storage_backend import gds_backend

    init = inspect.getsource(gds_backend.GdsBackend.__init__)
    assert re.search(r"^\s*import cufile\s*$", init, re.M), "GdsBackend no longer imports cufile: read it again"
    source = inspect.getsource(gds_backend.GdsBackend)
    for needle in ("self.gds_module.CuFileDriver()", "self.gds_module.CuFile(", "use_direct_io=self.use_direct_io",
                   "file_offset=", "dev_offset="):
        assert needle in source, needle


def test_the_pinned_wheels_provide_the_cufile_module_gds_backend_imports(tmp_path):
    """The module comes from the pinned cufile-python (in the lock), loads a library the pinned
    nvidia-cufile wheel provides (given to the loader under the name the module asks for, as the
    node's loader path gives it), and has the API GdsBackend calls: a missing wheel, a renamed
    class or a changed signature fails here, not at the first GPU engine's start."""
    spec, names = cufile_library_names()
    assert names == ["libcufile.so"], "cufile's bindings load %s: check what provides them on the node" % names
    with open(INFO["lock"], encoding="utf-8") as handle:
        lock = handle.read()
    assert re.search(r"^cufile-python==\S+", lock, re.M), "cufile-python is not pinned in %s" % INFO["lock"]
    wheel_library = libcufile()[0]
    (tmp_path / "libcufile.so").symlink_to(wheel_library)
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", CUFILE_PROBE], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, "import cufile failed with %s as libcufile.so:\n%s" % (wheel_library, proc.stderr[-3000:])
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    assert probe["file"].startswith(os.path.dirname(list(spec.submodule_search_locations)[0])), probe
    assert probe["dists"] == ["cufile-python"], probe
    assert probe["driver"] and probe["context"], probe
    assert probe["init"][:4] == ["self", "path", "mode", "use_direct_io"], probe
    for method in ("read", "write"):
        assert probe[method][2:5] == ["size", "file_offset", "dev_offset"], (method, probe)


def test_the_cufile_check_can_fail(tmp_path):
    """Without a libcufile.so on the loader path the import fails: the probe above sees it."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["LD_LIBRARY_PATH"] = str(tmp_path)  # empty: only the system's own paths remain
    proc = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libcufile.so.kvcache-none')"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0 and "libcufile.so.kvcache-none" in proc.stderr
