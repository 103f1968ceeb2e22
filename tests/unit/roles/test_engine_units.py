"""The vLLM and LMCache units as the roles render them (issue #32 items 2 and 5): the engine guard
is loaded from root's directory with no key on the command line, and both units are sandboxed,
with the NVIDIA devices only where the node's instances have GPUs (the GPU-shaped fleet renders
these units but never starts them: this is where its DeviceAllow lines are asserted).

Rendered by Ansible's own templating from the roles' defaults and vars, so the derived
variables (__vllm_unit_rw_paths, lmcache_sandbox_nvidia_devices, ...) are the roles' own."""
import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ROLES = os.path.join(ROOT, "roles")

SANDBOX = ("NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "ProtectHome=yes",
           "ProtectKernelTunables=yes", "ProtectKernelModules=yes", "ProtectKernelLogs=yes",
           "ProtectControlGroups=yes", "ProtectClock=yes", "ProtectHostname=yes",
           "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK", "RestrictNamespaces=yes",
           "LockPersonality=yes", "RestrictRealtime=yes", "RestrictSUIDSGID=yes",
           "SystemCallArchitectures=native", "CapabilityBoundingSet=")


def _trusted(text):
    try:  # ansible-core 2.19+: templates are trusted only when marked
        from ansible.template import trust_as_template
        return trust_as_template(text)
    except ImportError:  # pragma: no cover
        return text


