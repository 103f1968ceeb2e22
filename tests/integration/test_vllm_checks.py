"""The vllm role's input checks refuse a node left with no instance, naming the inputs that
led there and the fix (#18 item 4; roles/vllm/tasks/checks.yml, commit 2c8a088).

tests/integration/vllm_checks/playbook.yml runs `tasks_from: checks` on this machine (local
connection, --check), made GPU-shaped by the fleet's nvidia-smi shim on PATH replaying a
captured 2-GPU PCIe server (tests/integration/fleet/fixtures/gpu-a02): gpu_facts finds 2 GPUs,
and the example's tensor-parallel size is raised past them, as a fleet-wide TP would on the
smaller node.
"""
import os
import secrets
import subprocess

import pytest
import yaml

from conftest import ROOT, _ansible_playbook, ansible_env, flat

HERE = os.path.join(ROOT, "tests", "integration", "vllm_checks")
FLEET = os.path.join(ROOT, "tests", "integration", "fleet")


@pytest.fixture
def vllm_checks(tmp_path):
    """Run the checks with extra vars; return (rc, flat output, recap of gpu-node)."""

    def run(extra_vars):
        shim_dir = tmp_path / "bin"
        shim_dir.mkdir(exist_ok=True)
        shim = shim_dir / "nvidia-smi"
        if not shim.exists():
            shim.symlink_to(os.path.join(FLEET, "shims", "nvidia-smi"))
        data = {"vllm_bind_address": "127.0.0.1", "kvcache_api_key": "test-key-not-a-secret-0123456789abcdef",
                # a seed made here: every seed the repository writes is refused as well known
                "kvcache_hash_seed": secrets.randbelow(2**32),
                "kvcache_model": "meta-llama/Llama-3.1-8B-Instruct"}
        data.update(extra_vars)
        vars_file = tmp_path / "vars.yml"
        vars_file.write_text(yaml.safe_dump(data))
        env = ansible_env(tmp_path, PATH="%s:%s" % (shim_dir, os.environ.get("PATH", "")),
                          KVCACHE_FLEET_GPU_DIR=os.path.join(FLEET, "fixtures", "gpu-a02"))
        proc = subprocess.run(
            [_ansible_playbook(), "-i", os.path.join(HERE, "inventory.yml"), os.path.join(HERE, "playbook.yml"),
             "--check", "-e", "ansible_python_interpreter=%s" % os.path.join(os.path.dirname(_ansible_playbook()), "python"),
             "-e", "@%s" % vars_file],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
        recap = None
        for line in proc.stdout.splitlines():
            if line.startswith("gpu-node ") and "ok=" in line:
                recap = {k: int(v) for k, v in (i.split("=") for i in line.split(":", 1)[1].split())}
        return proc.returncode, flat(proc.stdout + proc.stderr), recap

    return run


def test_a_tp_larger_than_the_nodes_gpus_names_the_inputs_and_the_fix(vllm_checks):
    rc, out, recap = vllm_checks({"kvcache_tensor_parallel_size": 4})
    assert rc != 0 and recap and recap["failed"] == 1 and recap["changed"] == 0, out[-3000:]
    for fragment in (
            "Host gpu-node: no vLLM instance to run",
            "vllm_gpu_count 2 (gpu_facts found 2 GPUs) // kvcache_tensor_parallel_size 4 = 0",
            "Fix: lower kvcache_tensor_parallel_size to at most 2",
            "list this host's instances in vllm_instances",
            "set vllm_gpu_count"):
        assert fragment in out, "%r not in:\n%s" % (fragment, out[-3000:])


def test_gpu_facts_not_gathered_is_said(vllm_checks):
    rc, out, recap = vllm_checks({"fleet_gather_gpu_facts": False})
    assert rc != 0 and recap and recap["failed"] == 1, out[-3000:]
    assert "vllm_gpu_count 0 (gpu_facts found nothing: not gathered GPUs)" in out, out[-3000:]
    assert "install and load the driver (playbooks/host_prep.yml)" in out, out[-3000:]


def test_a_zero_tp_names_the_variable(vllm_checks):
    rc, out, _recap = vllm_checks({"kvcache_tensor_parallel_size": 0})
    assert rc != 0
    assert "host gpu-node: kvcache_tensor_parallel_size is 0. Fix: set kvcache_tensor_parallel_size" in out, out[-3000:]


def test_the_fix_it_names_passes(vllm_checks):
    """The same node at the TP the message proposes: the checks pass (the test can tell)."""
    rc, out, recap = vllm_checks({"kvcache_tensor_parallel_size": 2})
    assert rc == 0 and recap["failed"] == 0 and recap["changed"] == 0, out[-3000:]


def test_a_short_api_key_is_refused_naming_the_fix(vllm_checks):
    """Issue #32 item 4: a key shorter than 32 characters is refused before any host changes
    (the old check refused only an empty key, and this run passed)."""
    rc, out, recap = vllm_checks({"kvcache_tensor_parallel_size": 2, "kvcache_api_key": "short-key-31-chars-0123456789ab"})
    assert rc != 0 and recap and recap["failed"] == 1 and recap["changed"] == 0, out[-3000:]
    assert "Host gpu-node: kvcache_api_key is shorter than 32 characters" in out, out[-3000:]
    assert "a random key of 32 characters or more in vault as kvcache_api_key" in out, out[-3000:]
    assert "short-key-31-chars" not in out, "the key itself was printed"


@pytest.mark.parametrize("seed,problem", [
    ("", "kvcache_hash_seed is not set"),
    (0, "kvcache_hash_seed is a well-known value (0: the LMCache operator's"),
    (123, "kvcache_hash_seed is a well-known value (123: the vLLM production-stack chart's value"),
    ("12ab", "kvcache_hash_seed is not a decimal integer from 0 to 4294967295"),
    (4294967296, "kvcache_hash_seed is not a decimal integer from 0 to 4294967295"),
])
def test_a_missing_or_public_hash_seed_is_refused_naming_the_fix(vllm_checks, seed, problem):
    """Issue #33 item 2: the seed names LMCache's objects, so a public one lets a tier writer plant KV.
    The old default (0) and the examples' 123 passed these checks."""
    rc, out, recap = vllm_checks({"kvcache_tensor_parallel_size": 2, "kvcache_hash_seed": seed})
    assert rc != 0 and recap and recap["failed"] == 1 and recap["changed"] == 0, out[-3000:]
    assert "Host gpu-node: %s" % problem in out, out[-3000:]
    assert "keep it in vault as vault_kvcache_hash_seed" in out, out[-3000:]


def test_a_public_hash_seed_passes_when_the_operator_accepts_it(vllm_checks):
    rc, out, recap = vllm_checks({"kvcache_tensor_parallel_size": 2, "kvcache_hash_seed": 123,
                                  "kvcache_hash_seed_allow_public": True})
    assert rc == 0 and recap["failed"] == 0, out[-3000:]


def test_client_limits_out_of_range_or_set_twice_are_refused(vllm_checks):
    """Issue #35 item 4: the limits a client cannot exceed are checked before any host changes:
    each problem named with its variable, in one message."""
    rc, out, recap = vllm_checks({
        "kvcache_tensor_parallel_size": 2, "vllm_max_tokens": -1, "vllm_max_num_seqs": 8, "vllm_max_n": 9,
        "vllm_extra_args": ["--max-num-seqs=64", "--enable-prefix-caching"],
        "vllm_extra_env": {"VLLM_MAX_N_SEQUENCES": "100"}})
    assert rc != 0 and recap and recap["failed"] == 1 and recap["changed"] == 0, out[-3000:]
    for fragment in (
            "Host gpu-node: vllm_max_tokens is -1 (0 for no cap but the context length, else at least 1)",
            "vllm_max_n 9 is above vllm_max_num_seqs 8",
            "vllm_extra_args or an instance's extra_args set --max-num-seqs=64, which the limits render",
            "vllm_extra_env or an instance's env sets VLLM_MAX_N_SEQUENCES: set vllm_max_n instead",
            'Fix: correct those variables (docs/roles/vllm.md, "Limits")'):
        assert fragment in out, "%r not in:\n%s" % (fragment, out[-3000:])
    assert "--enable-prefix-caching" not in out.split("Host gpu-node: vllm_max_tokens")[1][:600]


def test_client_limits_of_the_wrong_type_are_refused(vllm_checks):
    rc, out, recap = vllm_checks({"kvcache_tensor_parallel_size": 2, "vllm_max_tokens": "lots"})
    assert rc != 0 and recap and recap["failed"] == 1, out[-3000:]
    assert "vllm_max_tokens" in out and "lots" in out, out[-3000:]


def test_client_limits_at_zero_leave_the_flags_to_extra_args(vllm_checks):
    """A limit at 0 renders no flag, so the same flag in vllm_extra_args is the operator's own."""
    rc, out, recap = vllm_checks({"kvcache_tensor_parallel_size": 2, "vllm_max_num_seqs": 0,
                                  "vllm_extra_args": ["--max-num-seqs", "64"]})
    assert rc == 0 and recap["failed"] == 0, out[-3000:]


def test_engine_guard_and_sandbox_settings_that_cannot_run_are_refused(vllm_checks):
    """Issue #32 items 2 and 5: an open-path list without /health (the router's health checks and the
    role's wait would get 401), a path that is not one, an env that would replace the guard's module
    path, and a model the sandbox hides (ProtectHome) are refused, each named, before any host changes."""
    rc, out, recap = vllm_checks({
        "kvcache_tensor_parallel_size": 2, "vllm_guard_open_paths": ["/metrics", "ping me"],
        "vllm_extra_env": {"PYTHONPATH": "/srv/mine"}, "kvcache_model": "/home/ops/models/llama"})
    assert rc != 0 and recap and recap["failed"] == 1 and recap["changed"] == 0, out[-3000:]
    for fragment in (
            'Host gpu-node: vllm_guard_open_paths ["/metrics", "ping me"] lacks /health',
            'vllm_guard_open_paths holds ["ping me"] (each an exact path starting with /, no spaces)',
            "vllm_extra_env or an instance's env sets PYTHONPATH, which the unit sets for the engine guard",
            "kvcache_model /home/ops/models/llama is under /home, /root or /run/user, which vllm_sandbox hides",
            'Fix: correct those variables (docs/roles/vllm.md, "Engine guard" and "Sandbox")'):
        assert fragment in out, "%r not in:\n%s" % (fragment, out[-3000:])


def test_the_model_under_home_passes_without_the_sandbox(vllm_checks):
    rc, out, recap = vllm_checks({"kvcache_tensor_parallel_size": 2, "vllm_sandbox": False,
                                  "kvcache_model": "/home/ops/models/llama", "vllm_model_must_exist": False})
    assert rc == 0 and recap["failed"] == 0, out[-3000:]
