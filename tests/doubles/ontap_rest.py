"""Test double of ONTAP's REST API, as strict as a cluster for the calls the roles make.

Models one two-node cluster at a claimed ONTAP release: SVMs (looked up by name, each
with its root volume and the `default` export policy that volume uses), aggregates with
their home node, volumes (`nas.uid/gid/unix_permissions`, export policy, junction path,
FlexVol or FlexGroup), export policies and rules, the NFS service (v4.1, pNFS, trunking,
transfer size, NFSv4 ID domain), data LIFs with `rdma_protocols` and their home node, jobs,
and NFS Kerberos: realms (one KDC each), the Kerberos settings of every data LIF, and the
SVM's local UNIX users and groups (what a Kerberos principal maps to).

Every request is checked against ONTAP's own REST schemas (the PyPI `netapp-ontap`
client's, tests/doubles/ontap_schema.py) at the claimed release, and refused the way
ONTAP refuses it:

- an unknown field in a body or query: 400 'Unexpected argument "x".' (code 262179);
- an unknown `fields=` value: 400 'The value "x" is invalid for field "fields"' (262197);
- a field the operation may not set: 400 (262186); a value of the wrong type: 400 (262196);
- a field newer than the claimed release: as unknown;
- a feature newer than the claimed release (NFS trunking before 9.14.1): 400;
- an SVM, aggregate or export policy that does not exist: 400 naming it (2621462 for
  the SVM; the other codes are the double's own, ONTAP's message text is close to them);
- a path it does not serve: 404 "API not found" (code 3), so an unexpected call shows up;
- NFS Kerberos as ONTAP documents it: a realm needs its KDC's address and vendor (and the AD
  server for `microsoft`); a LIF's Kerberos is enabled with an SPN `nfs/<host>@<REALM>` of a
  realm the SVM has, and with the KDC administrator's user and password or a keytab URI
  (ONTAP creates or loads the SPN's keys then); a local UNIX user needs its ID and primary
  group. The password is write-only: no GET returns it.

A GET returns the record's keys plus the fields asked for (`*` leaves out the advanced
fields ONTAP only returns when named, such as protocol.v41_features.trunking_enabled).
Every request is recorded (recorder.py).

Run alone for manual experiments: python -m tests.doubles.ontap_rest [9.14.1]
"""
import copy
import fnmatch
import re
import uuid as uuidlib

from tests.doubles import ontap_schema
from tests.doubles.recorder import RecordingServer, expand, lookup, merge

CONTROL_PARAMS = {"fields", "return_records", "return_timeout", "max_records", "order_by", "ignore_unknown_fields"}
# Query parameters an endpoint has beside its fields (ONTAP's API reference).
EXTRA_PARAMS = {("PATCH", "export_rule"): {"new_index"}}
# Returned only when named in `fields` (ONTAP's "advanced properties" of the resource).
ADVANCED = {"nfs_service": {"protocol.v41_features.trunking_enabled", "transport.tcp_max_transfer_size"}}
# Features that need a newer release than the field that switches them on.
FEATURES = {("nfs_service", "protocol.v41_features.trunking_enabled"): ((9, 14, 1), "NFSv4.1 trunking")}
NEWEST = (9, 19, 1)


def _uuid(seed):
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, seed))


def _error(status, message, code, target=None):
    error = {"message": message, "code": str(code)}
    if target:
        error["target"] = target
    return status, {"error": error}, {}


class OntapError(Exception):
    def __init__(self, status, message, code, target=None):
        super().__init__(message)
        self.reply = _error(status, message, code, target)


def _ref(record):
    return {"name": record["name"], "uuid": record["uuid"]}


