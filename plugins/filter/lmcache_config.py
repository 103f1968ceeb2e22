# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""lmcache_config_problems: LMCache configuration keys checked against LMCache's own types."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: lmcache_config_problems
short_description: Check keys for lmcache-config.yaml against the types the pinned LMCache defines
version_added: 0.1.0
description:
  - Checks a mapping of top-level LMCache configuration keys (normally C(lmcache_extra_config)) against
    C(_CONFIG_DEFINITIONS) of the pinned LMCache (lmcache/v1/config.py), copied into the collection by
    C(scripts/gen-lmcache-config-table.py) from the package itself (C(plugins/module_utils/lmcache_config_table.py)).
  - Returns C(errors) (a value of the wrong type - a string where LMCache wants a boolean, a number or a list; a
    string boolean inside C(extra_config)) and C(warnings) (a key LMCache does not define, which it ignores; a
    deprecated alias). Each entry names the key as C(<name>.<key>).
  - C(lmcache_env_problems) checks the C(LMCACHE_<KEY>) entries of an environment mapping (C(vllm_extra_env), an
    instance's C(env)) the same way, as LMCache converts environment strings; it returns a list of errors.
  - LMCache converts a file's values with its own converters; a string where it wants a boolean is true only when it
    is C(true) or C(1) (C(yes) and C(on) are false), and a value its converter cannot read becomes C(None) with a
    log line only. So a wrong type is refused here, on the controller, before any host changes.
positional: name
options:
  _input:
    description: The keys to check.
    type: dict
    required: true
  name:
    description: Name of the variable the keys come from, used in the messages.
    type: str
    default: lmcache_extra_config
"""

EXAMPLES = r"""
- name: Check lmcache_extra_config
  ansible.builtin.set_fact:
    found: "{{ lmcache_extra_config | kvcache.offload.lmcache_config_problems('lmcache_extra_config') }}"
# {"errors": ["lmcache_extra_config.save_unfull_chunk is the string 'false' (str), LMCache 0.5.6 wants a YAML
#   boolean ..."], "warnings": [], "lmcache_version": "0.5.6"}
"""

RETURN = r"""
_value:
  description: C(errors) and C(warnings) (lists of messages), and C(lmcache_version), the LMCache the table comes from.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.collections import is_sequence
from ansible.module_utils.six import string_types

from ansible_collections.kvcache.offload.plugins.module_utils.lmcache_config_table import (
    ALIASES,
    DEFINITIONS,
    LMCACHE_VERSION,
)

_STRING_BOOLEANS = ("true", "false", "yes", "no", "on", "off")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _matches(kind, value):
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return _is_int(value)
    if kind == "float":
        return _is_number(value)
    if kind == "str":
        return isinstance(value, string_types)
    if kind == "dict":
        return isinstance(value, dict)
    if kind.startswith("list["):
        if not is_sequence(value):
            return False
        return all(_matches(kind[5:-1], item) for item in value)
    raise AnsibleFilterError("lmcache_config_problems: unknown type %r in the table" % kind)


def _type_name(value):
    """The YAML-level type of VALUE (Ansible wraps strings and numbers in tagged subclasses)."""
    for kind, name in ((bool, "boolean"), (int, "int"), (float, "float"), (string_types, "string"),
                       (dict, "mapping")):
        if isinstance(value, kind):
            return name
    if value is None:
        return "null"
    if is_sequence(value):
        return "list"
    return type(value).__name__


def _plain(value):
    """VALUE without Ansible's tagged subclasses, for a readable repr."""
    for kind in (bool, int, float):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, string_types):
        return str(value)
    if isinstance(value, dict):
        return dict((_plain(k), _plain(v)) for k, v in value.items())
    if is_sequence(value):
        return [_plain(v) for v in value]
    return value


