"""Routing policies as first-class settings (issue #22 item 1): the router role's rendered
arguments checked against the routers' own CLI parsers, its preflight refusals, and the nodes'
LMCache controller settings the lmcache role derives for kvaware.

Rendered by Ansible's own templating in a child interpreter with the collection loader over
build/collections (as tests/unit/roles/test_lmcache_workers_per_node.py), from the role files
themselves: defaults/main.yml + vars/main.yml for the arguments, and every assert task of
tasks/checks.yml (its when, that and fail_msg, with the task's vars) for the refusals.
KVCACHE_TEST_ROLES_DIR points the harness at another copy of roles/ (to run it on old code).

Contracts:
- production-stack: tests/unit/fixtures/production_stack (its parser.py at vllm-stack-0.1.12, kept as .txt,
  the pinned image's release, imported with a minimal stub of the router package);
- vllm-router: tests/unit/fixtures/vllm_router (router_args.py, kept as .txt, and --help of 0.1.17).
"""
import importlib
import importlib.machinery
import importlib.util
import json
import os
import re
import subprocess
import sys
from unittest import mock

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ROLES = os.environ.get("KVCACHE_TEST_ROLES_DIR", os.path.join(ROOT, "roles"))
COLLECTIONS = os.path.join(ROOT, "build", "collections")
FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures")

HARNESS = r"""
import json, sys
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=[sys.argv[1]])._install()
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template


def trust(value):
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [trust(v) for v in value]
    if isinstance(value, dict):
        return {k: trust(v) for k, v in value.items()}
    return value


def conditions(value):
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


job = json.load(sys.stdin)
out = []
for case in job["cases"]:
    variables = {}
    for layer in job["layers"]:
        variables.update(trust(layer))
    variables.update(trust(case))
    result = {}
    for name, expr in job.get("exprs", {}).items():
        result[name] = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expr))
    refusals = []
    for task in job.get("checks", []):
        spec = task.get("ansible.builtin.assert")
        if spec is None:
            continue
        task_vars = dict(variables)
        task_vars.update(trust(task.get("vars", {})))
        templar = Templar(loader=DataLoader(), variables=task_vars)
        def true(cond):
            return bool(templar.template(trust_as_template("{{ (%s) | bool }}" % cond)))
        if not all(true(c) for c in conditions(task.get("when"))):
            continue
        if not all(true(c) for c in conditions(spec["that"])):
            refusals.append({"task": task["name"], "msg": str(templar.template(trust_as_template(spec["fail_msg"])))})
    result["refusals"] = refusals
    out.append(result)
print(json.dumps(out, default=str))
"""


