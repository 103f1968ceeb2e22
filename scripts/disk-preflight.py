#!/usr/bin/env python
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""make test's first step: refuse to start when the disk cannot hold what the run writes.

A cold `make test` (a clean clone, as CI runs it) writes about 25 GB under build/: the GPU
contract's venv with the CUDA builds of vLLM and LMCache (8 GB) and the uv cache it is installed
from (about 16 GB), the tool venv, molecule's and the lab's containers. On a fuller disk the run
does not stop with "No space left on device" where it runs out: it fails 15 minutes in, in a
test whose storage server stops taking writes (SeaweedFS keeps its volumes read-only below its
minimum free space). This check says so before anything runs.

Needed: KVCACHE_TEST_MIN_FREE_GB (default 32) when build/ holds no GPU contract venv yet,
8 GB when it does (a warm run writes logs, containers and reports only).
"""
import glob
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLD_GB = float(os.environ.get("KVCACHE_TEST_MIN_FREE_GB", "32"))
WARM_GB = 8.0


def main():
    build = os.environ.get("KVCACHE_BUILD_DIR") or os.path.join(ROOT, "build")
    probe = build if os.path.isdir(build) else ROOT
    free = shutil.disk_usage(probe).free / 1e9
    warm = bool(glob.glob(os.path.join(build, "gpu-contract", "pins-*", "venv", "bin", "python")))
    need = min(WARM_GB, COLD_GB) if warm else COLD_GB
    if free < need:
        sys.stderr.write(
            "make test: %.1f GB free on the disk holding %s, %s needs %.0f GB (%s). Free space first "
            "(e.g. another clone's build/, `docker system prune`), or set KVCACHE_TEST_MIN_FREE_GB "
            "if you know the run fits.\n"
            % (free, build, "this warm run" if warm else "a cold run",
               need, "logs, containers, reports" if warm else
               "the GPU contract's CUDA venv and its uv cache, tool venv, containers"))
        return 1
    print("==> disk: %.1f GB free under %s (%s run needs %.0f GB)" % (free, build, "warm" if warm else "cold", need))
    return 0


if __name__ == "__main__":
    sys.exit(main())
