"""The fake API server's objects: the resource table, the object store (one lock, resourceVersions, events),
label selectors, timestamps and Status error bodies."""
from __future__ import annotations

import datetime as dt
import itertools
import threading
import uuid

from aiohttp import web

RESOURCES = {  # plural -> (apiVersion, kind, namespaced)
    "namespaces": ("v1", "Namespace", False), "nodes": ("v1", "Node", False),
    "pods": ("v1", "Pod", True), "services": ("v1", "Service", True), "events": ("v1", "Event", True),
    "serviceaccounts": ("v1", "ServiceAccount", True), "persistentvolumeclaims": ("v1", "PersistentVolumeClaim", True),
    "statefulsets": ("apps/v1", "StatefulSet", True), "deployments": ("apps/v1", "Deployment", True),
    "replicasets": ("apps/v1", "ReplicaSet", True), "controllerrevisions": ("apps/v1", "ControllerRevision", True),
    "roles": ("rbac.authorization.k8s.io/v1", "Role", True),
    "rolebindings": ("rbac.authorization.k8s.io/v1", "RoleBinding", True),
    "clusterroles": ("rbac.authorization.k8s.io/v1", "ClusterRole", False),
    "clusterrolebindings": ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", False),
    "configmaps": ("v1", "ConfigMap", True), "jobs": ("batch/v1", "Job", True),
    "endpointslices": ("discovery.k8s.io/v1", "EndpointSlice", True),
}
PLURAL_OF = {kind: plural for plural, (_, kind, _) in RESOURCES.items()}

Key = tuple[str, str, str]  # (plural, namespace or "", name)


def now_stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def matches(labels: dict, selector: str | None) -> bool:
    """Equality-based label selectors: a=b, a!=b, a (exists), comma-separated."""
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


def status_body(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


class ObjectStore:
    """Objects by (plural, namespace, name); callers that change them hold `lock` (reentrant)."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict] = {}
        self.lock = threading.RLock()
        self._rv = itertools.count(1)

    def next_version(self) -> str:
        return str(next(self._rv))

    @staticmethod
    def key(obj: dict) -> Key:
        plural = PLURAL_OF[obj["kind"]]
        namespaced = RESOURCES[plural][2]
        return plural, obj["metadata"].get("namespace", "") if namespaced else "", obj["metadata"]["name"]

    def get(self, plural: str, ns: str, name: str) -> dict | None:
        return self.objects.get((plural, ns, name))

    def pop(self, key: Key) -> dict | None:
        return self.objects.pop(key, None)

    def find(self, plural: str | None = None, ns: str = "", kind: str | None = None,
             selector: str | None = None) -> list[dict]:
        """Objects of a plural and/or kind, in a namespace (any when empty), matching a label selector."""
        with self.lock:
            return [o for (p, n, _), o in self.objects.items()
                    if (plural is None or p == plural) and (not ns or n == ns) and (kind is None or o["kind"] == kind)
                    and matches(o["metadata"].get("labels", {}), selector)]

    def write(self, obj: dict, manager: str) -> dict:
        """Create or replace an object, keeping its uid and creation time; a new resourceVersion."""
        key = self.key(obj)
        old = self.objects.get(key)
        meta = obj.setdefault("metadata", {})
        if old:
            meta.update({k: old["metadata"][k] for k in ("uid", "creationTimestamp")})
            obj.setdefault("status", old.get("status", {}))
        else:
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_stamp())
        meta["resourceVersion"] = self.next_version()
        meta["managedFields"] = [{"manager": manager, "operation": "Apply"}]
        self.objects[key] = obj
        return obj

    def event(self, obj: dict, reason: str, message: str, kind: str = "Warning") -> None:
        ns = obj["metadata"]["namespace"]
        self.write({"apiVersion": "v1", "kind": "Event", "type": kind, "reason": reason, "message": message,
                    "lastTimestamp": now_stamp(),
                    "metadata": {"name": f"{obj['metadata']['name']}.{uuid.uuid4().hex[:12]}", "namespace": ns},
                    "involvedObject": {"kind": obj["kind"], "name": obj["metadata"]["name"], "namespace": ns,
                                       "uid": obj["metadata"]["uid"]}}, "kubelet")