def _example(kind):
    return {
        "bool": "true or false, unquoted",
        "int": "a whole number, unquoted",
        "float": "a number, unquoted",
        "str": "a string",
        "dict": "a mapping",
        "list[int]": "a list of whole numbers",
        "list[float]": "a list of numbers",
        "list[str]": "a list of strings",
    }.get(kind, kind)


def lmcache_config_problems(config, name="lmcache_extra_config"):
    """Return {errors, warnings, lmcache_version} for a mapping of LMCache configuration keys."""
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise AnsibleFilterError("%s must be a mapping of LMCache configuration keys, not %s" % (name, type(config).__name__))
    errors = []
    warnings = []
    for key in sorted(config, key=str):
        value = config[key]
        label = "%s.%s" % (name, key)
        current = ALIASES.get(key, key)
        if current != key:
            warnings.append("%s: LMCache %s reads this deprecated name as %s; write %s." % (label, LMCACHE_VERSION, current, current))
        if current not in DEFINITIONS:
            warnings.append("%s: LMCache %s does not define this key and ignores it (a typo?)." % (label, LMCACHE_VERSION))
            continue
        kind, optional = DEFINITIONS[current]
        if value is None and optional:
            continue
        if not _matches(kind, value):
            hint = ""
            if kind == "bool" and isinstance(value, string_types):
                hint = " (LMCache reads a string as true only when it is 'true' or '1': %r would be %s)" % (
                    str(value), str(value).strip().lower() in ("true", "1"))
            errors.append("%s is %r (%s), LMCache %s wants %s%s%s." % (
                label, _plain(value), _type_name(value), LMCACHE_VERSION, _example(kind),
                " or null" if optional else "", hint))
            continue
        if current == "extra_config":
            for sub in sorted(value, key=str):
                item = value[sub]
                if isinstance(item, string_types) and item.strip().lower() in _STRING_BOOLEANS:
                    errors.append("%s.%s is the string %r: write a YAML boolean (true or false, unquoted)." % (label, sub, str(item)))
    return {"errors": errors, "warnings": warnings, "lmcache_version": LMCACHE_VERSION}


def lmcache_env_problems(env, name="vllm_extra_env"):
    """Errors for LMCACHE_<KEY> entries of an environment mapping whose value LMCache's converter misreads.

    LMCache reads LMCACHE_<KEY> for every key of its configuration (an environment value is a string:
    booleans are true only for 'true'/'1', numbers that do not parse become None). Other LMCACHE_*
    variables (LMCACHE_CONFIG_FILE, LMCACHE_TRACK_USAGE, ...) are not configuration keys and pass.
    """
    errors = []
    for key in sorted(env or {}, key=str):
        if not str(key).startswith("LMCACHE_"):
            continue
        conf = str(key)[len("LMCACHE_"):].lower()
        conf = ALIASES.get(conf, conf)
        if conf not in DEFINITIONS:
            continue
        kind = DEFINITIONS[conf][0]
        value = env[key]
        text = str(value).strip()
        if isinstance(value, bool):
            good = kind == "bool"
        elif kind == "bool":
            good = text.lower() in ("true", "1", "false", "0")
        elif kind in ("int", "float", "list[int]", "list[float]"):
            convert = int if kind in ("int", "list[int]") else float
            parts = [p.strip() for p in text.split(",") if p.strip()] if kind.startswith("list[") else [text]
            good = True
            for part in parts:
                try:
                    convert(part)
                except ValueError:
                    good = False
        else:
            good = True
        if not good:
            errors.append("%s.%s is %r: LMCache %s reads it as %s (key %s) and would %s." % (
                name, key, _plain(value), LMCACHE_VERSION, _example(kind), conf,
                "take it as false" if kind == "bool" else "drop it (None) with a log line only"))
    return errors


class FilterModule(object):
    """kvcache.offload LMCache configuration filters."""

    def filters(self):
        return {"lmcache_config_problems": lmcache_config_problems, "lmcache_env_problems": lmcache_env_problems}