class OntapDouble:
    """version: the ONTAP release the double claims (9.10.1 or 9.12.1 and later)."""

    def __init__(self, tls_dir, svm="svm_kv", version=(9, 14, 1), aggregates=None, lifs=None,
                 credentials=None):
        self.version = tuple(version)
        if self.version < (9, 10, 1) or (9, 11, 0) <= self.version < (9, 12, 0):
            raise ValueError("the schema table has releases 9.10.1 and 9.12.1+ only, not %s" % (version,))
        self.credentials = credentials
        table = ontap_schema.load_versions()
        self.gates = {name: ontap_schema.gate_for(name, self.version, table)
                      for name, _m, _c in ontap_schema.RESOURCES.values()}
        self.nodes = [{"name": name, "uuid": _uuid("node/" + name)} for name in ("node1", "node2")]
        aggregates = aggregates or {"aggr1": "node1", "aggr2": "node2"}
        self.aggregates = [{"name": name, "uuid": _uuid("aggr/" + name), "state": "online",
                            "home_node": self._node(node), "node": self._node(node)}
                           for name, node in aggregates.items()]
        self.svms, self.volumes, self.policies, self.rules = [], [], [], {}
        self.nfs_services, self.jobs = [], {}
        self.lifs = []
        self.realms, self.krb_interfaces, self.unix_users, self.unix_groups = [], [], [], []
        self.add_svm(svm)
        lifs = lifs or {"kv_data1": ("node1", "10.30.0.5"), "kv_data2": ("node2", "10.30.0.6")}
        for name, (node, address) in lifs.items():
            self.add_lif(name, node, address)
        self.server = RecordingServer(self.handle, tls_dir=tls_dir)

    # -- the model ---------------------------------------------------------------------------
    @property
    def svm(self):
        """The first SVM (the one the tests configure)."""
        return _ref(self.svms[0])

    def _node(self, name):
        return _ref(next(n for n in self.nodes if n["name"] == name))

    def add_svm(self, name, root_aggregate="aggr1"):
        svm = {"name": name, "uuid": _uuid("svm/" + name), "state": "running", "subtype": "default"}
        self.svms.append(svm)
        policy = self._new_policy("default", svm)
        self.volumes.append({
            "name": name + "_root", "uuid": _uuid("vol/%s/root" % name), "svm": _ref(svm), "is_svm_root": True,
            "aggregates": [_ref(self._aggregate(root_aggregate))], "style": "flexvol", "type": "rw",
            "state": "online", "space": {"size": 1024 ** 3}, "size": 1024 ** 3,
            "nas": {"path": "/", "security_style": "unix", "uid": 0, "gid": 0, "unix_permissions": 755,
                    "export_policy": {"name": policy["name"], "id": policy["id"]}},
        })
        return svm

    def add_lif(self, name, node, address, svm=None):
        svm = svm or self.svms[0]
        self.lifs.append({
            "name": name, "uuid": _uuid("lif/" + name), "svm": _ref(svm), "scope": "svm", "enabled": True,
            "ip": {"address": address, "netmask": "24"}, "rdma_protocols": [], "state": "up",
            "location": {"home_node": self._node(node), "node": self._node(node), "is_home": True,
                         "home_port": {"name": "e4a", "node": {"name": node}}},
        })
        # Every data LIF has NFS Kerberos settings, disabled until someone enables them.
        self.krb_interfaces.append({"interface": {"name": name, "uuid": _uuid("lif/" + name),
                                                  "ip": {"address": address}},
                                    "svm": _ref(svm), "enabled": False})

    def root_volume(self, svm_name=None):
        svm_name = svm_name or self.svms[0]["name"]
        return next(v for v in self.volumes if v["svm"]["name"] == svm_name and v.get("is_svm_root"))

    def _named(self, records, name, svm_name=None):
        """The record of that name in the SVM (the first SVM by default), else None."""
        svm_name = svm_name or self.svms[0]["name"]
        return next((r for r in records if r["name"] == name and r["svm"]["name"] == svm_name), None)

    def policy(self, name, svm_name=None):
        return self._named(self.policies, name, svm_name)

    def volume(self, name, svm_name=None):
        return self._named(self.volumes, name, svm_name)

    def nfs_service(self, svm_name=None):
        svm_name = svm_name or self.svms[0]["name"]
        return next((s for s in self.nfs_services if s["svm"]["name"] == svm_name), None)

    def lif(self, name):
        return next(lif for lif in self.lifs if lif["name"] == name)

    def krb_interface(self, name):
        return next(i for i in self.krb_interfaces if i["interface"]["name"] == name)

    def realm(self, name, svm_name=None):
        return self._named(self.realms, name, svm_name)

    def unix_user(self, name, svm_name=None):
        return self._named(self.unix_users, name, svm_name)

    def unix_group(self, name, svm_name=None):
        return self._named(self.unix_groups, name, svm_name)

    def _aggregate(self, name):
        return next((a for a in self.aggregates if a["name"] == name), None)

    def _new_policy(self, name, svm):
        policy = {"name": name, "id": 12884901889 + len(self.policies), "svm": _ref(svm)}
        self.policies.append(policy)
        self.rules[policy["id"]] = []
        return policy

    def _svm_from(self, body):
        ref = body.pop("svm", None) or {}
        svm = next((s for s in self.svms if ref and (s["name"] == ref.get("name", s["name"]))
                    and s["uuid"] == ref.get("uuid", s["uuid"])), None)
        if svm is None:
            wanted = ref.get("name") or ref.get("uuid") or ""
            raise OntapError(400, 'SVM "%s" does not exist.' % wanted, 2621462, "svm.name")
        return svm

    # -- dispatcher ------------------------------------------------------------------------
    ROUTES = [
        (r"/api/cluster", "/api/cluster", None),
        (r"/api/cluster/jobs/([^/]+)", "/api/cluster/jobs", "jobs"),
        (r"/api/cluster/nodes(?:/([^/]+))?", "/api/cluster/nodes", "nodes"),
        (r"/api/svm/svms(?:/([^/]+))?", "/api/svm/svms", "svms"),
        (r"/api/storage/aggregates(?:/([^/]+))?", "/api/storage/aggregates", "aggregates"),
        (r"/api/storage/volumes(?:/([^/]+))?", "/api/storage/volumes", "volumes"),
        (r"/api/protocols/nfs/services(?:/([^/]+))?", "/api/protocols/nfs/services", "nfs_services"),
        (r"/api/protocols/nfs/export-policies/(\d+)/rules(?:/(\d+))?",
         "/api/protocols/nfs/export-policies/{id}/rules", "rules"),
        (r"/api/protocols/nfs/export-policies(?:/(\d+))?", "/api/protocols/nfs/export-policies", "policies"),
        (r"/api/network/ip/interfaces(?:/([^/]+))?", "/api/network/ip/interfaces", "lifs"),
        # Keyed by the SVM's UUID and the name (ONTAP's /realms/{svm.uuid}/{name}).
        (r"/api/protocols/nfs/kerberos/realms(?:/([^/]+)/([^/]+))?", "/api/protocols/nfs/kerberos/realms",
         "realms"),
        (r"/api/protocols/nfs/kerberos/interfaces(?:/([^/]+))?", "/api/protocols/nfs/kerberos/interfaces",
         "krb_interfaces"),
        (r"/api/name-services/unix-users(?:/([^/]+)/([^/]+))?", "/api/name-services/unix-users", "unix_users"),
        (r"/api/name-services/unix-groups(?:/([^/]+)/([^/]+))?", "/api/name-services/unix-groups",
         "unix_groups"),
    ]
    # Collections keyed by (svm.uuid, name); a POST creates in them.
    BY_SVM_AND_NAME = ("realms", "unix_users", "unix_groups")
    CREATES = ("volumes", "nfs_services", "policies", "rules") + BY_SVM_AND_NAME
    PATCHES = ("volumes", "nfs_services", "policies", "rules", "lifs", "krb_interfaces") + BY_SVM_AND_NAME

    def handle(self, req):
        if self.credentials and req.get("user") != list(self.credentials):
            return _error(401, "not authorized for that command", 6)
        path = req["path"].rstrip("/")
        for pattern, resource_path, kind in self.ROUTES:
            match = re.fullmatch(pattern, path)
            if match:
                try:
                    return self._serve(req, resource_path, kind, match.groups())
                except OntapError as exc:
                    return exc.reply
        return _error(404, "API not found", 3)

    def _serve(self, req, resource_path, kind, groups):
        method, query = req["method"], dict(req["query"])
        body = req["body"] if isinstance(req["body"], dict) else {}
        name, schema = ontap_schema.schema_of(resource_path)
        gate = self.gates[name]
        fields = self._check_query(method, name, schema, gate, query)
        if kind is None:  # /api/cluster
            gen, major, minor = self.version
            record = {"name": "double-cluster", "uuid": _uuid("cluster"),
                      "version": {"full": "NetApp Release %d.%d.%d: test double" % self.version,
                                  "generation": gen, "major": major, "minor": minor}}
            return 200, self._project(name, record, fields, single=True), {}
        if kind == "jobs":
            job = self.jobs.get(groups[0])
            if job is None:
                raise OntapError(404, "entry doesn't exist", 4)
            return 200, self._project(name, job, fields, single=True), {}
        if kind == "rules":
            policy = next((p for p in self.policies if p["id"] == int(groups[0])), None)
            if policy is None:
                raise OntapError(404, "entry doesn't exist", 4, "policy.id")
            records, key = self.rules[policy["id"]], groups[1]
        else:
            records, key = getattr(self, kind), groups[0] if groups else None

        if kind in self.BY_SVM_AND_NAME:
            key = groups if groups[0] is not None else None

        def find(record):
            if kind == "rules":
                return str(record["index"]) == key
            if kind in self.BY_SVM_AND_NAME:
                return (record["svm"]["uuid"], record["name"]) == key
            if kind == "krb_interfaces":
                return record["interface"]["uuid"] == key
            return (str(record.get("uuid", record.get("id"))) == key
                    or (kind == "nfs_services" and record["svm"]["uuid"] == key))

        if kind == "policies" and method == "GET":
            # ONTAP embeds a policy's rules in it (fields=rules.index, rules.clients...).
            records = [dict(r, rules=copy.deepcopy(self.rules[r["id"]])) for r in records]
        if key is None:
            if method == "GET":
                found = [r for r in records if self._matches(r, query)]
                return 200, {"records": [self._project(name, r, fields) for r in found],
                             "num_records": len(found)}, {}
            if method == "POST" and kind in self.CREATES:
                ontap_schema_check(schema, body, "post", gate)
                create = getattr(self, "_create_" + kind)
                record, status = create(expand(body), *([policy] if kind == "rules" else []))
                out = {}
                if query.get("return_records") == "true":
                    out = {"num_records": 1, "records": [copy.deepcopy(record)]}
                if status == 202:
                    out["job"] = self._job(record)
                return status, out, {}
            raise OntapError(405, "method not allowed", 5)
        record = next((r for r in records if find(r)), None)
        if record is None:
            raise OntapError(404, "entry doesn't exist", 4)
        if method == "GET":
            return 200, self._project(name, record, fields, single=True), {}
        if method == "PATCH" and kind in self.PATCHES:
            ontap_schema_check(schema, body, "patch", gate)
            changes = expand(body)
            self._check_features(name, changes)
            getattr(self, "_patch_" + kind)(record, changes, query)
            if kind == "volumes":
                return 202, {"job": self._job(record)}, {}
            return 200, {}, {}
        if method == "DELETE" and kind in ("volumes", "policies", "rules"):
            records.remove(record)
            return 200, {}, {}
        raise OntapError(405, "method not allowed", 5)

    # -- queries and answers -------------------------------------------------------------------
    def _check_query(self, method, name, schema, gate, query):
        extra = EXTRA_PARAMS.get((method, name), set())
        for key in query:
            if key in CONTROL_PARAMS or key in extra:
                continue
            if not ontap_schema.known_field(schema, key) or gate(key):
                raise OntapError(400, 'Unexpected argument "%s".' % key, 262179, key)
        fields = [f for f in query.get("fields", "").split(",") if f]
        for field in fields:
            plain = field[:-2] if field.endswith(".*") else field
            if not ontap_schema.known_field(schema, field) or (plain not in ("*", "**") and gate(plain)):
                raise OntapError(400, 'The value "%s" is invalid for field "fields" (<field,...>)' % field,
                                 262197, "fields")
        return fields

    def _check_features(self, name, changes):
        for (resource, path), (since, what) in FEATURES.items():
            if resource == name and lookup(changes, path) in (True, "true") and self.version < since:
                raise OntapError(400, "%s is not supported until the effective cluster version is %s."
                                 % (what, ".".join(map(str, since))), 3276800, path)

    @staticmethod
    def _values(record, dotted):
        """All values at a dotted path, looking into lists (clients.match)."""
        nodes = [record]
        for part in dotted.split("."):
            nxt = []
            for node in nodes:
                if isinstance(node, list):
                    node = [n.get(part) for n in node if isinstance(n, dict) and part in n]
                    nxt.extend(node)
                elif isinstance(node, dict) and part in node:
                    nxt.append(node[part])
            nodes = nxt
        out = []
        for node in nodes:
            out.extend(node if isinstance(node, list) else [node])
        return out

    def _matches(self, record, query):
        for key, wanted in query.items():
            if key in CONTROL_PARAMS or key == "new_index":
                continue
            values = [str(v).lower() for v in self._values(record, key)]
            patterns = [w.lower() for w in str(wanted).split("|")]
            if not any(fnmatch.fnmatchcase(v, p) for v in values for p in patterns):
                return False
        return True

    @staticmethod
    def _project(name, record, fields, single=False):
        """What ONTAP returns: the keys, plus the fields asked for (all but advanced with *)."""
        if not fields:
            fields = ["*"] if single else []
        out = {}
        for key in ("uuid", "name", "id", "index", "svm"):
            if key in record:
                out[key] = copy.deepcopy(record[key])
        for field in fields:
            base = "" if field in ("*", "**") else field[:-2] if field.endswith(".*") else field
            value = copy.deepcopy(record) if not base else _pick(record, base.split("."))
            if value is not _MISSING:
                _deep_merge(out, value)
        for adv in ADVANCED.get(name, ()):
            if adv not in fields and "**" not in fields:
                _drop(out, adv)
        return out

    def _job(self, record):
        job = _uuid("job/%s/%d" % (record.get("uuid", record.get("name")), len(self.jobs)))
        self.jobs[job] = {"uuid": job, "state": "success", "message": "success", "code": 0}
        return {"uuid": job, "_links": {"self": {"href": "/api/cluster/jobs/" + job}}}

    # -- creation and changes ---------------------------------------------------------------------
    def _create_volumes(self, body):
        svm = self._svm_from(body)
        if self.volume(body.get("name"), svm["name"]):
            raise OntapError(409, 'Duplicate volume name "%s".' % body.get("name"), 917536, "name")
        aggregates = []
        for ref in body.pop("aggregates", []):
            aggregate = self._aggregate(ref.get("name"))
            if aggregate is None:
                raise OntapError(400, 'Aggregate "%s" does not exist.' % ref.get("name"), 917933,
                                 "aggregates.name")
            aggregates.append(_ref(aggregate))
        if not aggregates:
            raise OntapError(400, 'Missing value for field "aggregates".', 917930, "aggregates")
        nas = body.get("nas", {})
        policy_name = lookup(nas, "export_policy.name") or "default"
        policy = self.policy(policy_name, svm["name"])
        if policy is None:
            raise OntapError(400, 'Export policy "%s" does not exist in SVM "%s".' % (policy_name, svm["name"]),
                             917971, "nas.export_policy.name")
        per_aggregate = body.pop("constituents_per_aggregate", None)
        size = int(body.pop("size", 0) or 0)
        record = merge({"uuid": _uuid("vol/%s/%s" % (svm["name"], body.get("name"))), "svm": _ref(svm),
                        "aggregates": aggregates, "type": "rw", "state": "online", "is_svm_root": False,
                        "style": "flexgroup" if len(aggregates) > 1 or per_aggregate else "flexvol",
                        "size": size, "space": {"size": size, "snapshot": {"reserve_percent": 5}},
                        "guarantee": {"type": "volume"}}, body)
        record["nas"] = merge({"security_style": "unix", "uid": 0, "gid": 0, "unix_permissions": 755}, nas)
        record["nas"]["export_policy"] = {"name": policy["name"], "id": policy["id"]}
        for key in ("uid", "gid", "unix_permissions"):
            record["nas"][key] = int(record["nas"][key])
        if per_aggregate:
            record["constituents_per_aggregate"] = int(per_aggregate)
        self.volumes.append(record)
        return record, 202

    def _patch_volumes(self, record, changes, _query):
        if "size" in changes:
            record["size"] = record["space"]["size"] = int(changes.pop("size"))
        nas = changes.get("nas", {})
        name = lookup(nas, "export_policy.name")
        if name:
            policy = self.policy(name, record["svm"]["name"])
            if policy is None:
                raise OntapError(400, 'Export policy "%s" does not exist.' % name, 917971, "nas.export_policy.name")
            nas["export_policy"] = {"name": name, "id": policy["id"]}
        for key in ("uid", "gid", "unix_permissions"):
            if key in nas:
                nas[key] = int(nas[key])
        merge(record, changes)

    def _create_nfs_services(self, body):
        svm = self._svm_from(body)
        if self.nfs_service(svm["name"]):
            raise OntapError(409, 'NFS server already exists for SVM "%s".' % svm["name"], 3276916)
        self._check_features("nfs_service", body)
        record = {"svm": _ref(svm), "enabled": True, "state": "online",
                  "protocol": {"v3_enabled": True, "v40_enabled": False, "v41_enabled": True,
                               "v41_features": {"pnfs_enabled": False}},
                  "transport": {"tcp_enabled": True, "udp_enabled": True}}
        if not self.gates["nfs_service"]("protocol.v41_features.trunking_enabled"):
            record["protocol"]["v41_features"]["trunking_enabled"] = False
        if not self.gates["nfs_service"]("transport.tcp_max_transfer_size"):
            record["transport"].update({"tcp_max_transfer_size": 65536, "rdma_enabled": False})
        self._patch_nfs_services(record, body, {})
        self.nfs_services.append(record)
        return record, 201

    @staticmethod
    def _patch_nfs_services(record, changes, _query):
        size = lookup(changes, "transport.tcp_max_transfer_size")
        if size is not None and not (8192 <= int(size) <= 1048576 and int(size) % 4096 == 0):
            raise OntapError(400, '"%s" is an invalid value for field "transport.tcp_max_transfer_size": '
                                  "8192 to 1048576, a multiple of 4096." % size, 262196,
                             "transport.tcp_max_transfer_size")
        merge(record, _typed(changes))

    def _create_policies(self, body):
        svm = self._svm_from(body)
        if self.policy(body.get("name"), svm["name"]):
            raise OntapError(409, 'Duplicate export policy "%s".' % body.get("name"), 1703954, "name")
        policy = self._new_policy(body["name"], svm)
        for rule in body.get("rules", []):
            self._create_rules(rule, policy)
        return policy, 201

    @staticmethod
    def _patch_policies(record, changes, _query):
        merge(record, changes)

    def _create_rules(self, body, policy):
        _require(body, "clients", "ro_rule", "rw_rule")
        rules = self.rules[policy["id"]]
        # ONTAP's defaults for what the POST leaves out.
        rule = {"anonymous_user": "65534", "superuser": ["none"], "allow_suid": True, "protocols": ["any"],
                "chown_mode": "restricted", "ntfs_unix_security": "fail", "allow_device_creation": True}
        rule.update(body)
        index = int(rule.get("index") or max([r["index"] for r in rules] + [0]) + 1)
        if any(r["index"] == index for r in rules):
            raise OntapError(409, "rule index %d already exists" % index, 1704036, "index")
        rule["index"] = index
        rules.append(rule)
        return rule, 201

    def _patch_rules(self, record, changes, query):
        new_index = query.get("new_index")
        merge(record, changes)
        if new_index:
            record["index"] = int(new_index)

    @staticmethod
    def _patch_lifs(record, changes, _query):
        merge(record, changes)

    # -- NFS Kerberos and the UNIX users a principal maps to ------------------------------------
    def _create_realms(self, body):
        svm = self._svm_from(body)
        _require(body, "name", "kdc.ip", "kdc.vendor")
        if self.realm(body["name"], svm["name"]):
            raise OntapError(409, 'Kerberos realm "%s" already exists for SVM "%s".' % (body["name"], svm["name"]),
                             3276810, "name")
        self._check_ad_server(body)
        record = merge({"svm": _ref(svm), "kdc": {"port": 88}, "clock_skew": 5}, body)
        self.realms.append(record)
        return record, 201

    @staticmethod
    def _check_ad_server(record):
        if lookup(record, "kdc.vendor") == "microsoft":
            for required in ("ad_server.name", "ad_server.address"):
                if not lookup(record, required):
                    raise OntapError(400, 'Field "%s" is required when "kdc.vendor" is "microsoft".' % required,
                                     262195, required)

    def _patch_realms(self, record, changes, _query):
        merge(record, changes)
        self._check_ad_server(record)

    def _patch_krb_interfaces(self, record, changes, _query):
        changes = _typed(changes)
        secret = {key: changes.pop(key) for key in ("user", "password", "keytab_uri", "force") if key in changes}
        if changes.get("enabled") is True:
            spn = changes.get("spn") or record.get("spn")
            match = re.fullmatch(r"nfs/([A-Za-z0-9.-]+)@([^@]+)", spn or "")
            if not match:
                raise OntapError(400, 'Invalid SPN "%s": the form is nfs/<host name>@<REALM>.' % spn, 3276869,
                                 "spn")
            if self.realm(match.group(2), record["svm"]["name"]) is None:
                raise OntapError(400, 'Kerberos realm "%s" is not configured for SVM "%s".'
                                 % (match.group(2), record["svm"]["name"]), 3276863, "spn")
            if not (secret.get("keytab_uri") or (secret.get("user") and secret.get("password"))):
                raise OntapError(400, "Enabling NFS Kerberos needs the KDC administrator's user and password, "
                                      "or a keytab URI.", 3276871, "user")
        merge(record, changes)

    def _create_unix_users(self, body):
        svm = self._svm_from(body)
        _require(body, "name", "id", "primary_gid")
        if self.unix_user(body["name"], svm["name"]):
            raise OntapError(409, 'UNIX user "%s" already exists.' % body["name"], 23724042, "name")
        body.pop("skip_name_validation", None)
        record = dict(body, svm=_ref(svm), id=int(body["id"]), primary_gid=int(body["primary_gid"]))
        self.unix_users.append(record)
        return record, 201

    def _create_unix_groups(self, body):
        svm = self._svm_from(body)
        _require(body, "name", "id")
        if self.unix_group(body["name"], svm["name"]):
            raise OntapError(409, 'UNIX group "%s" already exists.' % body["name"], 23724042, "name")
        body.pop("skip_name_validation", None)
        record = dict(body, svm=_ref(svm), id=int(body["id"]))
        self.unix_groups.append(record)
        return record, 201

    @staticmethod
    def _patch_unix_users(record, changes, _query):
        merge(record, {k: int(v) if k in ("id", "primary_gid") else v for k, v in changes.items()})

    @staticmethod
    def _patch_unix_groups(record, changes, _query):
        merge(record, {k: int(v) if k == "id" else v for k, v in changes.items()})

    def start(self):
        self.server.start()
        return self

    def stop(self):
        self.server.stop()


