"""GPUDirect Storage (kvcache_fs_gds) points: the LMCache config selects LMCache's own GDS backend
on the fs tier's mount, with the keys its GdsBackend reads, and no second (fs connector) copy; the
gds role's cufile.json is strict JSON whose every setting is one the pinned libcufile knows
(its dotted key names are strings in libcufile.so), with compat mode off."""
import glob
import inspect
import json
import os

import pytest
import yaml

import contract
from conftest import POINTS, RENDERED, instance_files, point_inputs, rendered_path

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
