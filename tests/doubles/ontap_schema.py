"""ONTAP's own REST schemas, as the ONTAP test double uses them.

The official Python client (PyPI `netapp-ontap`, pinned in requirements-dev.txt) is
generated from ONTAP's REST API reference: one marshmallow schema per resource, with
every field's type and the lists of fields a GET may ask for and a POST or PATCH may
set. This module walks those schemas to answer, for one resource:

- is `a.b.c` a field of it (for `fields=`, query filters and bodies)?
- may a POST / PATCH set it?
- is the value of the right type, and one of ONTAP's choices where the field has them (the
  "Valid choices:" list in the client's documentation of the field, e.g. kdc.vendor)?

and, with tests/doubles/ontap_field_versions.json, whether the ONTAP release the double
claims already had the field. That file lists the fields of the resources below that
newer releases added: the first `netapp-ontap` release (9.10.1.0, 9.12.1.0, ...) whose
schema has the field. `python -m tests.doubles.ontap_schema --regenerate` rebuilds it
(it downloads the older netapp-ontap wheels with pip into build/cache).
"""
import ast
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap

from marshmallow import ValidationError
from marshmallow import fields as mf

HERE = os.path.dirname(os.path.abspath(__file__))
VERSIONS_FILE = os.path.join(HERE, "ontap_field_versions.json")

# REST collection -> (resource name, schema module, schema class)
RESOURCES = {
    "/api/cluster": ("cluster", "netapp_ontap.resources.cluster", "ClusterSchema"),
    "/api/cluster/jobs": ("job", "netapp_ontap.resources.job", "JobSchema"),
    "/api/cluster/nodes": ("node", "netapp_ontap.resources.node", "NodeSchema"),
    "/api/svm/svms": ("svm", "netapp_ontap.resources.svm", "SvmSchema"),
    "/api/storage/aggregates": ("aggregate", "netapp_ontap.resources.aggregate", "AggregateSchema"),
    "/api/storage/volumes": ("volume", "netapp_ontap.resources.volume", "VolumeSchema"),
    "/api/protocols/nfs/services": ("nfs_service", "netapp_ontap.resources.nfs_service", "NfsServiceSchema"),
    "/api/protocols/nfs/export-policies": ("export_policy", "netapp_ontap.resources.export_policy",
                                           "ExportPolicySchema"),
    "/api/protocols/nfs/export-policies/{id}/rules": ("export_rule", "netapp_ontap.resources.export_rule",
                                                      "ExportRuleSchema"),
    "/api/network/ip/interfaces": ("ip_interface", "netapp_ontap.resources.ip_interface", "IpInterfaceSchema"),
    "/api/protocols/nfs/kerberos/realms": ("kerberos_realm", "netapp_ontap.resources.kerberos_realm",
                                           "KerberosRealmSchema"),
    "/api/protocols/nfs/kerberos/interfaces": ("kerberos_interface", "netapp_ontap.resources.kerberos_interface",
                                               "KerberosInterfaceSchema"),
    "/api/name-services/unix-users": ("unix_user", "netapp_ontap.resources.unix_user", "UnixUserSchema"),
    "/api/name-services/unix-groups": ("unix_group", "netapp_ontap.resources.unix_group", "UnixGroupSchema"),
}
# How deep the generator follows nested objects (ONTAP's objects nest 4-5 levels at most
# where the roles look; references such as home_node are two).
MAX_DEPTH = 6


def version_tuple(text):
    return tuple(int(part) for part in str(text).split(".")[:3])


def schema_of(resource_path):
    name, module, cls = RESOURCES[resource_path]
    return name, getattr(importlib.import_module(module), cls)()


def _inner(field):
    """The nested schema of a field (object or list of objects), else None."""
    if isinstance(field, mf.List):
        field = field.inner
    if isinstance(field, mf.Nested):
        return field.schema
    return None


def _by_key(schema, key):
    for field in schema.fields.values():
        if (field.data_key or field.name) == key:
            return field
    return None


