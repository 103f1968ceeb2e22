"""scripts/ee_stage.py and the pins of the execution environment (make ee, docs/execution-environment.md)."""
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile

import pytest
import yaml

import ee_stage

ROOT = ee_stage.ROOT
PIP_CONFIG_LIST = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='/opt/wheels'
global.extra-index-url='file:///opt/pypi/simple https://mirror.example.invalid/simple'
global.find-links='/opt/wheels'
global.index-url='https://first.example.invalid/simple'
user.index-url='https://second.example.invalid/simple'
user.trusted-host='mirror.example.invalid'
:env:.default-timeout='180'
"""


def _ee():
    with open(os.path.join(ROOT, "execution-environment.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _dev_pins():
    return ee_stage.read_pins(os.path.join(ROOT, "requirements-dev.txt"))


def test_pip_config_keeps_remote_sources_and_the_cert_drops_local_ones():
    settings = ee_stage.parse_pip_config(PIP_CONFIG_LIST)
    assert settings["index-url"] == ["https://second.example.invalid/simple"]  # the last one wins
    assert settings["extra-index-url"] == ["https://mirror.example.invalid/simple"]
    assert settings["trusted-host"] == ["mirror.example.invalid"]
    assert settings["cert"] == "/etc/ssl/certs/ca-certificates.crt"
    assert settings["timeout"] == "180"
    conf = ee_stage.render_pip_conf(settings)
    assert "file://" not in conf and "/opt/wheels" not in conf
    assert "index-url = https://second.example.invalid/simple" in conf
    assert "cert = /opt/ee-build/ca-bundle.crt" in conf
    assert "constraint = /opt/ee-build/requirements.txt" in conf


def test_pip_config_without_sources_writes_no_index_line():
    conf = ee_stage.render_pip_conf(ee_stage.parse_pip_config(""))
    assert "index-url" not in conf and "trusted-host" not in conf
    assert conf.startswith("# Build-only")


def _fake_collection(tmp_path):
    src = tmp_path / "installed" / "ns" / "coll"
    (src / "plugins" / "filter").mkdir(parents=True)
    body = b"def f(x):\n    return x\n"
    (src / "plugins" / "filter" / "f.py").write_bytes(body)
    files = {"files": [
        {"name": ".", "ftype": "dir", "chksum_type": None, "chksum_sha256": None, "format": 1},
        {"name": "plugins", "ftype": "dir", "chksum_type": None, "chksum_sha256": None, "format": 1},
        {"name": "plugins/filter", "ftype": "dir", "chksum_type": None, "chksum_sha256": None, "format": 1},
        {"name": "plugins/filter/f.py", "ftype": "file", "chksum_type": "sha256",
         "chksum_sha256": hashlib.sha256(body).hexdigest(), "format": 1},
        # Listed, but left out of the installed copy (as the PyPI `ansible` package does).
        {"name": ".azure-pipelines", "ftype": "dir", "chksum_type": None, "chksum_sha256": None, "format": 1},
        {"name": "tests/unit/test_f.py", "ftype": "file", "chksum_type": "sha256", "chksum_sha256": "0" * 64,
         "format": 1},
    ], "format": 1}
    files_bytes = json.dumps(files).encode()
    (src / "FILES.json").write_bytes(files_bytes)
    manifest = {"collection_info": {"namespace": "ns", "name": "coll", "version": "1.2.3", "authors": ["a"],
                                    "readme": "README.md", "tags": [], "description": "d", "license": ["MIT"],
                                    "license_file": None, "dependencies": {}, "repository": None,
                                    "documentation": None, "homepage": None, "issues": None},
                "file_manifest_file": {"name": "FILES.json", "ftype": "file", "chksum_type": "sha256",
                                       "chksum_sha256": hashlib.sha256(files_bytes).hexdigest(), "format": 1},
                "format": 1}
    (src / "MANIFEST.json").write_text(json.dumps(manifest))
    return src


def test_an_installed_collection_packs_into_an_artifact_ansible_galaxy_installs(tmp_path):
    src = _fake_collection(tmp_path)
    tarball = str(tmp_path / "ns-coll-1.2.3.tar.gz")
    assert ee_stage.pack_installed_collection(str(src), tarball) == 2  # two listed files were absent
    with tarfile.open(tarball) as tar:
        names = sorted(tar.getnames())
        files = json.load(tar.extractfile("FILES.json"))
        manifest = json.load(tar.extractfile("MANIFEST.json"))
        files_raw = tar.extractfile("FILES.json").read()
    assert names == ["FILES.json", "MANIFEST.json", "plugins", "plugins/filter", "plugins/filter/f.py"]
    assert [f["name"] for f in files["files"]] == [".", "plugins", "plugins/filter", "plugins/filter/f.py"]
    assert manifest["file_manifest_file"]["chksum_sha256"] == hashlib.sha256(files_raw).hexdigest()
    assert ee_stage.artifact_version(tarball) == ("ns", "coll", "1.2.3")
    # The same collection packed again has the same content hash (the image is not rebuilt).
    again = str(tmp_path / "again.tar.gz")
    ee_stage.pack_installed_collection(str(src), again)
    assert ee_stage.artifact_digest(again) == ee_stage.artifact_digest(tarball)
    galaxy = os.path.join(os.path.dirname(sys.executable), "ansible-galaxy")
    if not os.path.exists(galaxy):
        pytest.skip("ansible-galaxy is not next to this Python")
    dest = tmp_path / "collections"
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(dest), ANSIBLE_HOME=str(tmp_path / "home"))
    proc = subprocess.run([galaxy, "collection", "install", "--offline", "--no-deps", "-p", str(dest), tarball],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (dest / "ansible_collections" / "ns" / "coll" / "plugins" / "filter" / "f.py").read_text().startswith("def f")


def test_ee_installs_ansible_core_and_runner_at_the_dev_pins():
    deps, pins = _ee()["dependencies"], _dev_pins()
    assert deps["ansible_core"]["package_pip"] == "ansible-core==%s" % pins["ansible-core"]
    assert deps["ansible_runner"]["package_pip"] == "ansible-runner==%s" % pins["ansible-runner"]
    assert _ee()["images"]["base_image"]["name"] == "kvcache-offload/debian12-systemd:current"


def test_the_lock_pins_everything_and_agrees_with_requirements_dev_and_the_direct_pins():
    lock_path = os.path.join(ROOT, "ee", "requirements.txt")
    with open(lock_path, encoding="utf-8") as handle:
        lines = [line.split("#", 1)[0].strip() for line in handle]
    lines = [line for line in lines if line]
    assert lines and all(re.match(r"^[A-Za-z0-9_.-]+==[^=<>~!,;\s]+$", line) for line in lines), lines
    lock, dev = ee_stage.read_pins(lock_path), _dev_pins()
    direct = ee_stage.read_pins(os.path.join(ROOT, "ee", "requirements.in"))
    for name in ("ansible-core", "ansible-runner", "boto3", "prometheus-client", "jmespath", "docker"):
        assert lock[name] == dev[name], name
    for name, version in direct.items():
        assert lock.get(name) == version, name
    for name in set(lock) & set(dev):
        assert lock[name] == dev[name], "ee/requirements.txt and requirements-dev.txt disagree on %s" % name


def _site_packages_collections():
    path = os.path.join(sysconfig.get_paths()["purelib"], "ansible_collections")
    if not os.path.isdir(os.path.join(path, "netapp", "ontap")):
        pytest.skip("the PyPI `ansible` package is not installed in this Python (make venv)")
    return path


def test_collection_pins_are_the_ansible_package_versions_and_galaxy_yml_version():
    base = _site_packages_collections()
    with open(os.path.join(ROOT, "galaxy.yml"), encoding="utf-8") as handle:
        galaxy = yaml.safe_load(handle)
    pins = {(ns, name): version for ns, name, version, _f in
            ee_stage.collection_pins(os.path.join(ROOT, "ee", "requirements.yml"))}
    assert pins[("kvcache", "offload")] == galaxy["version"]
    for dep in galaxy["dependencies"]:
        assert tuple(dep.split(".")) in pins, "galaxy.yml depends on %s; ee/requirements.yml lacks it" % dep
    for (ns, name), version in pins.items():
        if ns == "kvcache":
            continue
        with open(os.path.join(base, ns, name, "MANIFEST.json"), encoding="utf-8") as handle:
            info = json.load(handle)["collection_info"]
        assert info["version"] == version, (ns, name)
        for dep in info["dependencies"]:
            assert tuple(dep.split(".")) in pins, "%s.%s needs %s" % (ns, name, dep)


def _declared_python_requirements(path):
    meta = os.path.join(path, "meta", "execution-environment.yml")
    files = []
    if os.path.exists(meta):
        with open(meta, encoding="utf-8") as handle:
            python = (yaml.safe_load(handle).get("dependencies") or {}).get("python")
        if isinstance(python, str):
            files.append(os.path.join(path, python))
    elif os.path.exists(os.path.join(path, "requirements.txt")):
        files.append(os.path.join(path, "requirements.txt"))
    names = []
    for name in files:
        with open(name, encoding="utf-8") as handle:
            for line in handle:
                line = line.split("#", 1)[0].strip()
                if line:
                    names.append(ee_stage.normalize(re.split(r"[=<>!~\[; ]", line, maxsplit=1)[0]))
    return names


def test_every_python_requirement_a_collection_declares_is_pinned_or_excluded():
    base = _site_packages_collections()
    lock = ee_stage.read_pins(os.path.join(ROOT, "ee", "requirements.txt"))
    excluded = {ee_stage.normalize(n) for n in _ee()["dependencies"]["exclude"]["python"]}
    builder_excluded = {"ansible", "ansible-core", "pyyaml", "yaml"}  # ansible-builder's own exclusions
    missing = []
    for ns, name, _v, _f in ee_stage.collection_pins(os.path.join(ROOT, "ee", "requirements.yml")):
        if ns == "kvcache":
            continue
        for req in _declared_python_requirements(os.path.join(base, ns, name)):
            if req not in lock and req not in excluded and req not in builder_excluded:
                missing.append("%s.%s: %s" % (ns, name, req))
    assert missing == []


def test_inputs_hash_changes_with_an_input_and_not_with_repacking(tmp_path):
    src = _fake_collection(tmp_path)
    stage = tmp_path / "stage" / "collections"
    stage.mkdir(parents=True)
    ee_stage.pack_installed_collection(str(src), str(stage / "ns-coll-1.2.3.tar.gz"))
    other = tmp_path / "stage" / "pip.conf"
    other.write_text("a\n")
    first = ee_stage.inputs_hash([str(tmp_path / "stage")], extra=["base1"])
    ee_stage.pack_installed_collection(str(src), str(stage / "ns-coll-1.2.3.tar.gz"))
    assert ee_stage.inputs_hash([str(tmp_path / "stage")], extra=["base1"]) == first
    assert ee_stage.inputs_hash([str(tmp_path / "stage")], extra=["base2"]) != first
    other.write_text("b\n")
    assert ee_stage.inputs_hash([str(tmp_path / "stage")], extra=["base1"]) != first
