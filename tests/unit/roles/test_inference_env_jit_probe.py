"""roles/inference_env/files/jit_probe.py: the run-time compile check (issue #35).

Run as the role runs it (`python -c <source> CACHE_DIR`), with this machine's compilers, or
none: a missing compiler or missing Python headers are named, and nothing is left behind.
A noexec mount cannot be made here; the lab's test_request_options.py covers the real thing.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SCRIPT = os.path.join(ROOT, "roles", "inference_env", "files", "jit_probe.py")


def probe(cache, **env):
    with open(SCRIPT, encoding="utf-8") as handle:
        source = handle.read()
    full = dict(os.environ)
    for key in ("CC", "CXX"):
        full.pop(key, None)
    full.update(env)
    proc = subprocess.run([sys.executable, "-c", source, str(cache)], env=full, capture_output=True, text=True,
                          timeout=120, check=False)
    return proc.returncode, json.loads(proc.stdout)


def has_headers():
    import sysconfig
    return os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))


@pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("g++") and has_headers()),
                    reason="needs gcc, g++ and this Python's headers")
def test_builds_and_loads_a_c_and_a_cpp_object_and_cleans_up(tmp_path):
    rc, result = probe(tmp_path)
    assert rc == 0 and result["problems"] == [], result
    assert os.path.basename(result["compilers"]["c"]) == "gcc"
    assert os.path.basename(result["compilers"]["c++"]) == "g++"
    assert list(tmp_path.iterdir()) == []


def test_no_compiler_on_path_is_named(tmp_path):
    rc, result = probe(tmp_path, PATH=str(tmp_path))
    assert rc == 1
    assert "no c compiler (gcc or clang) on PATH" in result["problems"]
    assert "no c++ compiler (g++) on PATH" in result["problems"]


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_a_compiler_that_fails_is_named_with_its_output(tmp_path):
    broken = tmp_path / "bin"
    broken.mkdir()
    cxx = broken / "g++"
    cxx.write_text("#!/bin/sh\necho 'fatal error: Python.h: No such file or directory' >&2\nexit 1\n")
    cxx.chmod(0o755)
    cache = tmp_path / "cache"
    cache.mkdir()
    rc, result = probe(cache, CXX=str(cxx))
    assert rc == 1, result
    assert any(p.startswith("c++ compiler %s failed to build against" % cxx) and "Python.h" in p
               for p in result["problems"]), result
    assert list(cache.iterdir()) == []