def load_source(name, path):
    """Import a vendored source kept as .txt (unchanged upstream code, outside the sanity lint)."""
    loader = importlib.machinery.SourceFileLoader(name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def load(*parts):
    with open(os.path.join(ROLES, *parts), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def run(layers, cases, exprs=None, checks=None):
    job = {"layers": layers, "cases": cases, "exprs": exprs or {}, "checks": checks or []}
    proc = subprocess.run([sys.executable, "-c", HARNESS, COLLECTIONS], input=json.dumps(job),
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


FAKE_CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
FAKE_KEY = "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n"
CLIENT_KEY = "c" * 40
ENGINE_KEY = "e" * 40
NODES = ["gpu-a01", "gpu-a02"]
BACKENDS = [{"host": "gpu-a01", "url": "http://10.0.0.11:8000", "model": "llama"},
            {"host": "gpu-a02", "url": "http://10.0.0.12:8000", "model": "llama"}]


def router_layers(node_vars=None):
    """The router host's variables: the fleet defaults (its dependency), role defaults, role vars, then what a run would have."""
    hostvars = {name: dict({"ansible_host": "10.0.0.%d" % (11 + i)}, **(node_vars or {}).get(name, {}))
                for i, name in enumerate(NODES)}
    run_vars = {
        "inventory_hostname": "router-1", "ansible_host": "10.0.0.5", "ansible_facts": {},
        "router_host": "10.0.0.5", "__router_backends": BACKENDS, "__router_ca_bundle": "/etc/ssl/ca.pem",
        "groups": {"kvcache_nodes": NODES, "kvcache_router": ["router-1"]}, "hostvars": hostvars,
        "router_preflight": True,  # as playbooks/preflight.yml: the engine lookup is not an input check
        # the TLS front's inputs (PEM text; tests/unit/roles/test_router_front.py checks the refusals)
        "router_tls_cert": FAKE_CERT, "router_tls_key": FAKE_KEY, "router_client_api_keys": [CLIENT_KEY],
        "kvcache_api_key": ENGINE_KEY,
    }
    return [load("kvcache", "defaults", "main.yml"), load("router", "defaults", "main.yml"), load("router", "vars", "main.yml"), run_vars]


def router_checks():
    return load("router", "tasks", "checks.yml")


# --- production-stack: the rendered arguments parse with the router's own parser ---------

PS_CASES = {
    "default": {},
    "roundrobin": {"router_routing_logic": "roundrobin"},
    "session": {"router_routing_logic": "session", "router_session_key": "x-user-id"},
    "prefixaware": {"router_routing_logic": "prefixaware", "router_prefix_min_match_length": 256},
    "prefixaware, any match": {"router_routing_logic": "prefixaware"},
    "kvaware": {"router_routing_logic": "kvaware", "router_lmcache_controller_port": 9100,
                "router_lmcache_controller_reply_port": 9101, "router_kv_aware_threshold": 512},
    "roundrobin, no health checks": {"router_routing_logic": "roundrobin", "router_static_backend_health_checks": False},
}


@pytest.fixture(scope="module")
def ps_rendered():
    names = sorted(PS_CASES)
    cases = [dict(PS_CASES[name], router_implementation="production_stack") for name in names]
    results = run(router_layers(), cases, exprs={"args": "{{ __router_ps_args }}"})
    return dict(zip(names, (r["args"] for r in results)))


@pytest.fixture(scope="module")
def ps_parse():
    """parse_args() of the vendored parser.py (vllm-stack-0.1.12), which reads sys.argv."""
    path = os.path.join(FIXTURES, "production_stack")
    saved = {k: v for k, v in sys.modules.items() if k == "vllm_router" or k.startswith("vllm_router.")}
    for key in saved:
        del sys.modules[key]
    sys.path.insert(0, path)
    try:
        importlib.import_module("vllm_router.parsers")
        parser = load_source("vllm_router.parsers.parser", os.path.join(path, "vllm_router", "parsers", "parser.py.txt"))
    finally:
        sys.path.remove(path)

    def parse(args):
        with mock.patch.object(sys, "argv", ["vllm-router"] + [str(a) for a in args]):
            return parser.parse_args()
    yield parse
    for key in [k for k in sys.modules if k == "vllm_router" or k.startswith("vllm_router.")]:
        del sys.modules[key]
    sys.modules.update(saved)


@pytest.mark.parametrize("name", sorted(PS_CASES))
def test_production_stack_parser_takes_every_routing_logic(ps_rendered, ps_parse, name):
    args = ps_parse(ps_rendered[name])
    case = PS_CASES[name]
    assert args.routing_logic == case.get("router_routing_logic", "prefixaware")
    assert args.service_discovery == "static"
    # through the front's key gateway on loopback, one port per backend (production-stack's
    # health checks carry no key; the gateway adds the engines' key)
    assert args.static_backends == "http://127.0.0.1:18200,http://127.0.0.1:18201"
    assert args.static_models == "llama,llama"
    # on loopback only: clients reach it through the TLS front on router_host:router_port
    assert args.host == "127.0.0.1" and args.port == 18101
    assert args.static_backend_health_checks is case.get("router_static_backend_health_checks", True)
    if args.static_backend_health_checks:
        assert args.static_model_types == "chat,chat"
        # upstream's default interval (60 s) keeps a restarting instance in rotation for a minute
        assert (args.static_backend_health_check_interval, args.static_backend_health_check_timeout_seconds) == (10, 10)
    assert args.session_key == case.get("router_session_key")
    assert args.prefix_min_match_length == case.get("router_prefix_min_match_length", 0)
    if name == "kvaware":
        assert (args.lmcache_controller_port, args.lmcache_controller_reply_port, args.kv_aware_threshold) == (9100, 9101, 512)
    else:
        # not rendered: the parser's defaults, and no controller reply socket
        assert "--lmcache-controller-port" not in ps_rendered[name]
        assert args.lmcache_controller_reply_port is None and args.kv_aware_threshold == 2000


def test_production_stack_parser_refuses_what_the_router_would_refuse(ps_parse, ps_rendered):
    """The contract can fail: a logic the image does not have, or session without a key."""
    args = list(ps_rendered["roundrobin"])
    with pytest.raises(SystemExit):
        ps_parse(args[:args.index("--routing-logic") + 1] + ["prefix_aware"] + args[args.index("--routing-logic") + 2:])
    with pytest.raises(ValueError, match="Session key"):
        ps_parse(args[:args.index("--routing-logic") + 1] + ["session"] + args[args.index("--routing-logic") + 2:])


def test_the_roles_routing_logics_are_the_parsers_choices(ps_parse):
    """Every logic the role accepts is one the pinned router has (the others need a node side
    this collection does not configure)."""
    with open(os.path.join(FIXTURES, "production_stack", "vllm_router", "parsers", "parser.py.txt"), encoding="utf-8") as handle:
        text = handle.read()
    choices = re.search(r'"--routing-logic",.*?choices=\[(.*?)\]', text, re.S).group(1)
    parser_logics = set(re.findall(r'"([a-z_]+)"', choices))
    role_logics = set(load("router", "vars", "main.yml")["__router_routing_logics"])
    assert role_logics <= parser_logics, role_logics - parser_logics
    assert parser_logics - role_logics == {"disaggregated_prefill", "disaggregated_prefill_orchestrated"}


# --- vllm-router: the rendered arguments parse with its own parser and are in its --help ---

VR_POLICIES = ["random", "round_robin", "cache_aware", "power_of_two", "consistent_hash"]
VR_TUNED = {"router_cache_threshold": 0.5, "router_balance_abs_threshold": 8, "router_balance_rel_threshold": 1.2,
            "router_eviction_interval_secs": 30, "router_max_tree_size": 1048576}


@pytest.fixture(scope="module")
def vr_rendered():
    cases = [{"router_implementation": "vllm_router", "router_policy": p} for p in VR_POLICIES]
    cases.append(dict(VR_TUNED, router_implementation="vllm_router", router_policy="cache_aware"))
    results = run(router_layers(), cases, exprs={"args": "{{ __router_vr_args }}"})
    return dict(zip(VR_POLICIES + ["cache_aware tuned"], (r["args"] for r in results)))


@pytest.fixture(scope="module")
def vr_module():
    return load_source("kvcache_test_vllm_router_args", os.path.join(FIXTURES, "vllm_router", "router_args.py.txt"))


def vr_parse(module, args):
    import argparse
    parser = argparse.ArgumentParser(prog="vllm-router")
    module.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    router_args = module.RouterArgs.from_cli_args(parser.parse_args([str(a) for a in args]), use_router_prefix=False)
    router_args._validate_router_args()  # pylint: disable=protected-access
    return router_args


@pytest.mark.parametrize("name", VR_POLICIES + ["cache_aware tuned"])
def test_vllm_router_parser_takes_every_policy(vr_rendered, vr_module, name):
    parsed = vr_parse(vr_module, vr_rendered[name])
    assert parsed.policy == name.split()[0]
    assert parsed.worker_urls == ["http://10.0.0.11:8000", "http://10.0.0.12:8000"]
    assert (parsed.host, parsed.port, parsed.prometheus_host, parsed.prometheus_port) == ("127.0.0.1", 18101, "127.0.0.1", 29101)
    expected = VR_TUNED if name == "cache_aware tuned" else {
        "router_cache_threshold": 0.3, "router_balance_abs_threshold": 64, "router_balance_rel_threshold": 1.5,
        "router_eviction_interval_secs": 120, "router_max_tree_size": 33554432}
    assert {k: getattr(parsed, k[len("router_"):]) for k in expected} == expected
    if name.startswith("cache_aware"):
        assert "--cache-threshold" in vr_rendered[name]
    else:
        assert "--cache-threshold" not in vr_rendered[name]


def test_the_cache_aware_defaults_are_vllm_routers_own(vr_module):
    """Rendered or not, the role's defaults are the router's: no behaviour change by default."""
    defaults = load("router", "defaults", "main.yml")
    for key in ["cache_threshold", "balance_abs_threshold", "balance_rel_threshold", "eviction_interval_secs", "max_tree_size"]:
        assert defaults["router_" + key] == getattr(vr_module.RouterArgs, key), key


def test_every_rendered_flag_is_in_the_captured_help(vr_rendered):
    with open(os.path.join(FIXTURES, "vllm_router", "help-0.1.17.txt"), encoding="utf-8") as handle:
        help_text = handle.read()
    help_flags = set(re.findall(r"--[a-z0-9-]+", help_text))
    rendered = {a for args in vr_rendered.values() for a in args if str(a).startswith("--")}
    assert rendered and rendered <= help_flags, rendered - help_flags
    policies = re.search(r"--policy \{([a-z_,]+)\}", help_text).group(1).split(",")
    vars_main = load("router", "vars", "main.yml")
    assert set(vars_main["__router_policies"]) | set(vars_main["__router_policies_not_configured"]) == set(policies)


# --- preflight refusals (tasks/checks.yml) --------------------------------------------------

KVAWARE_OK = {"router_implementation": "production_stack", "router_routing_logic": "kvaware",
              "router_image_lmcache_version": "0.5.6", "kvcache_lmcache_mode": "inprocess"}
# name: (router vars, node vars, refused task (None: accepted), words the message names)
REFUSALS = {
    "production_stack defaults": ({"router_implementation": "production_stack"}, {}, None, []),
    "vllm_router defaults": ({"router_implementation": "vllm_router"}, {}, None, []),
    "vllm_router cache_aware": ({"router_implementation": "vllm_router", "router_policy": "cache_aware"}, {}, None, []),
    "prefixaware": ({"router_implementation": "production_stack", "router_routing_logic": "prefixaware"}, {}, None, []),
    "vllm-router policy on production_stack": (
        {"router_implementation": "production_stack", "router_policy": "consistent_hash"}, {},
        "Fail on a vllm-router policy given to the production-stack router",
        ["router_policy is 'consistent_hash'", "router_routing_logic", "session"]),
    "kvaware on vllm_router": (
        {"router_implementation": "vllm_router", "router_routing_logic": "kvaware"}, {},
        "Fail on a production-stack routing logic given to vllm-router",
        ["router_routing_logic is 'kvaware'", "router_policy", "cache_aware"]),
    "vllm-router kv_aware": (
        {"router_implementation": "vllm_router", "router_policy": "kv_aware"}, {},
        "Fail on an unknown vllm-router policy", ["router_policy is 'kv_aware'", "KV-cache events"]),
    "production-stack logic as a vllm-router policy": (
        {"router_implementation": "vllm_router", "router_policy": "prefixaware"}, {},
        "Fail on an unknown vllm-router policy", ["production-stack routing logic", "router_routing_logic"]),
    "vllm-router policy as a production-stack logic": (
        {"router_implementation": "production_stack", "router_routing_logic": "cache_aware"}, {},
        "Fail on an unknown production-stack routing logic", ["vllm-router policy", "router_policy"]),
    "session without a key": (
        {"router_implementation": "production_stack", "router_routing_logic": "session"}, {},
        "Fail on session routing without a session key", ["router_session_key"]),
    "kvaware with the pinned image": (
        {"router_implementation": "production_stack", "router_routing_logic": "kvaware"}, {},
        "Fail on kvaware routing with a router LMCache the nodes' LMCache cannot talk to",
        ["router_image_lmcache_version", "0.3.11", "gpu-a01=0.5.6", "gpu-a02=0.5.6"]),
    "kvaware with a matching image": (KVAWARE_OK, {}, None, []),
    "kvaware, controller port 0": (
        dict(KVAWARE_OK, router_lmcache_controller_port=0), {},
        "Fail on kvaware routing without LMCache controller ports", ["router_lmcache_controller_port"]),
    "kvaware, one port for both": (
        dict(KVAWARE_OK, router_lmcache_controller_reply_port=9000), {},
        "Fail on kvaware routing without LMCache controller ports", ["router_lmcache_controller_reply_port"]),
    "kvaware, a node pinned to another LMCache": (
        KVAWARE_OK, {"gpu-a02": {"inference_env_lmcache_version": "0.4.1"}},
        "Fail on kvaware routing with a router LMCache the nodes' LMCache cannot talk to", ["gpu-a02=0.4.1"]),
    "kvaware, multiprocess LMCache": (
        dict(KVAWARE_OK, kvcache_lmcache_mode="multiprocess"), {},
        "Fail on kvaware routing when a node's LMCache cannot report to the controller",
        ["gpu-a01 multiprocess", "kvcache_lmcache_mode"]),
    # Issue #36: the check took the router host's own kvcache_lmcache_mode (multiprocess) for nodes that set only
    # kvcache_fs_gds, whose LMCache mode roles/kvcache derives as inprocess.
    "kvaware, GDS nodes (in-process by derivation)": (
        {k: v for k, v in KVAWARE_OK.items() if k != "kvcache_lmcache_mode"},
        {"gpu-a01": {"kvcache_fs_gds": True}, "gpu-a02": {"kvcache_fs_gds": True}}, None, []),
    "kvaware, a GDS node set to multiprocess": (
        {k: v for k, v in KVAWARE_OK.items() if k != "kvcache_lmcache_mode"},
        {"gpu-a01": {"kvcache_fs_gds": True}, "gpu-a02": {"kvcache_fs_gds": True, "kvcache_lmcache_mode": "multiprocess"}},
        "Fail on kvaware routing when a node's LMCache cannot report to the controller", ["gpu-a02 multiprocess"]),
    "kvaware, one node without LMCache": (
        KVAWARE_OK, {"gpu-a02": {"vllm_kv_connector": "example_shared_storage"}},
        "Fail on kvaware routing when a node's LMCache cannot report to the controller",
        ["gpu-a02 inprocess example_shared_storage", "vllm_kv_connector"]),
    "kvaware, controller turned off on a node": (
        KVAWARE_OK, {"gpu-a01": {"lmcache_extra_config": {"enable_controller": False}}},
        "Fail on kvaware routing when a node's LMCache cannot report to the controller", ["gpu-a01 inprocess lmcache False"]),
    "kvaware, two instances on a node": (
        dict(KVAWARE_OK, __router_backends=BACKENDS + [{"host": "gpu-a02", "url": "http://10.0.0.12:8001", "model": "llama"}]),
        {}, "Fail on kvaware routing with more than one instance on a node", ["gpu-a02 run more than one"]),
}


FLEET_WIDE = ("kvcache_lmcache_mode",)


def fleet_wide(router_vars, node_vars):
    """A fleet-wide setting given to the router in a case is in group_vars/all: every node's hostvars hold it too."""
    shared = {key: router_vars[key] for key in FLEET_WIDE if key in router_vars}
    return {node: dict(shared, **node_vars.get(node, {})) for node in NODES}


@pytest.fixture(scope="module")
def refusals():
    names = sorted(REFUSALS)
    cases = [dict(REFUSALS[name][0], hostvars=router_layers(fleet_wide(REFUSALS[name][0], REFUSALS[name][1]))[-1]["hostvars"])
             for name in names]
    results = run(router_layers(), cases, checks=router_checks())
    return dict(zip(names, (r["refusals"] for r in results)))


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_preflight_refuses_bad_routing_combinations(refusals, name):
    task, words = REFUSALS[name][2:]
    got = refusals[name]
    if task is None:
        assert got == [], got
        return
    assert [r["task"] for r in got][:1] == [task], got
    msg = got[0]["msg"]
    for word in ["Host router-1:", "Fix:"] + words:
        assert word in msg, (word, msg)


# --- kvaware's node side (roles/lmcache) ---------------------------------------------------

def lmcache_layers(router_vars):
    run_vars = {
        "inventory_hostname": "gpu-a01", "ansible_facts": {"memtotal_mb": 65536},
        "kvcache_tier": "fs", "kvcache_fs_path": "/mnt/kvcache", "kvcache_chunk_size": 256, "lmcache_chunk_size": 256,
        "kvcache_hash_algorithm": "sha256_cbor", "kvcache_lmcache_mode": "inprocess", "kvcache_venv_path": "/opt/kvcache/venv",
        "kvcache_config_dir": "/etc/kvcache", "kvcache_tensor_parallel_size": 2,
        "vllm_instances": [{"name": "gpu0", "port": 8000, "gpus": [0, 1]}],
        "groups": {"kvcache_router": ["router-1"], "kvcache_nodes": NODES},
        "hostvars": {"router-1": dict({"ansible_host": "10.0.0.5"}, **router_vars)},
    }
    return [load("kvcache", "defaults", "main.yml"), load("lmcache", "defaults", "main.yml"), load("lmcache", "vars", "main.yml"), run_vars]


CONTROLLER_KEYS = {"enable_controller", "lmcache_instance_id", "controller_pull_url", "controller_reply_url",
                   "lmcache_worker_ports"}


NODE_SIDE = {
    "kvaware": ({"router_implementation": "production_stack", "router_routing_logic": "kvaware"},
                {"enable_controller": True, "lmcache_instance_id": "gpu-a01", "controller_pull_url": "10.0.0.5:9000",
                 "controller_reply_url": "10.0.0.5:9001", "lmcache_worker_ports": [9400, 9401]}),
    "kvaware, router_host and ports": (
        {"router_implementation": "production_stack", "router_routing_logic": "kvaware", "router_host": "192.168.7.2", "router_lmcache_controller_port": 7000,
         "router_lmcache_controller_reply_port": 7001},
        {"enable_controller": True, "lmcache_instance_id": "gpu-a01", "controller_pull_url": "192.168.7.2:7000",
         "controller_reply_url": "192.168.7.2:7001", "lmcache_worker_ports": [9400, 9401]}),
    "kvaware, wildcard router_host": (
        {"router_implementation": "production_stack", "router_routing_logic": "kvaware", "router_host": "0.0.0.0"},
        {"enable_controller": True, "lmcache_instance_id": "gpu-a01", "controller_pull_url": "10.0.0.5:9000",
         "controller_reply_url": "10.0.0.5:9001", "lmcache_worker_ports": [9400, 9401]}),
    "roundrobin": ({}, {}),
    "prefixaware": ({"router_routing_logic": "prefixaware"}, {}),
    "vllm_router": ({"router_routing_logic": "kvaware", "router_implementation": "vllm_router"}, {}),
    # kvaware is production_stack's: with the default router (vllm_router) nothing reports
    "kvaware, the default router": ({"router_routing_logic": "kvaware"}, {}),
}


@pytest.fixture(scope="module")
def node_configs():
    names = sorted(NODE_SIDE)
    cases = [{"hostvars": lmcache_layers(NODE_SIDE[name][0])[-1]["hostvars"]} for name in names]
    results = run(lmcache_layers({}), cases, exprs={"config": "{{ __lmcache_config }}"})
    return dict(zip(names, (r["config"] for r in results)))


@pytest.mark.parametrize("name", sorted(NODE_SIDE))
def test_the_nodes_lmcache_reports_to_the_routers_controller_only_for_kvaware(node_configs, name):
    config = node_configs[name]
    assert {k: v for k, v in config.items() if k in CONTROLLER_KEYS} == NODE_SIDE[name][1]
    assert config["chunk_size"] == 256  # the rest of the file is still there


def test_the_lmcache_role_falls_back_to_the_router_roles_defaults():
    """The lmcache role reads the router's settings from hostvars, where an unset one is absent:
    its fallbacks must be the router role's defaults."""
    router = load("router", "defaults", "main.yml")
    text = open(os.path.join(ROLES, "lmcache", "vars", "main.yml"), encoding="utf-8").read()
    assert "router_lmcache_controller_port'] | default(%d)" % router["router_lmcache_controller_port"] in text
    assert "router_lmcache_controller_reply_port'] | default(%d)" % router["router_lmcache_controller_reply_port"] in text
    assert "router_routing_logic'] | default('%s')" % router["router_routing_logic"] in text
    assert "router_implementation'] | default('%s')" % router["router_implementation"] in text


def test_the_router_knows_the_nodes_tested_lmcache():
    pins = {entry["lmcache"] for entry in load("inference_env", "vars", "main.yml")["__inference_env_matrix"].values()}
    assert load("router", "vars", "main.yml")["__router_node_lmcache_default"] in pins and len(pins) == 1, pins


LMCACHE_VENV = os.path.join(ROOT, "build", "gpu-contract", "pins-0.32.0-0.5.6", "venv")


def lmcache_venv_is_complete(venv):
    """inference_env's own mark of a finished venv (tasks/sync.yml writes it last)."""
    return os.path.exists(os.path.join(venv, "bin", "python")) and os.path.exists(
        os.path.join(venv, "kvcache-requirements.lock"))


def test_a_venv_counts_only_once_inference_env_has_recorded_its_lock(tmp_path):
    """A venv in the making (interpreter there, packages not yet) is not taken for a built one."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    assert not lmcache_venv_is_complete(str(venv))
    (venv / "kvcache-requirements.lock").write_text("lmcache==0.5.6\n")
    assert lmcache_venv_is_complete(str(venv))
    sync = yaml.safe_load(open(os.path.join(ROOT, "roles", "inference_env", "tasks", "sync.yml")))
    names = [task.get("name", "") for task in sync]
    recorded = [i for i, task in enumerate(sync) if "kvcache-requirements.lock" in str(task)
                or "Record which lock" in task.get("name", "")]
    installed = [i for i, name in enumerate(names) if name.startswith("Install the locked packages")]
    imported = [i for i, name in enumerate(names) if name.startswith("Check that vllm and lmcache import")]
    assert recorded and installed and imported and recorded[0] > max(installed + imported), names


def test_lmcache_0_5_6_loads_the_kvaware_node_config(tmp_path, node_configs):
    """The keys are the ones LMCache 0.5.6 reads: its own loader and validation accept the
    file (enable_controller without controller_reply_url raises there).

    Needs the GPU contract's venv: `make check` runs before it is built (and skips this), so
    `make test` runs this test again after `make gpu-contract` with KVCACHE_REQUIRE_LMCACHE=1,
    where a missing venv fails instead of skipping.

    A venv counts only once inference_env has finished it: the lock it was built from is
    recorded last (kvcache-requirements.lock), after the install and the import check. Its
    bin/python exists from the first second of the build, which `make test` runs beside
    `make check`: the CI run of 2026-12-07 ran this test on a half-installed venv."""
    if not lmcache_venv_is_complete(LMCACHE_VENV):
        if os.environ.get("KVCACHE_REQUIRE_LMCACHE") == "1":
            pytest.fail("no finished LMCache 0.5.6 venv in %s: run make gpu-contract first" % LMCACHE_VENV)
        pytest.skip("no finished LMCache 0.5.6 venv (make gpu-contract builds build/gpu-contract)")
    config = node_configs["kvaware"]
    path = tmp_path / "lmcache-config.yaml"
    path.write_text(yaml.safe_dump(config))
    probe = ("import sys; from lmcache.v1.config import LMCacheEngineConfig as C; c = C.from_file(sys.argv[1]);"
             "print(c.enable_controller, c.controller_pull_url, c.controller_reply_url, c.lmcache_worker_ports,"
             " c.lmcache_instance_id)")
    env = dict(os.environ, LMCACHE_TRACK_USAGE="false", DO_NOT_TRACK="1", LMCACHE_LOG_LEVEL="ERROR")
    proc = subprocess.run([os.path.join(LMCACHE_VENV, "bin", "python"), "-c", probe, str(path)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "True 10.0.0.5:9000 10.0.0.5:9001 [9400, 9401] gpu-a01"


def test_the_defaults_are_the_cache_aware_policies():
    """Issue #22 item 4: by default both routers keep a session's repeat turns where its prefix
    is (make bench, docs/benchmarks.md "Routing"), with nothing needed on the nodes; the copies
    the checks compare against are the defaults."""
    defaults, internal = load("router", "defaults", "main.yml"), load("router", "vars", "main.yml")
    assert (defaults["router_policy"], defaults["router_routing_logic"]) == ("cache_aware", "prefixaware")
    assert (internal["__router_default_policy"], internal["__router_default_logic"]) == (
        defaults["router_policy"], defaults["router_routing_logic"])
    specs = load("router", "meta", "argument_specs.yml")["argument_specs"]
    for entry in specs.values():
        options = entry.get("options", {})
        for name in ("router_policy", "router_routing_logic"):
            if name in options:
                assert options[name]["default"] == defaults[name], (name, options[name]["default"])
