"""Run a module's main() in-process and capture its exit_json/fail_json result."""
from __future__ import annotations

import json

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


class AnsibleExitJson(Exception):
    """exit_json was called."""


class AnsibleFailJson(Exception):
    """fail_json was called."""


def _exit_json(self, **kwargs):  # pylint: disable=unused-argument
    kwargs.setdefault("changed", False)
    raise AnsibleExitJson(kwargs)


def _fail_json(self, msg, **kwargs):  # pylint: disable=unused-argument
    kwargs["failed"] = True
    kwargs["msg"] = msg
    raise AnsibleFailJson(kwargs)


@pytest.fixture
def run_module(monkeypatch):
    """run_module(module, args, check_mode=False) -> (result dict, failed bool)."""
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail_json)

    def _run(module, args, check_mode=False):
        args = dict(args)
        if check_mode:
            args["_ansible_check_mode"] = True
        with patch_module_args(args):
            try:
                module.main()
            except AnsibleExitJson as exc:
                result = exc.args[0]
                json.dumps(result)  # what Ansible would have to serialise
                return result, False
            except AnsibleFailJson as exc:
                result = exc.args[0]
                json.dumps(result)
                return result, True
        raise AssertionError("module returned without exit_json/fail_json")

    return _run
