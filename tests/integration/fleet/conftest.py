"""The GPU-shaped fleet's records and snapshots (written by scripts/fleet-test.sh under
build/fleet; `make fleet` runs the harness, which runs these tests last)."""
import ast
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STATE = os.path.join(ROOT, "build", "fleet")
NODES = {"gpu-a01": {"gpus": 8, "nvswitch": True, "address": "172.29.120.11"},
         "gpu-a02": {"gpus": 2, "nvswitch": False, "address": "172.29.120.12"}}
# The example inventory's settings these tests check the rendered state against (read from
# inventories/example below, not retyped where it matters).
EXAMPLE = os.path.join(ROOT, "inventories", "example")


def _need(path):
    if not os.path.exists(path):
        pytest.fail("%s is missing: run the harness (make fleet), which runs these tests" % path)
    return path


def record(run):
    with open(_need(os.path.join(STATE, "record-%s.json" % run))) as handle:
        data = json.load(handle)
    # A multi-line template renders as its Python repr (ansible-core 2.19): read it back.
    for key in ("nodes", "routers", "observability"):
        if isinstance(data.get(key), str):
            data[key] = ast.literal_eval(data[key].strip())
    return data


def log(run):
    with open(_need(os.path.join(STATE, "logs", "%s.log" % run))) as handle:
        return handle.read()


def state_dir(phase, node):
    return _need(os.path.join(STATE, "state-%s" % phase, node))


def read_env(path):
    """A systemd EnvironmentFile as written by the vllm role: KEY=VALUE lines, '' quoting."""
    env = {}
    with open(path) as handle:
        for line in handle:
            line = line.rstrip("\n")
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, value = line.split("=", 1)
            if len(value) >= 2 and value[0] == value[-1] == "'":
                value = value[1:-1]
            env[key] = value
    return env


def instance_envs(phase, node):
    """{instance name: env} of every instance settings file the node holds."""
    vllm_dir = os.path.join(state_dir(phase, node), "etc", "kvcache", "vllm")
    return {name[:-4]: read_env(os.path.join(vllm_dir, name))
            for name in sorted(os.listdir(vllm_dir)) if name.endswith(".env") and name != "api-key.env"}


def recap(text):
    """{host: {ok, changed, failed, ...}} from a run's PLAY RECAP."""
    hosts = {}
    seen = False
    for line in text.splitlines():
        if line.startswith("PLAY RECAP"):
            seen, hosts = True, {}
            continue
        if seen and ":" in line and "ok=" in line:
            host, counts = line.split(":", 1)
            hosts[host.strip()] = {k: int(v) for k, v in (item.split("=") for item in counts.split())}
    assert hosts, "no PLAY RECAP in the log"
    return hosts