def _trust_deep(value):
    if isinstance(value, str):
        return _trusted(value)
    if isinstance(value, dict):
        return {k: _trust_deep(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trust_deep(v) for v in value]
    return value


def _load(*parts):
    with open(os.path.join(ROLES, *parts)) as handle:
        data = yaml.safe_load(handle) or {}
    return {k: _trust_deep(v) for k, v in data.items()}


def render(role, template, **overrides):
    variables = {"ansible_managed": "managed", "inventory_hostname": "gpu-a01"}
    variables.update(_load("kvcache", "defaults", "main.yml"))
    variables.update(_load(role, "defaults", "main.yml"))
    variables.update(_load(role, "vars", "main.yml"))
    variables.update({"kvcache_api_key": "k" * 40, "kvcache_model": "/models/m", "kvcache_hash_seed": 1,
                      "kvcache_tier": "fs", "__vllm_guard_sha1": "0" * 40, "lmcache_chunk_size": 256})
    variables.update(overrides)
    with open(os.path.join(ROLES, role, "templates", template)) as handle:
        source = handle.read()
    text = str(Templar(loader=DataLoader(), variables=variables).template(_trusted(source)))
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def vllm_unit(**overrides):
    return render("vllm", "kvcache-vllm@.service.j2", **overrides)


def lmcache_unit(**overrides):
    return render("lmcache", "kvcache-lmcache.service.j2", **overrides)


GPU_INSTANCES = [{"name": "gpu0", "port": 8000, "gpus": [0, 1]}, {"name": "gpu2", "port": 8001, "gpus": [2, 3]}]
CPU_INSTANCES = [{"name": "cpu0", "port": 8000}]


def test_the_guard_is_loaded_and_the_key_stays_off_the_command_line():
    lines = vllm_unit(vllm_instances=CPU_INSTANCES)
    start = [line for line in lines if line.startswith("ExecStart=")]
    assert len(start) == 1 and " --middleware kvcache_engine_guard.EngineGuard" in start[0], start
    assert "Environment=PYTHONPATH=/opt/kvcache/guard" in lines
    assert 'Environment="KVCACHE_GUARD_OPEN_PATHS=/health /metrics"' in lines
    assert "EnvironmentFile=/etc/kvcache/vllm/api-key.env" in lines
    assert not [line for line in lines if "k" * 40 in line or "api-key " in line or "--api-key" in line]


@pytest.mark.parametrize("unit", [vllm_unit, lmcache_unit])
def test_units_are_sandboxed_without_write_execute_denial(unit):
    lines = unit(vllm_instances=CPU_INSTANCES)
    for setting in SANDBOX:
        assert setting in lines, "%s missing from %s" % (setting, unit.__name__)
    # torch inductor and triton write and run code at run time
    assert not [line for line in lines if line.startswith("MemoryDenyWriteExecute")]


@pytest.mark.parametrize("unit", [vllm_unit, lmcache_unit])
def test_a_gpu_node_gets_its_nvidia_devices_and_nothing_else(unit):
    lines = unit(vllm_instances=GPU_INSTANCES)
    assert "DevicePolicy=closed" in lines
    allowed = [line.split("=", 1)[1] for line in lines if line.startswith("DeviceAllow=")]
    for dev in ("char-nvidia-frontend rw", "char-nvidia rw", "char-nvidia-uvm rw", "char-nvidia-caps rw",
                "/dev/nvidiactl rw", "/dev/nvidia-uvm rw"):
        assert dev in allowed, (unit.__name__, allowed)
    assert all("nvidia" in dev for dev in allowed), allowed
    assert "PrivateDevices=yes" not in lines
    assert "ExecStartPre=-+/usr/bin/nvidia-modprobe -c0 -u" in lines


def test_instances_derived_from_the_gpus_get_the_devices():
    """The fleet's shape: no vllm_instances, instances derived from the GPUs the node has."""
    assert "DevicePolicy=closed" in lmcache_unit(vllm_instances=[])


@pytest.mark.parametrize("unit", [vllm_unit, lmcache_unit])
def test_a_cpu_node_gets_no_physical_device(unit):
    lines = unit(vllm_instances=CPU_INSTANCES)
    assert "PrivateDevices=yes" in lines
    assert not [line for line in lines if line.startswith(("DeviceAllow=", "DevicePolicy=", "ExecStartPre="))]


def test_gds_adds_nvidia_fs_and_rdma_devices():
    allowed = [line for line in vllm_unit(vllm_instances=GPU_INSTANCES, kvcache_fs_gds=True,
                                          kvcache_lmcache_mode="inprocess") if line.startswith("DeviceAllow=")]
    assert "DeviceAllow=char-nvidia-fs rw" in allowed and "DeviceAllow=char-infiniband_verbs rw" in allowed


@pytest.mark.parametrize("connector, mode, tier, writes_tier", [
    ("lmcache", "multiprocess", "fs", False),  # the LMCache server writes the tier, not the engine
    ("lmcache", "inprocess", "fs", True),
    ("example_shared_storage", "multiprocess", "fs", True),
    ("lmcache", "inprocess", "s3", False),
])
def test_the_engine_writes_its_home_and_the_tier_only_when_it_writes_the_tier(connector, mode, tier, writes_tier):
    lines = vllm_unit(vllm_instances=CPU_INSTANCES, vllm_kv_connector=connector, kvcache_lmcache_mode=mode,
                      kvcache_tier=tier, kvcache_fs_path="/mnt/kvcache")
    paths = [line.split("=", 1)[1].split() for line in lines if line.startswith("ReadWritePaths=")]
    assert paths == [["/var/lib/kvcache", "/mnt/kvcache"] if writes_tier else ["/var/lib/kvcache"]], paths


def test_the_lmcache_server_writes_its_home_and_the_fs_tier():
    lines = lmcache_unit(vllm_instances=CPU_INSTANCES, kvcache_fs_path="/mnt/kvcache",
                         lmcache_sandbox_read_write_paths=["-/srv/extra"])
    assert "ReadWritePaths=/var/lib/kvcache /mnt/kvcache -/srv/extra" in lines


@pytest.mark.parametrize("unit, var", [(vllm_unit, "vllm_sandbox"), (lmcache_unit, "lmcache_sandbox")])
def test_the_sandbox_can_be_turned_off(unit, var):
    lines = unit(vllm_instances=GPU_INSTANCES, **{var: False})
    assert "ProtectSystem=strict" not in lines and "DevicePolicy=closed" not in lines


def test_an_instances_workers_listen_on_loopback():
    """Issue #32 item 2: torch.distributed's gloo pairs bound to the address the host name resolves
    to (13 ports of the fleet address on a lab node); the instance's settings pin them to loopback."""
    lines = render("vllm", "instance.env.j2", item=GPU_INSTANCES[0], __kvcache_fingerprints=["none"] * 4,
                   vllm_bind_address="10.0.0.1")
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["VLLM_LOOPBACK_IP"] == "127.0.0.1"
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["NCCL_SOCKET_IFNAME"] == "lo"
    assert "--host 10.0.0.1" in env["VLLM_ARGS"]  # the API itself stays on the fleet address


@pytest.mark.parametrize("mode,engines_get_keys", [("multiprocess", False), ("inprocess", True)])
def test_the_s3_keys_go_only_to_the_process_that_uses_them(mode, engines_get_keys):
    """Issue #33 item 4: in multiprocess mode the LMCache server alone talks to S3, so the engines'
    unit must not load the S3 keys (it did, in every mode). In in-process mode LMCache runs in the engine."""
    s3_file = "EnvironmentFile=/etc/kvcache/s3-credentials.env"
    engine = vllm_unit(vllm_instances=CPU_INSTANCES, kvcache_tier="s3", kvcache_lmcache_mode=mode)
    assert (s3_file in engine) is engines_get_keys, engine
    if mode == "multiprocess":
        assert s3_file in lmcache_unit(vllm_instances=CPU_INSTANCES, kvcache_tier="s3", kvcache_lmcache_mode=mode)
    assert s3_file not in vllm_unit(vllm_instances=CPU_INSTANCES, kvcache_tier="fs", kvcache_lmcache_mode=mode)


@pytest.mark.parametrize("tls", [False, True])
def test_with_engine_tls_the_key_reaches_the_engine_as_a_credential(tls):
    """kvcache_engine_tls: the engine serves HTTPS with the node's certificate; its key is read
    by systemd (root-only on disk) and handed over as a credential, never a file the service
    user reads; without it, no TLS argument at all."""
    lines = vllm_unit(vllm_instances=CPU_INSTANCES, kvcache_engine_tls=tls)
    start = [line for line in lines if line.startswith("ExecStart=")][0]
    creds = [line for line in lines if line.startswith("LoadCredential=")]
    if tls:
        assert creds == ["LoadCredential=engine-tls.key:/etc/kvcache/vllm/tls/engine.key"], creds
        assert start.endswith(" --ssl-certfile /etc/kvcache/vllm/tls/engine.crt --ssl-keyfile %d/engine-tls.key"), start
    else:
        assert not creds and "--ssl" not in start, (creds, start)


def test_a_new_engine_certificate_or_key_restarts_the_instance():
    env = render("vllm", "instance.env.j2", item=CPU_INSTANCES[0],
                 __kvcache_fingerprints=["a", "b", "c", "d", "cert-fp", "key-fp"], kvcache_engine_tls=True,
                 vllm_bind_address="10.0.0.1")
    assert "KVCACHE_ENGINE_TLS_CERT_FINGERPRINT=cert-fp" in env
    assert "KVCACHE_ENGINE_TLS_KEY_FINGERPRINT=key-fp" in env


def _server_env(**overrides):
    """lmcache-server.env as the role renders it on the s3 tier (the half-open adapter's SHA-1 stubbed)."""
    import json as _json
    values = dict(kvcache_tier="s3", kvcache_s3_bucket="kvcache", kvcache_s3_endpoint="https://s3.grid.example:10443",
                  __lmcache_s3_host="s3.grid.example:10443", __lmcache_s3_tls=True, __kvcache_fingerprints=["a", "b"],
                  lmcache_mp_l1_size_gb=1, __lmcache_mp_l1_gb=1.0, lmcache_mp_max_gpu_workers=1)
    values.update(overrides)
    variables = {"__lmcache_s3_plugin_file": {"checksum": "0123abcd"}}
    variables.update(values)
    lines = render("lmcache", "lmcache-server.env.j2", **variables)
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    return env, _json.loads(env["LMCACHE_L2_ADAPTER"].strip("'"))


def test_the_s3_tier_loads_the_half_open_adapter_through_lmcaches_plugin_adapter():
    """Issue #40: LMCache 0.5.6's own S3 adapter never closes its circuit breaker; the server gets the
    collection's (files/kvcache_s3_l2.py) with the same settings, and the PYTHONPATH it is imported from."""
    env, adapter = _server_env()
    assert adapter == {"type": "plugin", "module_path": "kvcache_s3_l2", "class_name": "RecoveringS3L2Adapter",
                       "adapter_params": {"s3_endpoint": "kvcache.s3.grid.example:10443", "s3_region": "us-east-1",
                                          "disable_tls": False, "retry_after_seconds": 30}}, adapter
    assert env["PYTHONPATH"] == "/opt/kvcache/tools" and env["KVCACHE_S3_ADAPTER_SHA1"] == "0123abcd"
    plain, adapter = _server_env(lmcache_s3_retry_after_seconds=0)
    assert adapter == {"type": "s3", "s3_endpoint": "kvcache.s3.grid.example:10443", "s3_region": "us-east-1",
                       "disable_tls": False}, adapter
    assert "PYTHONPATH" not in plain
    fs, adapter = _server_env(kvcache_tier="fs")
    assert adapter["type"] == "fs" and "PYTHONPATH" not in fs
