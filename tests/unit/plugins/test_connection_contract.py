"""One connection contract for the modules (issue #16, item 4).

Every option that several modules share (module_utils/shared_args.py) is defined once:
no module under plugins/modules may write one out itself, under its name or an old
alias; the doc fragments document exactly the shared specs; every module of an action
group in meta/runtime.yml accepts every option of the group (else module_defaults for
the group would fail on that module with "Unsupported parameters"); old spellings still
work, with a deprecation.
"""
from __future__ import annotations

import ast
import glob
import importlib
import os

import pytest
import yaml

from ansible.module_utils import basic
from ansible.module_utils.common import arg_spec
from ansible.module_utils.testing import patch_module_args

from ansible_collections.kvcache.offload.plugins.doc_fragments import http_client as http_fragment
from ansible_collections.kvcache.offload.plugins.doc_fragments import s3_client as s3_fragment
from ansible_collections.kvcache.offload.plugins.module_utils import shared_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODULE_FILES = sorted(p for p in glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py"))
                      if not os.path.basename(p).startswith("_"))
MODULES = [os.path.splitext(os.path.basename(p))[0] for p in MODULE_FILES]
SHARED_NAMES = shared_args.shared_option_names()
# What a module may set differently from the shared definition (documented in its DOCUMENTATION).
MAY_DIFFER = ("default", "required")

with open(os.path.join(ROOT, "meta", "runtime.yml"), encoding="utf-8") as _handle:
    ACTION_GROUPS = yaml.safe_load(_handle).get("action_groups", {})
# Each action group and the shared set (and doc fragment) its modules all accept.
GROUP_SPECS = {"s3": shared_args.s3_argument_spec, "http": shared_args.http_argument_spec}
FRAGMENTS = {
    "kvcache.offload.s3_client": (s3_fragment.ModuleDocFragment.DOCUMENTATION, shared_args.s3_argument_spec),
    "kvcache.offload.s3_client.addressing_style": (s3_fragment.ModuleDocFragment.ADDRESSING_STYLE,
                                                   shared_args.addressing_style_spec),
    "kvcache.offload.http_client": (http_fragment.ModuleDocFragment.DOCUMENTATION, shared_args.http_argument_spec),
}


class _Captured(Exception):
    """AnsibleModule was constructed; carries its keyword arguments."""


def module_kwargs(name):
    """The keyword arguments a module's main() gives AnsibleModule (argument_spec, required_if, ...)."""
    module = importlib.import_module("ansible_collections.kvcache.offload.plugins.modules." + name)

    def capture(self, *args, **kwargs):  # pylint: disable=unused-argument
        raise _Captured(kwargs)

    original = basic.AnsibleModule.__init__
    basic.AnsibleModule.__init__ = capture
    try:
        with patch_module_args({}):
            module.main()
    except _Captured as exc:
        return exc.args[0]
    finally:
        basic.AnsibleModule.__init__ = original
    raise AssertionError("%s: main() never constructed AnsibleModule" % name)


def module_spec(name):
    return module_kwargs(name)["argument_spec"]


def shared_definitions(name):
    """The shared definitions of an option name (ca_path: the HTTP one and the S3 one with its old alias)."""
    return [spec[name] for spec in shared_args.shared_specs().values() if name in spec]


def _comparable(option):
    return {key: value for key, value in option.items() if key not in MAY_DIFFER}


