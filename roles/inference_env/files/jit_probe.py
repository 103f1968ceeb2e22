"""What the engines compile at run time, in small, on this node (inference_env's check).

vLLM's CPU build compiles a sampler kernel with torch inductor (C++, `g++`) the first time a
request asks for logprobs; on GPU nodes triton builds its CUDA launcher (C: `CC`, else `gcc`,
else `clang`) and FlashInfer its JIT ops. Each includes the headers of the Python that runs
it and loads the result from its cache directory. This builds a C and a C++ shared object
the same way (the compilers found as triton and inductor find them, the include directory of
sysconfig's scheme as triton takes it) in a directory under CACHE_DIR and loads both from
there: a missing compiler, missing Python headers and a noexec mount fail here, naming the
step, instead of killing an engine on a client's request.

Usage: python jit_probe.py CACHE_DIR   (the interpreter the engine venv is made from)
Prints one JSON object; exit status 1 when a step failed (its "problems").
"""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

SOURCE = """#include <Python.h>
#ifdef __cplusplus
extern "C"
#endif
int kvcache_jit_probe(void) { return PY_MAJOR_VERSION * 100 + PY_MINOR_VERSION; }
"""


def include_dir():
    """The Python include directory triton's build uses (Debian's posix_local -> posix_prefix)."""
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def compilers():
    """{language: command} as triton (C) and torch inductor (C++) look them up."""
    return {
        "c": os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang"),
        "c++": os.environ.get("CXX") or shutil.which("g++"),
    }


def build_and_load(compiler, language, include, work):
    """Build SOURCE as a shared object with `compiler` in `work` and call it; a problem or None."""
    ext = "c" if language == "c" else "cpp"
    src = os.path.join(work, "probe_%s.%s" % (ext, ext))
    lib = os.path.join(work, "probe_%s.so" % ext)
    with open(src, "w", encoding="utf-8") as handle:
        handle.write(SOURCE)
    argv = [compiler, src, "-O2", "-shared", "-fPIC", "-I" + include, "-o", lib]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "%s compiler %s did not run: %s" % (language, compiler, exc)
    if proc.returncode != 0:
        return "%s compiler %s failed to build against %s: %s" % (
            language, compiler, include, " ".join(proc.stderr.split())[-400:])
    try:
        found = ctypes.CDLL(lib).kvcache_jit_probe()
    except OSError as exc:
        return "the %s object built in %s does not load: %s (a noexec mount?)" % (language, work, exc)
    want = sys.version_info[0] * 100 + sys.version_info[1]
    if found != want:
        return "the %s object reports Python headers %d, not this interpreter's %d" % (language, found, want)
    return None


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    cache = argv[1]
    include = include_dir()
    found = compilers()
    result = {"include": include, "compilers": found, "cache_dir": cache, "problems": []}
    problems = result["problems"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        problems.append("no Python.h in %s: the headers of %s are not installed" % (include, sys.executable))
    for language, name in (("c", "gcc or clang"), ("c++", "g++")):
        if not found[language]:
            problems.append("no %s compiler (%s) on PATH" % (language, name))
    if not problems:
        work = tempfile.mkdtemp(prefix=".jit-probe-", dir=cache)
        try:
            for language in ("c", "c++"):
                problem = build_and_load(found[language], language, include, work)
                if problem:
                    problems.append(problem)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, sort_keys=True))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