def _require(body, *fields):
    """ONTAP's refusal of a POST that leaves out a required field (dotted names look inside)."""
    for field in fields:
        if lookup(body, field) in (None, "", []):
            raise OntapError(400, 'Missing value for field "%s".' % field, 262195, field)


def ontap_schema_check(schema, body, mode, gate):
    try:
        ontap_schema.check_body(schema, expand(body), mode, gate)
    except ontap_schema.BodyError as exc:
        raise OntapError(400, exc.message, exc.code, exc.target) from exc


def _typed(changes):
    """The JSON booleans ONTAP stores for the 'true'/'false' strings netapp.ontap sends."""
    out = {}
    for key, value in changes.items():
        if isinstance(value, dict):
            value = _typed(value)
        elif value in ("true", "false"):
            value = value == "true"
        out[key] = value
    return out


_MISSING = object()


def _pick(node, parts):
    """The part of `node` on the path (lists followed item by item), rooted like `node`."""
    if not parts:
        return copy.deepcopy(node)
    if isinstance(node, list):
        items = [_pick(item, parts) for item in node]
        if all(item is _MISSING for item in items):
            return _MISSING
        return [{} if item is _MISSING else item for item in items]
    if isinstance(node, dict) and parts[0] in node:
        sub = _pick(node[parts[0]], parts[1:])
        return _MISSING if sub is _MISSING else {parts[0]: sub}
    return _MISSING


def _deep_merge(into, new):
    for key, value in new.items():
        old = into.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            _deep_merge(old, value)
        elif isinstance(value, list) and isinstance(old, list) and len(old) == len(value):
            for i, item in enumerate(value):
                if isinstance(item, dict) and isinstance(old[i], dict):
                    _deep_merge(old[i], item)
                else:
                    old[i] = item
        else:
            into[key] = value


def _drop(record, dotted):
    parts = dotted.split(".")
    node = record
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(parts[-1], None)


if __name__ == "__main__":  # pragma: no cover
    import sys
    import tempfile
    import time

    claimed = tuple(int(p) for p in (sys.argv[1] if len(sys.argv) > 1 else "9.14.1").split("."))
    double = OntapDouble(tempfile.mkdtemp(), version=claimed).start()
    print("ONTAP %s REST test double on https://127.0.0.1:%d" % (".".join(map(str, claimed)), double.server.port))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        double.stop()
