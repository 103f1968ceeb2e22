"""Every --kv-transfer-config the roles render builds vLLM's KVTransferConfig, and its
connector resolves in vLLM's connector factory (the registry, or the module path it names)
to a class vLLM can construct; the connector's extra-config keys are keys its code reads."""
import json

import pytest

import contract
from conftest import kv_transfer_configs

CONFIGS = kv_transfer_configs()
IDS = ["%s (%s/%s)" % (json.loads(text)["kv_connector"], *CONFIGS[text][0]) for text in sorted(CONFIGS)]


@pytest.mark.parametrize("text", sorted(CONFIGS), ids=IDS)
def test_connector_resolves(text, cuda_boundary):  # pylint: disable=unused-argument
    where = "%s/%s" % CONFIGS[text][0]
    config = contract.kv_transfer_config(text, where)
    cls = contract.connector_class(config, where)
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    assert issubclass(cls, KVConnectorBase_V1), "%s: %s is not a vLLM v1 KV connector" % (where, cls)
    # vLLM asks the factory whether the connector supports the hybrid KV cache manager
    # while it builds its config; that must not raise either.
    KVConnectorFactory.supports_hma_config(config)


@pytest.mark.parametrize("text", sorted(CONFIGS), ids=IDS)
def test_connector_extra_config_keys_are_read(text, cuda_boundary):  # pylint: disable=unused-argument
    """A kv_connector_extra_config key that no code of the connector names is ignored."""
    where = "%s/%s" % CONFIGS[text][0]
    config = contract.kv_transfer_config(text, where)
    cls = contract.connector_class(config, where)
    keys = sorted(config.kv_connector_extra_config)
    if not keys:
        return
    modules = contract.relied_modules(cls.__module__, ["lmcache.integration.vllm", "vllm.distributed.kv_transfer"])
    literals, patterns = contract.string_constants(modules)
    # LMCache's MP adapter also takes "lmcache.mp.<member>" for each member of its defaults enum.
    try:
        from lmcache.integration.vllm.vllm_multi_process_adapter import ExtraConfigDefault

        literals = literals | {"lmcache.mp." + member.name for member in ExtraConfigDefault}
    except ImportError:
        pass
    unread = contract.unread_keys(keys, literals, patterns)
    assert not unread, "%s: kv_connector_extra_config keys %s appear nowhere in %s's code: ignored" % (
        where, unread, cls.__module__)


def test_multiprocess_connector_is_named_by_module_path(cuda_boundary):  # pylint: disable=unused-argument
    """vLLM's registry entry LMCacheMPConnector hands off to LMCache's own class today, and to
    vLLM's built-in copy with LMCACHE_USE_UPSTREAM_MP=1 (or when a future vLLM flips the
    default); the built-in one calls LMCache's adapter with arguments LMCache does not take
    (test_cross_calls.py). The rendered multiprocess config must name LMCache's module so
    the engine never depends on that hand-off."""
    mp = [t for t in CONFIGS if json.loads(t)["kv_connector"] == "LMCacheMPConnector"]
    assert mp, "no rendered instance uses LMCacheMPConnector (the multiprocess mode)"
    for text in mp:
        where = "%s/%s" % CONFIGS[text][0]
        config = contract.kv_transfer_config(text, where)
        assert config.kv_connector_module_path, (
            "%s: LMCacheMPConnector without kv_connector_module_path: the engine gets whatever vLLM's "
            "registry hands off to (fix: roles/vllm/vars/main.yml, kv_connector_module_path: "
            "lmcache.integration.vllm.lmcache_mp_connector)" % where)
        cls = contract.connector_class(config, where)
        assert cls.__module__.startswith("lmcache."), "%s: resolves to %s, not LMCache's class" % (where, cls)


def test_multiprocess_endpoint_matches_the_server(cuda_boundary):  # pylint: disable=unused-argument
    """The URL LMCache's MP connector dials (its own helper) is where the node's server listens."""
    from urllib.parse import urlsplit

    from lmcache.integration.vllm import lmcache_mp_connector as lmc

    from conftest import RENDERED

    checked = 0
    for text, users in CONFIGS.items():
        extra = json.loads(text).get("kv_connector_extra_config", {})
        if "lmcache.mp.host" not in extra:
            continue
        point = users[0][0]
        url = lmc._ensure_transport_scheme("%s:%s" % (extra["lmcache.mp.host"], extra.get("lmcache.mp.port", 5555)))  # pylint: disable=protected-access
        env = contract.parse_env_file(RENDERED[point]["lmcache-server.env"])
        unit = RENDERED[point]["kvcache-lmcache.service"]
        argv = contract.expand_exec(contract.unit_directives(unit, "ExecStart")[0], env)
        _args, configs = contract.lmcache_server_parse(argv[1:], "%s/lmcache-server.env" % point)
        server = configs["parse_args_to_mp_server_config"]
        dialed = urlsplit(url)
        assert (dialed.scheme, dialed.hostname, dialed.port) == ("tcp", server.host, server.port), (
            "%s: the engine dials %s, the server listens on %s:%s (transport %s)"
            % (point, url, server.host, server.port, server.transport))
        checked += 1
    assert checked, "no multiprocess instance was checked"
