"""Test double of StorageGRID's tenant management API (and the S3 lifecycle calls).

Claims one StorageGRID release and serves what a grid of that release serves:

- GET /api/versions (no login) lists the management API versions the grid enables. A
  fresh install enables only the release's newest (v4 from 11.8, v3 for 11.5-11.7);
  an upgraded grid keeps the previous one too (`upgraded=True`). NetApp: "When you
  install StorageGRID software for the first time, only the most recent version of the
  API is enabled ... when you upgrade ... you continue to have access to the older API
  version for at least one feature release."
- /api/v<N>/... only for an enabled N; any other version answers 404.
- The tenant calls storagegrid_s3 makes: authorize, the tenant user, buckets and their
  versioning, the user's S3 access keys. Errors have StorageGRID's shape
  ({"status": "error", "code": N, "message": {"text": ..., "key": ...}}).
- On the same port, S3 GET/PUT/DELETE ?lifecycle in path style, signed with a key this
  grid issued (else 403 InvalidAccessKeyId). A PUT is checked against the lifecycle
  elements StorageGRID documents ("Each rule can include the following XML elements:
  Expiration, NoncurrentVersionExpiration, Filter (Prefix, Tag), Status, ID";
  Expiration actions only, up to 1,000 rules): anything else (AbortIncompleteMultipartUpload,
  Transition, ...) is refused with 400 MalformedXML naming the element. The PUT must carry
  Content-MD5 (S3's PutBucketLifecycleConfiguration: "you must include the Content-MD5
  header"), and it must match the body (else 400 InvalidDigest / BadDigest). A flexible
  checksum (x-amz-checksum-crc32, what botocore 1.36+ sends instead) is no substitute:
  StorageGRID takes pre-calculated checksums on object operations only, and only from 12.1
  (NetApp, "Changes to StorageGRID S3 REST API support", 12.1.0: CompleteMultipartUpload,
  CreateMultipartUpload, CopyObject, PutObject, UploadPart). Such a PUT is refused with
  400 InvalidRequest "Missing required header for this request: Content-MD5".

- Groups and their policies (GET/POST /org/groups, GET/PUT /org/groups/{id or group/name}),
  checked as StorageGRID takes them: uniqueName "group/<name>"; policies with only management,
  s3 and swift; management permissions among StorageGRID's (manageAllContainers,
  manageEndpoints, manageOwnContainerObjects, manageOwnS3Credentials, rootAccess,
  viewAllContainers), boolean, and answered with the true ones only (as the grid, and
  netapp.storagegrid's na_sg_org_group, do); an S3 group policy of Statement entries with
  Effect, Action (s3:...) and Resource (arn:aws:s3::: or urn:sgws:s3:::), and no Principal (a
  group policy applies to its members: NetApp, "Use access policies": Principal is for bucket
  policies only). A user's groups are set with PUT /org/users/{id} (fullName, memberOf, disable),
  as na_sg_org_user does; memberOf must name existing groups.
- S3 keys of the logged-in user (/org/users/current-user/s3-access-keys), with an expiry.
- Permissions on the S3 calls it serves: a key may read or change a bucket's lifecycle only when
  its owner is in a group with rootAccess or manageAllContainers, or whose S3 policy allows the
  action (s3:GetLifecycleConfiguration, s3:PutLifecycleConfiguration) on the bucket and none
  denies it. A user in no group may do nothing (403 AccessDenied).

Records every request (recorder.py). Not a simulator: no signature verification beyond
the key ID, no grid-wide bucket namespace, no object operations.
"""
import base64
import copy
import datetime
import fnmatch
import hashlib
import re
import xml.etree.ElementTree as ET

from tests.doubles.recorder import RecordingServer

TOKEN = "double-token-0123456789"
S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
# Release -> the management API major version it introduced, and its minor (the double's).
API_OF_RELEASE = {(11, 5): (3, 3), (11, 6): (3, 4), (11, 7): (3, 5), (11, 8): (4, 0), (11, 9): (4, 1)}
# The lifecycle elements StorageGRID documents, as child -> allowed children.
LIFECYCLE = {
    "LifecycleConfiguration": {"Rule"},
    "Rule": {"ID", "Status", "Filter", "Expiration", "NoncurrentVersionExpiration"},
    "Filter": {"Prefix", "Tag", "And"},
    "And": {"Prefix", "Tag"},
    "Tag": {"Key", "Value"},
    "Expiration": {"Days", "Date"},
    "NoncurrentVersionExpiration": {"NoncurrentDays"},
}


def _local(tag):
    return tag.split("}", 1)[-1]


