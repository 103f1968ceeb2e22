"""Test double of StorageGRID's tenant management API (and the two S3 lifecycle calls).

Answers what storagegrid_s3 sends in tenant mode: the login (/api/v3/authorize), the
product version, buckets (/api/v3/org/containers), the tenant user and its S3 access
keys, and, on the same port, S3 GET/PUT ?lifecycle in path style. Records every
request (see recorder.py) so tests can assert the exact sequence and payloads, e.g.
that a second run never creates another S3 key. Not a simulator: no signature checks
on the S3 calls, no grid-wide bucket namespace, no permissions.
"""
import copy
import re
import xml.etree.ElementTree as ET

from tests.doubles.recorder import RecordingServer

TOKEN = "double-token-0123456789"


class StorageGridDouble:
    def __init__(self, tls_dir, account_id="27000000000000000001", username="kvcache-admin",
                 password="double-tenant-password", version="11.8.0-20240131.1234.abcdef"):
        self.account_id, self.username, self.password, self.version = account_id, username, password, version
        self.containers = []
        self.users = {"user/kvcache": {"id": "00000000-0000-4000-8000-000000000077", "uniqueName": "user/kvcache"}}
        self.keys = {}  # access key -> {"user": id or "current-user", ...}
        self.lifecycle = {}  # bucket -> XML text
        self.created_keys = 0
        self.server = RecordingServer(self.handle, tls_dir=tls_dir)

    @staticmethod
    def _json(status, data):
        return status, ({"data": data, "status": "success", "apiVersion": "4.0"} if status < 400
                        else {"code": status, "message": data, "status": "error", "apiVersion": "4.0"}), {}

    def handle(self, req):
        path, method = req["path"], req["method"]
        if path.startswith("/api/v3/"):
            return self._mgmt(req, path[len("/api/v3"):], method)
        return self._s3(req, path, method)

    # -- management API --------------------------------------------------------------------
    def _mgmt(self, req, path, method):
        body = req["body"] if isinstance(req["body"], dict) else {}
        if path == "/authorize" and method == "POST":
            ok = (str(body.get("accountId")) == self.account_id and body.get("username") == self.username
                  and body.get("password") == self.password)
            return self._json(200, TOKEN) if ok else self._json(401, "Unauthorized: wrong credentials")
        if req.get("user") != ["Bearer", TOKEN]:
            return self._json(401, "Unauthorized")
        if path == "/org/config/product-version" and method == "GET":
            return self._json(200, {"productVersion": self.version})
        if path == "/org/containers":
            if method == "GET":
                return self._json(200, copy.deepcopy(self.containers))
            if method == "POST":
                if any(c["name"] == body.get("name") for c in self.containers):
                    return self._json(409, "Bucket already exists")
                container = {"name": body.get("name"), "region": body.get("region", "us-east-1"),
                             "creationTime": "2026-01-01T00:00:00.000Z"}
                self.containers.append(container)
                return self._json(201, container)
        m = re.match(r"^/org/containers/([^/]+)/versioning$", path)
        if m:
            container = next((c for c in self.containers if c["name"] == m.group(1)), None)
            if container is None:
                return self._json(404, "bucket not found")
            if method == "PUT":
                container["versioning"] = {"versioningEnabled": bool(body.get("versioningEnabled")),
                                           "versioningSuspended": bool(body.get("versioningSuspended"))}
            if method in ("GET", "PUT"):
                default = {"versioningEnabled": False, "versioningSuspended": False}
                return self._json(200, container.get("versioning", default))
        m = re.match(r"^/org/users/(user/[^/]+)$", path)
        if m and method == "GET":
            user = self.users.get(m.group(1))
            return self._json(200, copy.deepcopy(user)) if user else self._json(404, "user not found")
        m = re.match(r"^/org/users/([^/]+)/s3-access-keys(?:/([^/]+))?$", path)
        if m:
            owner, key = m.group(1), m.group(2)
            if method == "GET" and key:
                found = self.keys.get(key)
                if found and found["owner"] == owner:
                    return self._json(200, {"id": found["id"], "accessKey": key[:4] + "****",
                                            "userURN": "urn:sgws:identity::%s:%s" % (self.account_id, owner)})
                return self._json(404, "S3 access key not found")
            if method == "POST" and not key:
                self.created_keys += 1
                access = "SGKEY%015d" % self.created_keys
                secret = "double-secret-%026d" % self.created_keys
                self.keys[access] = {"owner": owner, "id": "key-%d" % self.created_keys, "secret": secret}
                return self._json(201, {"id": "key-%d" % self.created_keys, "accessKey": access,
                                        "secretAccessKey": secret, "expires": None})
        return self._json(404, "test double: no handler for %s /api/v3%s" % (method, path))

    # -- S3 lifecycle (path style) ---------------------------------------------------------
    def _s3(self, req, path, method):
        bucket = path.strip("/").split("/", 1)[0]
        if "lifecycle" not in req["query"]:
            return 501, "<Error><Code>NotImplemented</Code><Message>test double</Message></Error>", {}
        if not any(c["name"] == bucket for c in self.containers):
            return 404, "<Error><Code>NoSuchBucket</Code><Message>no bucket</Message></Error>", {}
        if method == "GET":
            if bucket not in self.lifecycle:
                return 404, ("<Error><Code>NoSuchLifecycleConfiguration</Code>"
                             "<Message>The lifecycle configuration does not exist</Message></Error>"), {}
            return 200, self.lifecycle[bucket], {}
        if method == "PUT":
            ET.fromstring(req["body"])  # must be well-formed XML
            self.lifecycle[bucket] = req["body"]
            return 200, "", {}
        if method == "DELETE":
            self.lifecycle.pop(bucket, None)
            return 204, "", {}
        return 405, "<Error><Code>MethodNotAllowed</Code></Error>", {}

    def start(self):
        self.server.start()
        return self

    def stop(self):
        self.server.stop()
