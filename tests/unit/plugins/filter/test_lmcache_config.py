"""Unit tests for kvcache.offload.lmcache_config_problems and its generated table."""
import os
import subprocess
import sys
import zipfile

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.kvcache.offload.plugins.filter import lmcache_config as c
from ansible_collections.kvcache.offload.plugins.module_utils import lmcache_config_table as table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def problems(config):
    return c.lmcache_config_problems(config)


def test_the_table_is_the_pinned_lmcache():
    # The version inference_env installs (both profiles of its matrix); regenerate the table
    # (scripts/gen-lmcache-config-table.py) when it moves.
    with open(os.path.join(ROOT, "roles", "inference_env", "vars", "main.yml"), encoding="utf-8") as handle:
        matrix = yaml.safe_load(handle)["__inference_env_matrix"]
    assert {profile["lmcache"] for profile in matrix.values()} == {table.LMCACHE_VERSION} == {"0.5.6"}
    # Keys the role itself writes, with LMCache's types.
    assert table.DEFINITIONS["local_cpu"] == ("bool", False)
    assert table.DEFINITIONS["chunk_size"] == ("int", False)
    assert table.DEFINITIONS["max_local_cpu_size"] == ("float", False)
    assert table.DEFINITIONS["extra_config"] == ("dict", True)
    assert table.DEFINITIONS["remote_url"] == ("str", True)
    assert table.ALIASES["enable_xpyd"] == "enable_pd"


def test_every_key_the_role_renders_is_in_the_table():
    # roles/lmcache/vars/main.yml: __lmcache_base and both remote tiers.
    with open(os.path.join(ROOT, "roles", "lmcache", "vars", "main.yml"), encoding="utf-8") as handle:
        role_vars = yaml.safe_load(handle)
    keys = set(role_vars["__lmcache_base"])
    for tier in role_vars["__lmcache_remote"].values():
        keys |= set(tier)
    assert keys - set(table.DEFINITIONS) == set()


@pytest.mark.parametrize("value", ["false", "true", "yes", "no", "False", 0, 1])
def test_a_non_boolean_where_lmcache_wants_a_boolean_is_an_error(value):
    found = problems({"save_unfull_chunk": value})
    assert found["warnings"] == []
    (error,) = found["errors"]
    assert error.startswith("lmcache_extra_config.save_unfull_chunk is %r" % (value,))
    assert "true or false, unquoted" in error


def test_the_string_yes_is_explained_as_lmcache_reads_it():
    (error,) = problems({"local_cpu": "yes"})["errors"]
    assert "'yes' would be False" in error


@pytest.mark.parametrize("config", [
    {"save_unfull_chunk": True, "local_cpu": False},
    {"chunk_size": 512, "max_local_cpu_size": 5, "max_local_disk_size": 2.5},
    {"remote_url": None, "pd_buffer_size": None},
    {"blend_check_layers": [1, 2], "blend_thresholds": [0.5, 1], "storage_plugins": ["a"]},
    {"extra_config": {"s3_region": "us-east-1", "disable_tls": False, "s3_num_io_threads": 64}},
    {},
])
def test_right_types_pass(config):
    assert problems(config) == {"errors": [], "warnings": [], "lmcache_version": "0.5.6"}


@pytest.mark.parametrize("config, fragment", [
    ({"chunk_size": "256"}, "lmcache_extra_config.chunk_size is '256' (string), LMCache 0.5.6 wants a whole number"),
    ({"chunk_size": 256.5}, "chunk_size is 256.5 (float)"),
    ({"chunk_size": True}, "chunk_size is True (boolean)"),
    ({"max_local_cpu_size": "5GB"}, "max_local_cpu_size is '5GB' (string)"),
    ({"chunk_size": None}, "chunk_size is None (null)"),
    ({"blend_check_layers": "1,2"}, "a list of whole numbers"),
    ({"blend_check_layers": [1, "2"]}, "a list of whole numbers"),
    ({"remote_url": 5}, "remote_url is 5 (int), LMCache 0.5.6 wants a string or null"),
    ({"extra_config": {"save_chunk_meta": "false"}}, "lmcache_extra_config.extra_config.save_chunk_meta is the string 'false'"),
])
def test_wrong_types_are_errors(config, fragment):
    (error,) = problems(config)["errors"]
    assert fragment in error


