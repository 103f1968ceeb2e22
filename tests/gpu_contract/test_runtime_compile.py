"""The CUDA build's run-time compiles find what they need on a node the roles prepared (issue #35).

On a GPU node the engines compile at run time: triton builds its CUDA launcher and driver
utilities with the host's C compiler the first time a kernel runs, torch inductor compiles C++
for its CPU code paths, FlashInfer JIT-compiles its ops with a C++ compiler (and nvcc, whose host
compiler is the system's). Each includes the headers of the Python running it and loads the
result from a cache directory. On vLLM's CPU build the same gap killed an engine on a client's
logprobs request (the lab's tests/integration/lab/test_request_options.py).

No GPU here to run them, so this reads what each asks for from the pinned code itself and checks
it against what the roles give a node, statically:
- the compiler commands each looks up are installed by inference_env's package list of every OS
  family it supports (vars/<os_family>.yml, __inference_env_jit_packages), by the commands those
  packages install (PACKAGE_COMMANDS: the packages' contents, Debian/Ubuntu and RHEL 9);
- triton and FlashInfer build against the interpreter's include directory, and that list holds
  the headers package of the interpreter the venv is made from;
- every rendered instance environment points the cache variables the pinned torch and triton
  read (checked by asking them) into the directory inference_env makes for the service user, and
  a sandboxed unit may write it and run what is built there.

Run only this file: scripts/gpu-contract.sh -k test_runtime_compile
"""
import ast
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import yaml

import contract
from conftest import RENDERED, ROOT, instance_files

ROLE = os.path.join(ROOT, "roles", "inference_env")
OS_FAMILIES = ("Debian", "RedHat")
# The commands each package name installs (its files in /usr/bin, alternatives included).
PACKAGE_COMMANDS = {
    "Debian": {"gcc": {"gcc", "cc"}, "g++": {"g++", "c++"}, "clang": {"clang", "clang++"}},
    "RedHat": {"gcc": {"gcc", "cc"}, "gcc-c++": {"g++", "c++"}, "clang": {"clang", "clang++"}},
}
# The Python headers package of an interpreter (/usr/bin/python3.11 -> python3.11-devel).
HEADERS_PACKAGE = {"Debian": "{}-dev", "RedHat": "{}-devel"}