def _listed(schema, mode):
    return {"get": schema.gettable_fields, "post": schema.postable_fields,
            "patch": schema.patchable_fields}[mode]


def field_at(schema, dotted):
    """The marshmallow field at `a.b.c` (following nested objects), else None."""
    field = None
    for part in dotted.split("."):
        if schema is None:
            return None
        field = _by_key(schema, part)
        if field is None:
            return None
        schema = _inner(field)
    return field


def known_field(schema, dotted):
    """`fields=` and query names: `a.b`, `a.*`, `*`, `**` (ONTAP's wildcards)."""
    if dotted in ("*", "**"):
        return True
    if dotted.endswith(".*"):
        return _inner(field_at(schema, dotted[:-2]) or mf.Field()) is not None
    return field_at(schema, dotted) is not None


class BodyError(Exception):
    """A body ONTAP refuses: (status, message, code, target) as ONTAP reports it."""

    def __init__(self, message, code, target):
        super().__init__(message)
        self.message, self.code, self.target = message, code, target


def check_body(schema, body, mode, gate=None, prefix=""):
    """Refuse what ONTAP refuses in a POST/PATCH body (expanded, nested dicts).

    - a name the resource does not have, or did not have at the claimed release
      (`gate(path)` is true): 'Unexpected argument "x".', code 262179;
    - a field the operation may not set (e.g. svm.name in a PATCH): code 262186;
    - a value of the wrong type: '"v" is an invalid value for field "x"', code 262196.
    """
    if not isinstance(body, dict):
        raise BodyError('"%s" is an invalid value for field "%s"' % (body, prefix.rstrip(".")), "262196",
                        prefix.rstrip("."))
    allowed = _listed(schema, mode)
    for key, value in body.items():
        path = prefix + key
        field = _by_key(schema, key)
        if field is None or (gate and gate(path)):
            raise BodyError('Unexpected argument "%s".' % path, "262179", path)
        whole = key in allowed
        parts = sorted(entry[len(key) + 1:] for entry in allowed if entry.startswith(key + "."))
        if not whole and not parts:
            raise BodyError('Field "%s" cannot be set in this operation.' % path, "262186", path)
        nested = _inner(field)
        if nested is None:
            _check_value(field, value, path, choices_of(schema, field))
            continue
        items = value if isinstance(field, mf.List) else [value]
        if isinstance(field, mf.List) and not isinstance(value, list):
            raise BodyError('"%s" is an invalid value for field "%s"' % (value, path), "262196", path)
        for item in items:
            if whole:
                check_body(nested, item, mode, gate, path + ".")
            else:
                _check_reference(nested, item, parts, gate, path + ".")


def _check_reference(schema, item, parts, gate, prefix):
    """A reference such as svm: {name, uuid}: only the listed sub-fields."""
    if not isinstance(item, dict):
        raise BodyError('"%s" is an invalid value for field "%s"' % (item, prefix.rstrip(".")), "262196",
                        prefix.rstrip("."))
    for key, value in item.items():
        path = prefix + key
        if key not in parts or (gate and gate(path)):
            raise BodyError('Unexpected argument "%s".' % path, "262179", path)
        _check_value(field_at(schema, key), value, path, choices_of(schema, field_at(schema, key)))


def _check_value(field, value, path, choices=None):
    if choices and isinstance(value, str) and value not in choices:
        raise BodyError('"%s" is an invalid value for field "%s" (one of %s)' % (value, path, ", ".join(choices)),
                        "262196", path)
    try:
        if isinstance(field, mf.List):
            if not isinstance(value, list):
                raise ValidationError("not a list")
            for item in value:
                field.inner.deserialize(item)
        else:
            field.deserialize(value)
    except ValidationError as exc:
        raise BodyError('"%s" is an invalid value for field "%s"' % (value, path), "262196", path) from exc


# -- ONTAP's enums ------------------------------------------------------------------------
_CHOICES = {}