def test_unknown_keys_and_aliases_warn():
    found = problems({"local_cpus": True, "enable_xpyd": False})
    assert found["errors"] == []
    assert found["warnings"] == [
        "lmcache_extra_config.enable_xpyd: LMCache 0.5.6 reads this deprecated name as enable_pd; write enable_pd.",
        "lmcache_extra_config.local_cpus: LMCache 0.5.6 does not define this key and ignores it (a typo?).",
    ]


def test_an_alias_is_checked_with_its_target_type():
    found = problems({"enable_xpyd": "no"})
    assert len(found["errors"]) == 1 and "enable_xpyd is 'no'" in found["errors"][0]


def test_the_name_is_used_in_messages():
    (error,) = c.lmcache_config_problems({"local_cpu": "no"}, "myvar")["errors"]
    assert error.startswith("myvar.local_cpu")


def test_not_a_mapping_is_refused():
    with pytest.raises(AnsibleFilterError, match="lmcache_extra_config must be a mapping"):
        problems(["local_cpu"])


def test_the_generator_reproduces_the_table(tmp_path):
    """scripts/gen-lmcache-config-table.py on the pinned wheel writes the committed table (when the wheel is here)."""
    cache = os.path.join(ROOT, "build", "cache", "lmcache-wheel")
    wheels = sorted(f for f in os.listdir(cache) if f.startswith("lmcache-0.5.6-")) if os.path.isdir(cache) else []
    if not wheels:
        pytest.skip("no lmcache 0.5.6 wheel in build/cache/lmcache-wheel (pip download --no-deps lmcache==0.5.6)")
    wheel = os.path.join(cache, wheels[0])
    assert zipfile.is_zipfile(wheel)
    out = tmp_path / "table.py"
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen-lmcache-config-table.py"), wheel, str(out)],
                   check=True, capture_output=True)
    committed = os.path.join(ROOT, "plugins", "module_utils", "lmcache_config_table.py")
    with open(committed, encoding="utf-8") as handle:
        assert out.read_text() == handle.read()


@pytest.mark.parametrize("env", [
    {"LMCACHE_LOCAL_CPU": "True", "LMCACHE_CHUNK_SIZE": "256", "LMCACHE_MAX_LOCAL_CPU_SIZE": "5.5"},
    {"LMCACHE_LOCAL_CPU": False, "LMCACHE_SAVE_DECODE_CACHE": "0", "LMCACHE_BLEND_CHECK_LAYERS": "1,2"},
    {"LMCACHE_TRACK_USAGE": "false", "LMCACHE_CONFIG_FILE": "/etc/x.yaml", "PYTHONHASHSEED": "0"},
])
def test_lmcache_env_values_lmcache_reads_right_pass(env):
    assert c.lmcache_env_problems(env) == []


@pytest.mark.parametrize("env, fragment", [
    ({"LMCACHE_LOCAL_CPU": "yes"}, "vllm_extra_env.LMCACHE_LOCAL_CPU is 'yes': LMCache 0.5.6 reads it as true or false"),
    ({"LMCACHE_CHUNK_SIZE": "256k"}, "LMCACHE_CHUNK_SIZE is '256k'"),
    ({"LMCACHE_MAX_LOCAL_CPU_SIZE": "5GB"}, "drop it (None)"),
    ({"LMCACHE_BLEND_CHECK_LAYERS": "1;2"}, "a list of whole numbers"),
    ({"LMCACHE_ENABLE_XPYD": "on"}, "(key enable_pd)"),
])
def test_lmcache_env_values_lmcache_misreads_are_errors(env, fragment):
    (error,) = c.lmcache_env_problems(env)
    assert fragment in error