def local_definitions(path):
    """Shared option names (or aliases) a module file defines itself: `name=dict(type=...)`,
    `"name": {"type": ...}` or `spec["name"] = ...`, anywhere in the file."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)

    def is_option(node):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
            return any(kw.arg == "type" for kw in node.keywords)
        if isinstance(node, ast.Dict):
            return any(isinstance(k, ast.Constant) and k.value == "type" for k in node.keys)
        return False

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
            found += [(kw.arg, node.lineno) for kw in node.keywords if kw.arg in SHARED_NAMES and is_option(kw.value)]
        elif isinstance(node, ast.Dict):
            found += [(k.value, node.lineno) for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and k.value in SHARED_NAMES and is_option(v)]
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                key = getattr(target, "slice", None)
                if isinstance(target, ast.Subscript) and isinstance(key, ast.Constant) and key.value in SHARED_NAMES:
                    found.append((key.value, node.lineno))
    return found


def test_every_module_is_walked():
    assert {"chat_probe", "metrics_snapshot", "s3_lifecycle", "s3_vhost_probe", "tier_inventory",
            "lmcache_storage_probe", "gpu_facts"} <= set(MODULES)
    assert {"endpoint_url", "endpoint", "ca_path", "ca_bundle", "timeout", "api_key", "addressing_style"} <= SHARED_NAMES


@pytest.mark.parametrize("path", MODULE_FILES, ids=MODULES)
def test_no_module_defines_a_shared_option_itself(path):
    found = local_definitions(path)
    assert not found, ("%s defines shared options itself (name, line): %s. Take them from "
                       "module_utils/shared_args.py instead." % (os.path.basename(path), found))


@pytest.mark.parametrize("name", MODULES)
def test_shared_options_in_a_spec_are_the_shared_definitions(name):
    for option, entry in module_spec(name).items():
        for spelled in [option] + list(entry.get("aliases", ())):
            if spelled in SHARED_NAMES:
                shared = [_comparable(definition) for definition in shared_definitions(option)]
                assert shared, "%s: option %r is spelled %r, a shared option's name or old alias" % (name, option, spelled)
                assert _comparable(entry) in shared, "%s: option %r differs from shared_args" % (name, option)


@pytest.mark.parametrize("group", sorted(GROUP_SPECS))
def test_action_groups_hold_exactly_the_modules_that_accept_the_groups_options(group):
    wanted = set(GROUP_SPECS[group]())
    accepting = sorted(name for name in MODULES if wanted <= set(module_spec(name)))
    assert sorted(ACTION_GROUPS.get(group, [])) == accepting


def test_no_other_action_groups():
    assert sorted(ACTION_GROUPS) == sorted(GROUP_SPECS)


@pytest.mark.parametrize("fragment", sorted(FRAGMENTS))
def test_doc_fragment_documents_exactly_the_shared_spec(fragment):
    text, make_spec = FRAGMENTS[fragment]
    documented = yaml.safe_load(text)["options"]
    spec = make_spec()
    assert sorted(documented) == sorted(spec)
    for name, option in spec.items():
        doc = documented[name]
        assert doc["type"] == option["type"], name
        assert doc.get("default") == option.get("default"), name
        assert doc.get("choices") == option.get("choices"), name
        assert doc.get("aliases", []) == option.get("aliases", []), name
        assert not doc.get("required") and not option.get("required"), name
        for old in option.get("deprecated_aliases", ()):
            assert "O(%s) is deprecated and will be removed in version %s" % (old["name"], old["version"]) in \
                " ".join(doc["description"]), name


@pytest.mark.parametrize("name", MODULES)
def test_modules_with_a_shared_set_extend_its_fragment(name):
    module = importlib.import_module("ansible_collections.kvcache.offload.plugins.modules." + name)
    extends = yaml.safe_load(module.DOCUMENTATION).get("extends_documentation_fragment", [])
    spec = module_spec(name)
    for fragment, (_text, make_spec) in FRAGMENTS.items():
        uses = set(make_spec()) <= set(spec)
        assert (fragment in extends) == uses, "%s: fragment %s" % (name, fragment)


def _dummy(option):
    if option.get("choices"):
        return option["choices"][0]
    return {"str": "x", "path": "/x", "int": 1, "float": 1.0, "bool": True, "dict": {}, "list": []}[option.get("type", "str")]


def _aliased_modules():
    out = []
    for name in MODULES:
        for option, entry in sorted(module_spec(name).items()):
            out += [(name, option, old["name"]) for old in entry.get("deprecated_aliases", ())]
    return out


ALIASED = _aliased_modules()


def test_the_old_spellings_are_aliases():
    assert {(m, o, a) for m, o, a in ALIASED if m == "s3_vhost_probe"} == {
        ("s3_vhost_probe", "endpoint_url", "endpoint"), ("s3_vhost_probe", "ca_path", "ca_bundle")}
    assert {m for m, _o, _a in ALIASED} == set(ACTION_GROUPS["s3"])


@pytest.mark.parametrize("name, option, old", ALIASED, ids=["%s-%s" % (m, a) for m, _o, a in ALIASED])
def test_old_spelling_still_works_with_a_deprecation(monkeypatch, name, option, old):
    deprecations = []

    def record(msg, version=None, date=None, collection_name=None, deprecator=None, **_kwargs):
        # ansible-core 2.19 passes a deprecator, older ones collection_name.
        collection = collection_name or getattr(deprecator, "resolved_name", None)
        deprecations.append({"msg": msg, "version": version, "date": date, "collection_name": collection})

    # Where AnsibleModule's argument validation reports deprecated aliases (on the target and
    # in these tests alike, whatever else the test run has imported).
    monkeypatch.setattr(arg_spec, "deprecate", record)
    spec = module_spec(name)
    args = {key: _dummy(entry) for key, entry in spec.items() if entry.get("required")}
    args.pop(option, None)
    args[old] = "/etc/ssl/old-spelling.pem" if spec[option]["type"] == "path" else "https://old.example:8443"
    with patch_module_args(args):
        module = basic.AnsibleModule(argument_spec=spec)
    assert module.params[option] == args[old]
    assert len(deprecations) == 1, deprecations
    assert "Alias '%s' is deprecated" % old in deprecations[0].pop("msg")
    assert deprecations[0] == {"version": shared_args.DEPRECATED_ALIAS_VERSION, "date": None,
                               "collection_name": "kvcache.offload"}


def test_deprecation_version_is_a_later_release_than_this_one():
    with open(os.path.join(ROOT, "galaxy.yml"), encoding="utf-8") as handle:
        version = yaml.safe_load(handle)["version"]

    def key(text):
        return tuple(int(part) for part in text.split("."))

    assert key(shared_args.DEPRECATED_ALIAS_VERSION) > key(version)


def test_timeouts_are_float_seconds_everywhere():
    for name in MODULES:
        spec = module_spec(name)
        if "timeout" in spec:
            assert spec["timeout"]["type"] == "float" and spec["timeout"]["default"] > 0, name


def test_one_tls_setup():
    """Only module_utils/http_client.py builds an SSL context; everything else calls it."""
    offenders = []
    for path in glob.glob(os.path.join(ROOT, "plugins", "**", "*.py"), recursive=True):
        if path.endswith(os.path.join("module_utils", "http_client.py")):
            continue
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        if "create_default_context" in text or "SSLContext(" in text:
            offenders.append(os.path.relpath(path, ROOT))
    assert not offenders