def choices_of(schema, field):
    """The values ONTAP accepts for a string field, from the "Valid choices:" list of the field's
    documentation in the client's source (marshmallow does not check them); None if it has none."""
    if field is None or not isinstance(field, mf.String):
        return None
    cls = type(schema)
    if cls not in _CHOICES:
        _CHOICES[cls] = _parse_choices(cls)
    return _CHOICES[cls].get(field.name)


def _parse_choices(cls):
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out = {}
    for node, doc in zip(body, body[1:]):
        text = getattr(getattr(doc, "value", None), "value", None)
        if isinstance(node, ast.Assign) and isinstance(doc, ast.Expr) and isinstance(text, str) \
                and "Valid choices:" in text:
            names = re.findall(r"^\s*\* (\S+)", text.split("Valid choices:", 1)[1], re.M)
            for target in node.targets:
                if isinstance(target, ast.Name) and names:
                    out[target.id] = names
    return out


# -- the release table -------------------------------------------------------------------
def declared_paths(schema, depth=0):
    """Every dotted path the schema's gettable/postable/patchable lists reach."""
    out = set()
    for entry in set(schema.gettable_fields) | set(schema.postable_fields) | set(schema.patchable_fields):
        head = entry.split(".", 1)[0]
        out.add(head)
        if "." in entry:
            out.add(entry)
            continue
        nested = _inner(_by_key(schema, head) or mf.Field())
        if nested is not None and depth < MAX_DEPTH:
            out.update(head + "." + sub for sub in declared_paths(nested, depth + 1))
    return out


def load_versions():
    with open(VERSIONS_FILE, encoding="utf-8") as handle:
        return json.load(handle)


def gate_for(resource, claimed, table=None):
    """gate(path) -> True when `path` of `resource` came after the claimed release."""
    table = (table or load_versions())["resources"].get(resource, {})
    claimed = tuple(claimed)

    def gate(path):
        parts = path.split(".")
        for end in range(1, len(parts) + 1):
            since = table.get(".".join(parts[:end]))
            if since and version_tuple(since) > claimed:
                return True
        return False

    return gate


def _dump_paths():  # runs inside one netapp-ontap release (subprocess)
    result = {}
    for path in RESOURCES:
        name, schema = schema_of(path)
        result[name] = sorted(declared_paths(schema))
    json.dump(result, sys.stdout)


def regenerate(releases=("9.10.1.0", "9.12.1.0", "9.13.1.0", "9.14.1.0", "9.15.1.1", "9.16.1.0", "9.17.1.0",
                         "9.18.1.0", "9.19.1.0")):
    root = os.path.dirname(os.path.dirname(HERE))
    cache = os.path.join(root, "build", "cache", "netapp-ontap")
    seen = {}
    for release in releases:
        target = os.path.join(cache, release)
        if not os.path.isdir(os.path.join(target, "netapp_ontap")):
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", target,
                            "netapp-ontap==" + release], check=True)
        out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                              "from tests.doubles.ontap_schema import _dump_paths; _dump_paths()", target],
                             check=True, capture_output=True, text=True, cwd=root,
                             env=dict(os.environ, PYTHONPATH=target + os.pathsep + root))
        seen[release] = {name: set(paths) for name, paths in json.loads(out.stdout).items()}
    oldest, newest = releases[0], releases[-1]
    table = {}
    for name, paths in seen[newest].items():
        entries = {}
        for path in sorted(paths):
            first = next(r for r in releases if path in seen[r].get(name, set()))
            if first == oldest:
                continue
            parent = path.rsplit(".", 1)[0] if "." in path else None
            # Only the outermost new name: everything under it is as new.
            if parent and any(parent == p or parent.startswith(p + ".") for p in entries):
                continue
            entries[path] = ".".join(first.split(".")[:3])
        table[name] = entries
    data = {"comment": "Fields added after %s, with the first netapp-ontap release that has them "
                       "(tests/doubles/ontap_schema.py --regenerate)." % ".".join(oldest.split(".")[:3]),
            "oldest": ".".join(oldest.split(".")[:3]), "resources": table}
    with open(VERSIONS_FILE, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")


if __name__ == "__main__":  # pragma: no cover
    if "--regenerate" in sys.argv:
        regenerate()
