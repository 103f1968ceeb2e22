# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_runs: count every module run on a managed host, for `make bench` (not shipped).

A task is not a module run: `template` of an unchanged file is two runs (stat, then the
checksum compare ends it; a changed file adds copy), `set_fact`/`assert`/`debug` run no module
at all, and a `package` action resolves to apt or dnf. What a rerun costs a host is the number
of times AnsiballZ starts Python there, so this callback counts calls of the action plugins'
`_execute_module` (every module execution of every action goes through it), in the worker
processes where they happen (under Mitogen's strategy: its ActionModuleMixin's, which replaces ActionBase's):
each call appends one JSON line {host, target, play, task, module} to
the file named by KVCACHE_MODULE_RUNS_LOG (O_APPEND: lines from parallel forks do not mix).
`host` is the task's inventory host, `target` where the module ran (the delegated host for
delegate_to).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: module_runs
type: aggregate
short_description: Count module runs per host into a JSON-lines file (benchmarks only)
description:
  - Appends one line per module execution to the file named by C(KVCACHE_MODULE_RUNS_LOG).
  - Does nothing when the variable is unset.
requirements:
  - enable in callbacks_enabled
"""

import json
import os
import sys

from ansible.plugins.action import ActionBase
from ansible.plugins.callback import CallbackBase

_ENV = "KVCACHE_MODULE_RUNS_LOG"
# The running play's name: set in the controller at play start, inherited by the workers it forks.
_PLAY_ENV = "KVCACHE_MODULE_RUNS_PLAY"


def _target(action, task_vars):
    """Where the module runs: the delegated host, else the task's host."""
    delegated = getattr(action._task, "delegate_to", None)
    if delegated:
        return str(delegated)
    return (task_vars or {}).get("inventory_hostname") or getattr(action._play_context, "remote_addr", None)


def _wrap(original):
    def _execute_module(self, module_name=None, module_args=None, tmp=None, task_vars=None, *args, **kwargs):
        path = os.environ.get(_ENV)
        if path:
            line = json.dumps({
                "host": (task_vars or {}).get("inventory_hostname"),
                "target": _target(self, task_vars),
                "play": os.environ.get(_PLAY_ENV),
                "task": self._task.get_name() if self._task is not None else None,
                "module": module_name or (self._task.action if self._task is not None else None),
            }, sort_keys=True) + "\n"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, line.encode("utf-8"))
            finally:
                os.close(fd)
        return original(self, module_name, module_args, tmp, task_vars, *args, **kwargs)
    _execute_module.kvcache_counted = True
    return _execute_module


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "module_runs"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super(CallbackModule, self).__init__(*args, **kwargs)
        # Patched in the controller before the workers fork, so every fork inherits it.
        _patch(ActionBase)
        _patch_mitogen()

    def v2_playbook_on_play_start(self, play):
        os.environ[_PLAY_ENV] = play.get_name().strip()

    def v2_playbook_on_task_start(self, task, is_conditional):
        # Mitogen's strategy (loaded after the callbacks) puts its own _execute_module in front
        # of ActionBase's (ansible_mitogen.mixins.ActionModuleMixin): count that one too. The
        # strategy calls this in the controller before it starts the task's workers.
        _patch_mitogen()


def _patch(cls):
    if "_execute_module" in vars(cls) and not getattr(cls._execute_module, "kvcache_counted", False):
        cls._execute_module = _wrap(cls._execute_module)


def _patch_mitogen():
    mixins = sys.modules.get("ansible_mitogen.mixins")
    if mixins is not None:
        _patch(mixins.ActionModuleMixin)
