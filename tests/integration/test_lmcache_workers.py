"""The lmcache role sizes a node's LMCache server for every TP rank of its GPUs also when it
runs without the vllm role's defaults, as rolling_upgrade.yml runs it (include_role before the
vllm role): issue #34 defect 3.

tests/integration/lmcache_workers/playbook.yml runs on this machine (local connection,
--check), made GPU-shaped by the fleet's nvidia-smi shim replaying a captured 2-GPU PCIe server
(tests/integration/fleet/fixtures/gpu-a02), as tests/integration/test_vllm_checks.py does.
"""
import json
import os
import subprocess

import pytest

from conftest import ROOT, _ansible_playbook, ansible_env

HERE = os.path.join(ROOT, "tests", "integration", "lmcache_workers")
FLEET = os.path.join(ROOT, "tests", "integration", "fleet")


@pytest.mark.parametrize("tp, workers", [(1, 2), (2, 2)])
def test_rolling_upgrades_pattern_counts_the_nodes_gpus(tmp_path, tp, workers):
    """Failed on the old role: vllm_gpu_count undefined there, so 0 GPUs, one worker
    (--max-gpu-workers 1, and the next site.yml restarted the server with 2)."""
    shim_dir = tmp_path / "bin"
    shim_dir.mkdir()
    (shim_dir / "nvidia-smi").symlink_to(os.path.join(FLEET, "shims", "nvidia-smi"))
    out = tmp_path / "workers.json"
    env = ansible_env(tmp_path, PATH="%s:%s" % (shim_dir, os.environ.get("PATH", "")),
                      KVCACHE_FLEET_GPU_DIR=os.path.join(FLEET, "fixtures", "gpu-a02"))
    proc = subprocess.run(
        [_ansible_playbook(), "-i", os.path.join(HERE, "inventory.yml"), os.path.join(HERE, "playbook.yml"), "--check",
         "-e", "ansible_python_interpreter=%s" % os.path.join(os.path.dirname(_ansible_playbook()), "python"),
         "-e", json.dumps({"lmcache_workers_file": str(out), "kvcache_tensor_parallel_size": tp})],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    derived = json.loads(out.read_text())
    assert derived == {"gpus": 2, "workers": workers, "max_gpu_workers": workers}, derived
