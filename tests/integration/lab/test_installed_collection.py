"""The collection as a portal runs it: built, installed from its tarball, not the checkout (#23).

`make dist` (scripts/dist.sh) builds the tarball and installs it into build/dist/collections;
this test makes it when it is missing (without the sanity step, which `make dist` runs). Then it
validates the lab with the *installed* copy's playbook, `kvcache.offload.validate`, and only that
copy on the collections path: its roles, modules, filters and module_utils do the work.
"""
import json
import os
import subprocess
import sys

from labutil import ROOT

DIST = os.path.join(ROOT, "build", "dist")
INSTALLED = os.path.join(DIST, "collections", "ansible_collections", "kvcache", "offload")
BIN = os.path.dirname(sys.executable)


def _env(tmp_path):
    env = dict(os.environ)
    env.update({
        "PATH": BIN + os.pathsep + env.get("PATH", ""),
        # Only the installed copy (and the PyPI `ansible` package's collections on sys.path).
        "ANSIBLE_COLLECTIONS_PATH": os.path.join(DIST, "collections"),
        "ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-home" / "tmp"),
    })
    return env


def _installed():
    if not os.path.exists(os.path.join(INSTALLED, "MANIFEST.json")):
        subprocess.run([os.path.join(ROOT, "scripts", "dist.sh")], cwd=ROOT, check=True, timeout=900,
                       env=dict(os.environ, DIST_SANITY="0", PATH=BIN + os.pathsep + os.environ.get("PATH", "")))
    return INSTALLED


def test_the_installed_collection_validates_the_lab(tmp_path, instances):  # pylint: disable=unused-argument
    installed = _installed()
    env = _env(tmp_path)
    listed = subprocess.run([os.path.join(BIN, "ansible-galaxy"), "collection", "list", "kvcache.offload",
                             "--format", "json"], env=env, capture_output=True, text=True, timeout=120, check=True)
    paths = list(json.loads(listed.stdout))
    assert paths == [os.path.dirname(os.path.dirname(installed))], listed.stdout
    assert not os.path.exists(os.path.join(installed, "roles", "s3_store"))  # lab-only: not shipped
    reports = tmp_path / "reports"
    proc = subprocess.run(
        [os.path.join(BIN, "ansible-playbook"), "-i", os.path.join(ROOT, "inventories", "lab", "hosts.yml"),
         "kvcache.offload.validate", "-vv", "-e", "validation_report_dir=%s" % reports],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    # The roles ran from the installed copy: -vv prints every task's path, and they point into it.
    task_paths = [line.split("task path:", 1)[1].strip() for line in proc.stdout.splitlines() if "task path:" in line]
    assert task_paths and any(p.startswith(installed + "/roles/validation/") for p in task_paths), task_paths[:5]
    assert not [p for p in task_paths if not p.startswith(installed + "/")], task_paths
    with open(str(reports / "validation-latest.json"), encoding="utf-8") as handle:
        report = json.load(handle)
    assert report["result"] == "pass", [(s["id"], s["status"]) for s in report["stages"]]
