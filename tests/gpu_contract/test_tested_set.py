"""The contract venv is the tested set: inference_env resolved the pair within
roles/inference_env/files/tested/ (inference_env_tested_set), so what the contract passes with is
exactly what a GPU node of the same Python and machine installs, whenever it is converged. A CI
run of 2026-12-07 resolved the same commit against a package index that had gained a release
since the run before (sentry-sdk 3.0.0) and failed to build the venv."""
import importlib.metadata
import os
import re
import sysconfig

from conftest import INFO, ROOT

TESTED = os.path.join(ROOT, "roles", "inference_env", "files", "tested")


def _pins(path):
    with open(path, encoding="utf-8") as handle:
        return dict(line.split("==", 1) for line in handle.read().splitlines()
                    if line.strip() and not line.lstrip().startswith("#"))


def _norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(name):
    return os.path.join(INFO["pair_dir"], "requirements", name)


def test_the_pair_was_resolved_within_its_tested_set():
    with open(_requirements("constraints.txt"), encoding="utf-8") as handle:
        constraints = handle.read()
    if not INFO["tested"]:
        assert "No tested set for" in constraints
        return
    sets = [name for name in os.listdir(TESTED)
            if name.startswith("%s-%s-%s-lmcache-%s-py" % (INFO["profile"], INFO["package"], INFO["vllm"], INFO["lmcache"]))]
    assert sets, "a tested pair has no tested set in %s: run scripts/tested-set.sh %s" % (TESTED, INFO["profile"])
    assert "No tested set for" not in constraints, constraints.splitlines()[:2]
    assert _pins(_requirements("constraints.txt")) in [_pins(os.path.join(TESTED, name)) for name in sets]


def test_the_venv_holds_the_tested_versions():
    wanted = _pins(_requirements("constraints.txt")) if INFO["tested"] else _pins(_requirements("requirements.lock"))
    # the venv's own site-packages only: the pytest overlay appended to sys.path has its own packaging
    paths = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    installed = {_norm(dist.metadata["Name"]): dist.version for dist in importlib.metadata.distributions(path=paths)}
    differ = {name: (version, installed.get(_norm(name))) for name, version in wanted.items()
              if installed.get(_norm(name)) != version}
    assert not differ, "installed version differs from the tested set (wanted, installed): %s" % differ