def check_content_md5(req):
    """None when a lifecycle PUT carries a Content-MD5 that matches its body, else (code, message)."""
    given = (req.get("headers") or {}).get("content-md5")
    if not given:
        return "InvalidRequest", "Missing required header for this request: Content-MD5"
    try:
        digest = base64.b64decode(given, validate=True)
    except ValueError:
        digest = b""
    if len(digest) != 16:
        return "InvalidDigest", "The Content-MD5 you specified was invalid"
    if digest != hashlib.md5(req.get("raw") or b"").digest():  # noqa: S324 - S3's integrity check, not security
        return "BadDigest", "The Content-MD5 you specified did not match what was received"
    return None


def check_group_s3_policy(policy):
    """None when StorageGRID takes this S3 group policy, else the reason."""
    if not isinstance(policy, dict) or set(policy) - {"Version", "Id", "Statement"}:
        return "policies.s3 holds Version, Id and Statement only"
    statements = policy.get("Statement")
    if not isinstance(statements, list) or not statements:
        return "policies.s3.Statement must be a non-empty list"
    for statement in statements:
        if not isinstance(statement, dict):
            return "a Statement entry must be an object"
        if "Principal" in statement or "NotPrincipal" in statement:
            return "a group policy has no Principal (its members are the principals)"
        if set(statement) - {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition"}:
            return "unknown Statement element in %s" % sorted(statement)
        if statement.get("Effect") not in ("Allow", "Deny"):
            return "Effect must be Allow or Deny"
        actions = statement.get("Action")
        actions = actions if isinstance(actions, list) else [actions]
        if not all(isinstance(a, str) and re.match(r"^s3:[A-Za-z*]+$", a) for a in actions):
            return "Action must be s3:<operation> names, got %s" % actions
        resources = statement.get("Resource")
        resources = resources if isinstance(resources, list) else [resources]
        if not all(isinstance(r, str) and re.match(r"^(arn:aws|urn:sgws):s3:::\S+$", r) for r in resources):
            return "Resource must be arn:aws:s3:::<bucket>[/<key>] or urn:sgws:s3:::..., got %s" % resources
    return None


def check_lifecycle(text):
    """None when StorageGRID takes this lifecycle configuration, else the reason."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        return "not well-formed XML: %s" % exc
    if _local(root.tag) != "LifecycleConfiguration":
        return "the root element is %s, not LifecycleConfiguration" % _local(root.tag)
    rules = list(root)
    if not rules or len(rules) > 1000:
        return "a lifecycle configuration has 1 to 1,000 rules, this one has %d" % len(rules)

    def walk(element):
        allowed = LIFECYCLE.get(_local(element.tag), set())
        for child in element:
            if _local(child.tag) not in allowed:
                return "element %s is not supported in %s (StorageGRID: Expiration, NoncurrentVersionExpiration, " \
                       "Filter (Prefix, Tag), Status, ID)" % (_local(child.tag), _local(element.tag))
            problem = walk(child)
            if problem:
                return problem
        return None

    problem = walk(root)
    if problem:
        return problem
    for rule in rules:
        fields = {_local(c.tag): c for c in rule}
        if (fields.get("Status") is None or fields["Status"].text not in ("Enabled", "Disabled")):
            return "a rule needs Status Enabled or Disabled"
        if "Expiration" not in fields and "NoncurrentVersionExpiration" not in fields:
            return "a rule needs an Expiration or NoncurrentVersionExpiration action"
        if len((fields.get("ID").text or "") if fields.get("ID") is not None else "") > 255:
            return "a rule ID is at most 255 characters"
        days = [e for e in rule.iter() if _local(e.tag) in ("Days", "NoncurrentDays")]
        if any(not (d.text or "").isdigit() or int(d.text) < 1 for d in days):
            return "Days must be a positive integer"
    return None


class StorageGridDouble:
    def __init__(self, tls_dir, account_id="27000000000000000001", username="kvcache-admin",
                 password="double-tenant-password", version="11.8.0-20240131.1234.abcdef", upgraded=False):
        self.account_id, self.username, self.password, self.version = account_id, username, password, version
        release = tuple(int(p) for p in version.split("-")[0].split(".")[:2])
        major, minor = API_OF_RELEASE[release]
        self.api_versions = [major - 1, major] if upgraded else [major]
        self.api_minor = {major: "%d.%d" % (major, minor), major - 1: "%d.%d" % (major - 1, 9)}
        self.containers = []
        # The tenant's administrator logs in (a member of a root-access group); user/kvcache is
        # the nodes' key user, created in the Tenant Manager in no group (so its keys may do nothing).
        admins = {"id": "00000000-0000-4000-8000-0000000000a1", "uniqueName": "group/admins", "displayName": "admins",
                  "policies": {"management": {"rootAccess": True}}}
        self.groups = {admins["id"]: admins}
        self.users = {
            "user/kvcache": {"id": "00000000-0000-4000-8000-000000000077", "uniqueName": "user/kvcache",
                             "fullName": "kvcache nodes", "memberOf": [], "disable": False},
            "user/" + username: {"id": "00000000-0000-4000-8000-0000000000ad", "uniqueName": "user/" + username,
                                 "fullName": "tenant administrator", "memberOf": [admins["id"]], "disable": False},
        }
        self.keys = {}  # access key -> {"owner": user id, "id": ..., "secret": ...}
        self.lifecycle = {}  # bucket -> XML text
        self.created_keys = 0
        self.server = RecordingServer(self.handle, tls_dir=tls_dir)

    def _json(self, status, data, api=None, key="error"):
        api = self.api_minor.get(api or self.api_versions[-1], "%d.0" % (api or 0))
        if status < 400:
            return status, {"data": data, "status": "success", "apiVersion": api, "responseTime": "2026-01-01T00:00:00Z"}, {}
        return status, {"code": status, "message": {"text": data, "key": key}, "status": "error", "apiVersion": api,
                        "responseTime": "2026-01-01T00:00:00Z"}, {}

    def handle(self, req):
        path, method = req["path"], req["method"]
        if path.rstrip("/") == "/api/versions" and method == "GET":
            return self._json(200, list(self.api_versions))
        m = re.match(r"^/api/v(\d+)(/.*)$", path)
        if m:
            api = int(m.group(1))
            if api not in self.api_versions:
                return self._json(404, "API version %d is not enabled on this grid (GET /api/versions: %s)"
                                  % (api, self.api_versions), api, "notFound")
            return self._mgmt(req, m.group(2), method, api)
        if path.startswith("/api/"):
            return self._json(404, "not found", None, "notFound")
        return self._s3(req, path, method)

    # -- management API --------------------------------------------------------------------
    def _mgmt(self, req, path, method, api):
        body = req["body"] if isinstance(req["body"], dict) else {}

        def answer(status, data, key="error"):
            return self._json(status, data, api, key)

        if path == "/authorize" and method == "POST":
            ok = (str(body.get("accountId")) == self.account_id and body.get("username") == self.username
                  and body.get("password") == self.password)
            return answer(200, TOKEN) if ok else answer(401, "Unauthorized: wrong credentials", "unauthorized")
        if req.get("user") != ["Bearer", TOKEN]:
            return answer(401, "Unauthorized", "unauthorized")
        if path == "/org/config/product-version" and method == "GET":
            return answer(200, {"productVersion": self.version})
        if path == "/org/containers":
            if method == "GET":
                return answer(200, copy.deepcopy(self.containers))
            if method == "POST":
                unknown = set(body) - {"name", "region", "compliance", "s3ObjectLock", "dataGuarantee"}
                if unknown or not isinstance(body.get("name"), str):
                    return answer(400, "invalid request body: %s" % sorted(unknown or ["name"]), "invalidBody")
                if any(c["name"] == body["name"] for c in self.containers):
                    return answer(409, "Bucket already exists", "bucketExists")
                container = {"name": body["name"], "region": body.get("region", "us-east-1"),
                             "creationTime": "2026-01-01T00:00:00.000Z"}
                self.containers.append(container)
                return answer(201, container)
        m = re.match(r"^/org/containers/([^/]+)/versioning$", path)
        if m:
            container = next((c for c in self.containers if c["name"] == m.group(1)), None)
            if container is None:
                return answer(404, "bucket not found", "notFound")
            if method == "PUT":
                if set(body) - {"versioningEnabled", "versioningSuspended"}:
                    return answer(400, "invalid request body", "invalidBody")
                container["versioning"] = {"versioningEnabled": bool(body.get("versioningEnabled")),
                                           "versioningSuspended": bool(body.get("versioningSuspended"))}
            if method in ("GET", "PUT"):
                default = {"versioningEnabled": False, "versioningSuspended": False}
                return answer(200, container.get("versioning", default))
        found = self._groups(path, method, body, answer)
        if found is not None:
            return found
        m = re.match(r"^/org/users/(user/[^/]+)$", path)
        if m and method == "GET":
            user = self.users.get(m.group(1))
            return answer(200, copy.deepcopy(user)) if user else answer(404, "user not found", "notFound")
        m = re.match(r"^/org/users/([0-9a-f-]{36})$", path)
        if m and method == "PUT":
            user = next((u for u in self.users.values() if u["id"] == m.group(1)), None)
            if user is None:
                return answer(404, "user not found", "notFound")
            problem = self._user_body(body)
            if problem:
                return answer(400, problem, "invalidBody")
            user.update({k: copy.deepcopy(v) for k, v in body.items() if k in ("fullName", "memberOf", "disable")})
            return answer(200, copy.deepcopy(user))
        m = re.match(r"^/org/users/([^/]+)/s3-access-keys(?:/([^/]+))?$", path)
        if m:
            owner, key = m.group(1), m.group(2)
            if owner == "current-user":
                owner = self.users["user/" + self.username]["id"]
            elif not any(u["id"] == owner for u in self.users.values()):
                return answer(404, "user not found", "notFound")
            if method == "DELETE" and key:
                found_key = self.keys.get(key)
                if not found_key or found_key["owner"] != owner:
                    return answer(404, "S3 access key not found", "notFound")
                del self.keys[key]
                return 204, None, {}
            if method == "GET" and key:
                found = self.keys.get(key)
                if found and found["owner"] == owner:
                    return answer(200, {"id": found["id"], "accessKey": key[:4] + "****",
                                        "userURN": "urn:sgws:identity::%s:%s" % (self.account_id, owner)})
                return answer(404, "S3 access key not found", "notFound")
            if method == "POST" and not key:
                if set(body) - {"expires"}:
                    return answer(400, "invalid request body", "invalidBody")
                if body.get("expires") is not None:
                    try:
                        expires = datetime.datetime.strptime(body["expires"], "%Y-%m-%dT%H:%M:%S.%fZ")
                    except (TypeError, ValueError):
                        return answer(400, "expires is not an ISO 8601 time (2026-01-01T00:00:00.000Z)", "invalidBody")
                    if expires <= datetime.datetime.utcnow():
                        return answer(400, "expires is in the past", "invalidBody")
                self.created_keys += 1
                access = "SGKEY%015d" % self.created_keys
                secret = "double-secret-%026d" % self.created_keys
                self.keys[access] = {"owner": owner, "id": "key-%d" % self.created_keys, "secret": secret,
                                     "expires": body.get("expires")}
                return answer(201, {"id": "key-%d" % self.created_keys, "accessKey": access,
                                    "secretAccessKey": secret, "expires": body.get("expires")})
        return answer(404, "test double: no handler for %s /api/v%d%s" % (method, api, path), "notFound")

    # -- groups ------------------------------------------------------------------------------
    MANAGEMENT = {"manageAllContainers", "manageEndpoints", "manageOwnContainerObjects", "manageOwnS3Credentials",
                  "rootAccess", "viewAllContainers"}

    def _group_by(self, ref):
        return next((g for g in self.groups.values() if ref in (g["id"], g["uniqueName"])), None)

    def _groups(self, path, method, body, answer):
        """The /org/groups calls, or None for another path."""
        if path == "/org/groups":
            if method == "GET":
                return answer(200, copy.deepcopy(list(self.groups.values())))
            if method == "POST":
                problem = self._group_body(body, create=True)
                if problem:
                    return answer(400, problem, "invalidBody")
                if self._group_by(body["uniqueName"]):
                    return answer(409, "group %s already exists" % body["uniqueName"], "groupExists")
                gid = "00000000-0000-4000-9000-%012d" % (len(self.groups) + 1)
                group = {"id": gid, "uniqueName": body["uniqueName"], "displayName": body["displayName"],
                         "policies": self._policies(body["policies"]), "federated": False,
                         "accountId": self.account_id,
                         "groupURN": "urn:sgws:identity::%s:%s" % (self.account_id, body["uniqueName"])}
                self.groups[gid] = group
                return answer(201, copy.deepcopy(group))
            return None
        m = re.match(r"^/org/groups/((?:group/)?[^/]+)$", path)
        if not m:
            return None
        group = self._group_by(m.group(1))
        if group is None:
            return answer(404, "group not found", "notFound")
        if method == "GET":
            return answer(200, copy.deepcopy(group))
        if method == "PUT" and not m.group(1).startswith("group/"):
            problem = self._group_body(body, create=False)
            if problem:
                return answer(400, problem, "invalidBody")
            group.update({"displayName": body["displayName"], "policies": self._policies(body["policies"])})
            return answer(200, copy.deepcopy(group))
        return None

    def _policies(self, policies):
        """As the grid answers: management with its true permissions only."""
        out = {"management": {k: True for k, v in (policies.get("management") or {}).items() if v}}
        if policies.get("s3") is not None:
            out["s3"] = copy.deepcopy(policies["s3"])
        return out

    def _group_body(self, body, create):
        allowed = {"displayName", "uniqueName", "policies", "managementReadOnly"}
        if set(body) - allowed:
            return "invalid request body: unknown %s" % sorted(set(body) - allowed)
        if create and not re.match(r"^group/[A-Za-z0-9_.@-]{1,128}$", str(body.get("uniqueName", ""))):
            return "uniqueName must be group/<name> (letters, digits, _ . @ -)"
        if not isinstance(body.get("displayName"), str) or not body["displayName"]:
            return "displayName is required"
        policies = body.get("policies")
        if not isinstance(policies, dict) or set(policies) - {"management", "s3", "swift"}:
            return "policies may hold management, s3 and swift only"
        management = policies.get("management") or {}
        if set(management) - self.MANAGEMENT or not all(isinstance(v, bool) for v in management.values()):
            return "policies.management: unknown or non-boolean permission in %s" % sorted(management)
        if policies.get("s3") is not None:
            return check_group_s3_policy(policies["s3"])
        return None

    def _user_body(self, body):
        if set(body) - {"fullName", "uniqueName", "memberOf", "disable"}:
            return "invalid request body: unknown %s" % sorted(set(body) - {"fullName", "uniqueName", "memberOf", "disable"})
        if not isinstance(body.get("fullName"), str) or not isinstance(body.get("memberOf"), list):
            return "fullName and memberOf are required"
        unknown = [g for g in body["memberOf"] if g not in self.groups]
        if unknown:
            return "memberOf names no group: %s" % unknown
        return None

    def allowed(self, user_id, action, resource):
        """StorageGRID's evaluation for a key's owner: management permission, then group policies
        (an explicit Deny wins, else an Allow is needed)."""
        user = next((u for u in self.users.values() if u["id"] == user_id), None)
        groups = [self.groups[g] for g in (user or {}).get("memberOf", []) if g in self.groups]
        if any(g["policies"]["management"].get("rootAccess") or g["policies"]["management"].get("manageAllContainers")
               for g in groups):
            return True
        verdicts = set()
        for group in groups:
            for statement in (group["policies"].get("s3") or {}).get("Statement", []):
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                resources = [re.sub(r"^arn:aws:s3:::", "urn:sgws:s3:::", r) for r in resources]
                if any(fnmatch.fnmatchcase(action, a) for a in actions) and \
                        any(fnmatch.fnmatchcase(resource, r) for r in resources):
                    verdicts.add(statement["Effect"])
        return "Deny" not in verdicts and "Allow" in verdicts

    # -- S3 lifecycle (path style) ---------------------------------------------------------
    @staticmethod
    def _s3_error(status, code, message):
        return status, "<Error><Code>%s</Code><Message>%s</Message></Error>" % (code, message), {}

    def _s3(self, req, path, method):
        bucket = path.strip("/").split("/", 1)[0]
        if "lifecycle" not in req["query"]:
            return self._s3_error(501, "NotImplemented", "test double")
        credential = re.search(r"Credential=([^/]+)/", (req.get("user") or ["", ""])[-1] or "")
        if not credential or credential.group(1) not in self.keys:
            return self._s3_error(403, "InvalidAccessKeyId", "The access key ID you provided does not exist")
        if not any(c["name"] == bucket for c in self.containers):
            return self._s3_error(404, "NoSuchBucket", "no bucket")
        action = "s3:GetLifecycleConfiguration" if method == "GET" else "s3:PutLifecycleConfiguration"
        if not self.allowed(self.keys[credential.group(1)]["owner"], action, "urn:sgws:s3:::%s" % bucket):
            return self._s3_error(403, "AccessDenied", "Access Denied")
        if method == "GET":
            if bucket not in self.lifecycle:
                return self._s3_error(404, "NoSuchLifecycleConfiguration", "The lifecycle configuration does not exist")
            return 200, self.lifecycle[bucket], {}
        if method == "PUT":
            problem = check_content_md5(req)
            if problem:
                return self._s3_error(400, *problem)
            problem = check_lifecycle(req["body"] or "")
            if problem:
                return self._s3_error(400, "MalformedXML", problem)
            self.lifecycle[bucket] = req["body"]
            return 200, "", {}
        if method == "DELETE":
            self.lifecycle.pop(bucket, None)
            return 204, "", {}
        return self._s3_error(405, "MethodNotAllowed", method)

    def start(self):
        self.server.start()
        return self

    def stop(self):
        self.server.stop()