def role_vars(name):
    with open(os.path.join(ROLE, "vars", name + ".yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def module_tree(module):
    """The AST of a module's file, found without importing it (triton, FlashInfer)."""
    spec = importlib.util.find_spec(module)
    assert spec and spec.origin, "%s is not in the contract venv" % module
    with open(spec.origin, encoding="utf-8") as handle:
        return spec.origin, ast.parse(handle.read())


def calls(tree, dotted):
    """Every call of `dotted` (e.g. shutil.which) in the tree."""
    owner, name = dotted.rsplit(".", 1)
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == name and ast.unparse(node.func.value) == owner]


def literal_args(nodes, position):
    return {n.args[position].value for n in nodes
            if len(n.args) > position and isinstance(n.args[position], ast.Constant) and isinstance(n.args[position].value, str)}


def torch_view():
    """What the pinned torch and triton read, asked in a process of their own with CXX unset and
    the two cache variables set to markers: (inductor's compiler search, inductor's cache dir,
    triton's cache dir)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC")}
    env.update(TORCHINDUCTOR_CACHE_DIR="/marker/inductor", TRITON_CACHE_DIR="/marker/triton")
    probe = ("import json, torch._inductor.config as c, triton.knobs as k\n"
             "from torch._inductor.runtime.cache_dir_utils import cache_dir\n"
             "print(json.dumps([list(c.cpp.cxx), cache_dir(), k.cache.dir]))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    cxx, inductor, triton_dir = json.loads(out.stdout.strip().splitlines()[-1])
    return [c for c in cxx if c], inductor, triton_dir


@pytest.fixture(scope="module")
def asked():
    """{path: set of commands, any of which it runs} for every run-time compile path."""
    origin, tree = module_tree("triton.runtime.build")
    triton_cc = literal_args(calls(tree, "shutil.which"), 0)
    assert triton_cc, "%s no longer looks its C compiler up with shutil.which: read it again" % origin
    origin, tree = module_tree("flashinfer.jit.cpp_ext")
    flashinfer_cxx = {n.args[1].value for n in calls(tree, "os.environ.get")
                      if literal_args([n], 0) == {"CXX"} and len(n.args) > 1 and isinstance(n.args[1], ast.Constant)}
    assert flashinfer_cxx, "%s no longer defaults CXX: read it again" % origin
    inductor_cxx, dummy, dummy = torch_view()
    assert inductor_cxx, "torch inductor's config.cpp.cxx names no compiler"
    return {"triton's launcher build (C)": triton_cc, "torch inductor (C++)": set(inductor_cxx),
            "FlashInfer's JIT (C++)": flashinfer_cxx}


@pytest.mark.parametrize("family", OS_FAMILIES)
def test_every_compiler_the_pinned_code_runs_is_installed(asked, family):
    packages = role_vars(family)["__inference_env_jit_packages"]
    installed = set().union(*(PACKAGE_COMMANDS[family].get(p, set()) for p in packages))
    missing = {path: sorted(commands) for path, commands in asked.items() if not commands & installed}
    assert not missing, ("inference_env installs %s on %s nodes (commands %s), but the CUDA build runs, at "
                         "run time: %s" % (packages, family, sorted(installed), missing))


@pytest.mark.parametrize("family", OS_FAMILIES)
def test_the_headers_of_the_venvs_python_are_installed(family):
    for module in ("triton.runtime.build", "flashinfer.jit.cpp_ext"):
        origin, tree = module_tree(module)
        assert calls(tree, "sysconfig.get_paths") or calls(tree, "sysconfig.get_path"), (
            "%s no longer builds against sysconfig's include directory: read it again" % origin)
    python = os.path.basename(role_vars(family)["__inference_env_python"])
    want = HEADERS_PACKAGE[family].format(python)
    packages = role_vars(family)["__inference_env_jit_packages"]
    assert want in packages, "the venv's Python on %s is %s: its headers are %s, not in %s" % (
        family, python, want, packages)


def test_rendered_cache_directories_are_the_ones_torch_and_triton_read():
    dummy, inductor, triton_dir = torch_view()
    assert (inductor, triton_dir) == ("/marker/inductor", "/marker/triton"), (
        "the pinned torch/triton no longer read TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR: %s %s" % (inductor, triton_dir))
    base = role_vars("main")["__inference_env_jit_cache_dir"].rstrip("/") + "/"
    files = instance_files()
    assert files, "no rendered instance environment"
    for point, name in files:
        env = contract.parse_env_file(RENDERED[point][name])
        for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            assert env.get(key, "").startswith(base), "%s/%s: %s=%r, not under %s (inference_env makes it)" % (
                point, name, key, env.get(key), base)


def _paths(unit_text, directive):
    return [p.lstrip("-+") for line in contract.unit_directives(unit_text, directive) for p in line.split()]


def test_a_sandboxed_unit_may_write_the_cache_and_run_what_is_built_there():
    base = role_vars("main")["__inference_env_jit_cache_dir"]

    def inside(paths):
        return [p for p in paths if base == p or base.startswith(p.rstrip("/") + "/")]

    for point in sorted(RENDERED):
        assert "kvcache-vllm@.service" in RENDERED[point], "%s: render.yml rendered no vllm unit" % point
        unit = RENDERED[point]["kvcache-vllm@.service"]
        strict = [v for v in contract.unit_directives(unit, "ProtectSystem") if v.strip() == "strict"]
        if strict:
            assert inside(_paths(unit, "ReadWritePaths")), (
                "%s: ProtectSystem=strict, and no ReadWritePaths covers %s" % (point, base))
        assert not inside(_paths(unit, "NoExecPaths")), "%s: NoExecPaths covers %s" % (point, base)
        assert not contract.unit_directives(unit, "MemoryDenyWriteExecute") or all(
            v.strip() in ("no", "false") for v in contract.unit_directives(unit, "MemoryDenyWriteExecute")), (
            "%s: MemoryDenyWriteExecute breaks the JIT (triton, inductor)" % point)
