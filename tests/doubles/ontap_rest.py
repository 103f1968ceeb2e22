"""Test double of ONTAP's REST API for the calls the ontap_nfs role makes.

Models one cluster (ONTAP 9.14.1) with one SVM, one aggregate and one data LIF, and
the collections the role touches: NFS services, export policies and their rules,
volumes, IP interfaces. Every request is recorded (see recorder.py). Anything it
does not know answers 404 with an ONTAP-style error, so an unexpected call shows up
in the recorded sequence and fails the test.

Run alone for manual experiments: python -m tests.doubles.ontap_rest
"""
import copy
import re
import uuid as uuidlib

from tests.doubles.recorder import RecordingServer, expand, lookup, merge

CONTROL_PARAMS = {"fields", "return_records", "return_timeout", "max_records", "order_by", "ignore_unknown_fields"}


def _uuid(seed):
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, seed))


class OntapDouble:
    def __init__(self, tls_dir, svm="svm_kv", aggregate="aggr1", lif="kv_data1", version=(9, 14, 1)):
        self.svm = {"name": svm, "uuid": _uuid("svm/" + svm)}
        self.version = version
        self.collections = {
            "/api/svm/svms": [copy.deepcopy(self.svm) | {"state": "running"}],
            "/api/storage/aggregates": [{"name": aggregate, "uuid": _uuid("aggr/" + aggregate)}],
            "/api/protocols/nfs/services": [],
            "/api/protocols/nfs/export-policies": [],
            "/api/storage/volumes": [],
            "/api/network/ip/interfaces": [{
                "name": lif, "uuid": _uuid("lif/" + lif), "svm": copy.deepcopy(self.svm),
                "ip": {"address": "10.20.0.5", "netmask": "24"}, "rdma_protocols": [],
            }],
        }
        self.rules = {}  # policy id -> list of rules
        self.server = RecordingServer(self.handle, tls_dir=tls_dir)

    # -- helpers -------------------------------------------------------------------------
    @staticmethod
    def _error(status, message, code="4"):
        return status, {"error": {"message": message, "code": code}}, {}

    @staticmethod
    def _matches(record, query):
        for key, wanted in query.items():
            if key in CONTROL_PARAMS:
                continue
            value = lookup(record, key)
            if value is None:
                return False
            if str(value).lower() not in [w.lower() for w in str(wanted).split("|")]:
                return False
        return True

    def _list(self, records, query):
        found = [copy.deepcopy(r) for r in records if self._matches(r, query)]
        return 200, {"records": found, "num_records": len(found)}, {}

    def _svm_ref(self, body):
        svm = body.pop("svm", None) or {}
        if body.get("svm.name") or svm.get("name"):
            body.pop("svm.name", None)
            return copy.deepcopy(self.svm)
        if body.get("svm.uuid") or svm.get("uuid"):
            body.pop("svm.uuid", None)
            return copy.deepcopy(self.svm)
        return copy.deepcopy(self.svm)

    # -- dispatcher ----------------------------------------------------------------------
    def handle(self, req):
        path, method, query = req["path"].rstrip("/"), req["method"], req["query"]
        body = req["body"] if isinstance(req["body"], dict) else {}

        if path == "/api/cluster" and method == "GET":
            gen, major, minor = self.version
            return 200, {"name": "double-cluster", "uuid": _uuid("cluster"),
                         "version": {"full": "NetApp Release %d.%d.%d (test double)" % self.version,
                                     "generation": gen, "major": major, "minor": minor}}, {}
        if re.match(r"^/api/cluster/jobs/[^/]+$", path):
            return 200, {"uuid": path.rsplit("/", 1)[1], "state": "success", "message": "success"}, {}

        m = re.match(r"^/api/protocols/nfs/export-policies/(\d+)/rules(?:/(\d+))?$", path)
        if m:
            return self._rules(method, int(m.group(1)), m.group(2), query, body)

        for coll, records in self.collections.items():
            if path == coll:
                if method == "GET":
                    return self._list(records, query)
                if method == "POST":
                    return self._create(coll, records, body, query)
            if path.startswith(coll + "/"):
                key = path[len(coll) + 1:]
                record = next((r for r in records if str(r.get("uuid", r.get("id", r.get("svm", {}).get("uuid")))) == key), None)
                if record is None:
                    return self._error(404, "entry doesn't exist", "4")
                if method == "GET":
                    return 200, copy.deepcopy(record), {}
                if method == "PATCH":
                    merge(record, expand(body))
                    return 200, {}, {}
                if method == "DELETE":
                    records.remove(record)
                    return 200, {}, {}
        return self._error(404, "test double: no handler for %s %s" % (method, path), "3")

    def _create(self, coll, records, body, query):
        body = dict(body)
        svm = self._svm_ref(body)
        record = expand(body)
        record["svm"] = svm
        if coll == "/api/protocols/nfs/services":
            record.setdefault("enabled", True)
            record.setdefault("state", "online")
        elif coll == "/api/protocols/nfs/export-policies":
            record["id"] = 1000 + len(records) + 1
            self.rules[record["id"]] = []
        elif coll == "/api/storage/volumes":
            record["uuid"] = _uuid("vol/" + record.get("name", ""))
            # Shape the record the way ONTAP reports a volume.
            record.setdefault("space", {})["size"] = record.pop("size", 0)
            record["space"].setdefault("snapshot", {}).setdefault("reserve_percent", 5)
            record.setdefault("guarantee", {"type": "volume"})
            perms = record.get("nas", {}).get("unix_permissions")
            if isinstance(perms, str) and perms.isdigit():
                record["nas"]["unix_permissions"] = int(perms)
            record.setdefault("state", "online")
            record.setdefault("style", "flexgroup" if len(record.get("aggregates", [])) > 1 else "flexvol")
            record.setdefault("type", "rw")
        else:
            record["uuid"] = _uuid(coll + "/" + record.get("name", str(len(records))))
        records.append(record)
        result = {"num_records": 1, "records": [copy.deepcopy(record)]} if query.get("return_records") == "true" else {}
        if coll == "/api/storage/volumes":
            job = _uuid("job/" + record["uuid"])
            result["job"] = {"uuid": job, "_links": {"self": {"href": "/api/cluster/jobs/" + job}}}
            return 202, result, {}
        return 201, result, {}

    def _rules(self, method, policy_id, index, query, body):
        if policy_id not in self.rules:
            return self._error(404, "export policy %d doesn't exist" % policy_id)
        rules = self.rules[policy_id]
        if index is None:
            if method == "GET":
                return self._list(rules, query)
            if method == "POST":
                # ONTAP's defaults for what the POST leaves out.
                rule = {"anonymous_user": "65534", "superuser": ["none"], "allow_suid": True,
                        "chown_mode": "restricted", "ntfs_unix_security": "fail", "allow_device_creation": True}
                rule.update(expand(body))
                rule["index"] = rule.get("index") or len(rules) + 1
                rules.append(rule)
                result = {"num_records": 1, "records": [copy.deepcopy(rule)]} if query.get("return_records") == "true" else {}
                return 201, result, {}
        rule = next((r for r in rules if r["index"] == int(index or 0)), None)
        if rule is None:
            return self._error(404, "entry doesn't exist")
        if method == "GET":
            return 200, copy.deepcopy(rule), {}
        if method == "PATCH":
            merge(rule, expand(body))
            return 200, {}, {}
        if method == "DELETE":
            rules.remove(rule)
            return 200, {}, {}
        return self._error(405, "method not allowed")

    def start(self):
        self.server.start()
        return self

    def stop(self):
        self.server.stop()


if __name__ == "__main__":  # pragma: no cover
    import time

    import tempfile

    double = OntapDouble(tempfile.mkdtemp()).start()
    print("ONTAP REST test double on https://127.0.0.1:%d" % double.server.port)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        double.stop()
