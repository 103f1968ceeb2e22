# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The AWX custom credential types (extensions/awx/credential_types/*.yml) against AWX's rules.

What AWX checks when a credential type is created (awx/main/fields.py CredentialInputField /
CredentialTypeInjectorField, docs "Custom Credential Types"), repeated here so a bad definition
fails in `make check`, not in a customer's controller:
- inputs.fields: unique ids, a label, type string or boolean, only known keys; required lists
  existing ids; secret inputs cannot have choices;
- injectors: only env, extra_vars and file; file keys `template` or `template.<name>`; every
  template renders in a sandbox with the inputs (and tower.filename.<name> for the files) and
  names nothing else.
And what this collection needs: every injected extra variable is a public variable some role
reads (in its meta/argument_specs.yml), its rendered value passes that role's argument spec, and
every input whose name says password/secret/key is secret.
"""

from __future__ import absolute_import, division, print_function

import glob
import os
import re

import pytest
import yaml
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

__metaclass__ = type

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TYPES = sorted(glob.glob(os.path.join(ROOT, "extensions", "awx", "credential_types", "*.yml")))
FIELD_KEYS = {"id", "label", "type", "secret", "multiline", "help_text", "default", "choices", "format", "ask_at_runtime"}
SECRET_WORDS = re.compile(r"password|secret|api_key|token")


def _load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _role_specs():
    """{variable: (role, spec)} over every role's entry points."""
    out = {}
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "meta", "argument_specs.yml")):
        role = path.split(os.sep)[-3]
        for entry in (_load(path).get("argument_specs") or {}).values():
            for name, spec in (entry.get("options") or {}).items():
                out.setdefault(name, (role, spec))
    return out


def _sample(field):
    if field["type"] == "boolean":
        return False
    if field["id"] == "ca_bundle":
        return "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    return "sample-%s-0123456789abcdefghijklmnopqrstuvwxyz" % field["id"]


def _render(injectors, fields, with_files=True):
    env = ImmutableSandboxedEnvironment()
    values = dict((f["id"], _sample(f)) for f in fields)
    files = [k.split(".", 1)[1] if "." in k else "" for k in (injectors.get("file") or {})]
    names = dict((n, "/runner/env/tmp%s" % n) for n in files if n)
    values["tower"] = {"filename": names if with_files else {}}
    rendered = {}
    for section in ("env", "extra_vars"):
        for key, template in (injectors.get(section) or {}).items():
            rendered[(section, key)] = env.from_string(template).render(**values)
    return rendered, values


def test_there_is_a_type_for_each_secret_the_roles_take():
    names = sorted(_load(p)["name"] for p in TYPES)
    assert names == ["kvcache.offload ONTAP cluster", "kvcache.offload S3 keys",
                     "kvcache.offload StorageGRID tenant", "kvcache.offload inference API key"]


@pytest.mark.parametrize("path", TYPES, ids=[os.path.basename(p) for p in TYPES])
def test_inputs_follow_awx_rules(path):
    ctype = _load(path)
    assert set(ctype) == {"name", "description", "kind", "inputs", "injectors"}
    assert ctype["kind"] in ("cloud", "net")
    fields = ctype["inputs"]["fields"]
    ids = [f["id"] for f in fields]
    assert len(ids) == len(set(ids)), ids
    for field in fields:
        assert set(field) <= FIELD_KEYS, field
        assert re.match(r"^[a-z][a-z0-9_]*$", field["id"]) and field["label"]
        assert field.get("type", "string") in ("string", "boolean"), field
        if field.get("secret"):
            assert "choices" not in field, field
        if SECRET_WORDS.search(field["id"]):
            assert field.get("secret") is True, "%s: %s must be secret" % (path, field["id"])
    assert set(ctype["inputs"].get("required", [])) <= set(ids)


@pytest.mark.parametrize("path", TYPES, ids=[os.path.basename(p) for p in TYPES])
def test_injectors_name_only_inputs_and_render(path):
    ctype = _load(path)
    injectors, fields = ctype["injectors"], ctype["inputs"]["fields"]
    assert set(injectors) <= {"env", "extra_vars", "file"}
    for key in injectors.get("file") or {}:
        assert key == "template" or re.match(r"^template\.[a-z_]+$", key), key
    env = ImmutableSandboxedEnvironment()
    allowed = set(f["id"] for f in fields) | {"tower"}
    for section in injectors.values():
        for template in section.values():
            used = meta.find_undeclared_variables(env.parse(template))
            assert used <= allowed, "%s: %s names %s" % (path, template, sorted(used - allowed))
    rendered, values = _render(injectors, fields)
    for (section, key), value in rendered.items():
        assert "{{" not in value and value != "", (section, key, value)
    # A secret input reaches the job only as an extra variable or a file, never the environment.
    for key, template in (injectors.get("env") or {}).items():
        for field in fields:
            if field.get("secret"):
                assert field["id"] not in meta.find_undeclared_variables(env.parse(template)), key
    assert values  # sampled


@pytest.mark.parametrize("path", TYPES, ids=[os.path.basename(p) for p in TYPES])
def test_injected_variables_are_read_by_a_role_and_pass_its_spec(path):
    ctype = _load(path)
    specs = _role_specs()
    rendered, _values = _render(ctype["injectors"], ctype["inputs"]["fields"])
    for (section, key), value in rendered.items():
        if section != "extra_vars":
            continue
        assert key in specs, "%s injects %s, which no role's argument_specs declares" % (path, key)
        role, spec = specs[key]
        spec = dict(spec)
        spec.pop("description", None)
        result = ArgumentSpecValidator({key: spec}).validate({key: value})
        assert not result.error_messages, "%s: %s=%r fails roles/%s's spec: %s" % (path, key, value, role, result.error_messages)
    # Empty CA bundle input: the variable is empty (the role's default: the system store).
    ctype_inputs = ctype["inputs"]["fields"]
    if any(f["id"] == "ca_bundle" for f in ctype_inputs):
        env = ImmutableSandboxedEnvironment()
        template = [t for k, t in ctype["injectors"]["extra_vars"].items() if k.endswith("_ca_bundle")][0]
        assert env.from_string(template).render(ca_bundle="", tower={"filename": {"ca_bundle": "/x"}}) == ""
        assert env.from_string(template).render(ca_bundle="PEM", tower={"filename": {"ca_bundle": "/x"}}) == "/x"


def test_the_playbook_loads_every_definition():
    with open(os.path.join(ROOT, "playbooks", "awx_credential_types.yml"), encoding="utf-8") as handle:
        play = yaml.safe_load(handle)[0]
    task = play["tasks"][0]
    assert "awx.awx.credential_type" in task
    assert set(task["awx.awx.credential_type"]) == {"name", "description", "kind", "inputs", "injectors", "state"}
    assert "extensions/awx/credential_types" in play["vars"]["awx_credential_types_dir"]
