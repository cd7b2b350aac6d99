"""The Kubernetes API calls the pipeline makes, on plain dicts, through the official `kubernetes` client:
server-side apply, list/get/delete by label, pod logs, events, nodes, port-forward, and GETs through the
proxy subresources (`call`). Nothing else."""
from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from epdbench.specs.models import KubernetesTargetSpec

T = TypeVar("T")
# A server-side apply whose object does not fit the schema (an undeclared field) is answered with HTTP 500 and this
# message by kube-apiserver 1.37: a fault of the object, not of the server, so never asked again.
TYPED_PATCH_REFUSED = "failed to create typed patch object"
FIELD_MANAGER = "epdbench"
# How long one call waits out an API server that does not answer: a restart or an upgrade of the control plane
# takes seconds to tens of seconds (the cluster tier's restart of kube-apiserver: about 5 s).
PATIENCE_S = 60
REQUEST_TIMEOUT_S = 30


class KubeApiError(RuntimeError):
    """An API call that failed; `status` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status

    @property
    def transient(self) -> bool:
        """An API server that was unreachable, overloaded or failing: worth asking again (a restart, an upgrade, a
        leader change of a managed control plane all answer so for seconds)."""
        if TYPED_PATCH_REFUSED in str(self):
            return False
        return self.status == 0 or self.status == 429 or self.status >= 500


def patiently(call: Callable[[], T], deadline: float, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep, first_s: float = 0.5, most_s: float = 5.0) -> T:
    """`call()`, asked again after a transient KubeApiError (backing off from `first_s` to `most_s`) until the
    clock passes `deadline`; then, or on any other error, the error is raised."""
    delay = first_s
    while True:
        try:
            return call()
        except KubeApiError as e:
            if not e.transient or clock() >= deadline:
                raise
        sleep(min(delay, max(0.0, deadline - clock())))
        delay = min(2 * delay, most_s)


@dataclass(frozen=True)
class Kind:
    group_version: str   # v1, apps/v1, rbac.authorization.k8s.io/v1
    plural: str
    namespaced: bool = True

    def collection_path(self, namespace: str) -> str:
        root = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        return f"{root}/namespaces/{namespace}/{self.plural}" if self.namespaced else f"{root}/{self.plural}"


KINDS: dict[str, Kind] = {
    "ServiceAccount": Kind("v1", "serviceaccounts"),
    "Service": Kind("v1", "services"),
    "EndpointSlice": Kind("discovery.k8s.io/v1", "endpointslices"),
    "Pod": Kind("v1", "pods"),
    "Event": Kind("v1", "events"),
    "PersistentVolumeClaim": Kind("v1", "persistentvolumeclaims"),
    "Namespace": Kind("v1", "namespaces", namespaced=False),
    "Node": Kind("v1", "nodes", namespaced=False),
    "StatefulSet": Kind("apps/v1", "statefulsets"),
    "Deployment": Kind("apps/v1", "deployments"),
    "ReplicaSet": Kind("apps/v1", "replicasets"),
    "ControllerRevision": Kind("apps/v1", "controllerrevisions"),
    "Role": Kind("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": Kind("rbac.authorization.k8s.io/v1", "rolebindings"),
    "ClusterRole": Kind("rbac.authorization.k8s.io/v1", "clusterroles", namespaced=False),
    "ClusterRoleBinding": Kind("rbac.authorization.k8s.io/v1", "clusterrolebindings", namespaced=False),
    "ConfigMap": Kind("v1", "configmaps"),
    "Job": Kind("batch/v1", "jobs"),
}
# Owners first, so their dependents are garbage-collected rather than recreated.
LABELLED_KINDS = ["Job", "Deployment", "StatefulSet", "ReplicaSet", "ControllerRevision", "Service", "RoleBinding",
                  "Role", "ServiceAccount", "ConfigMap", "Pod"]


def kubeconfig_paths(target: KubernetesTargetSpec) -> list[Path]:
    raw = target.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p]


def load_configuration(target: KubernetesTargetSpec) -> k8s_client.Configuration:
    """Credentials from the kubeconfig (context as given), or in-cluster ones when no kubeconfig exists."""
    cfg = k8s_client.Configuration()
    paths = kubeconfig_paths(target)
    try:
        if any(p.exists() for p in paths):
            k8s_config.load_kube_config(os.pathsep.join(map(str, paths)), context=target.context,
                                        client_configuration=cfg, persist_config=False)
        elif not target.kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=cfg)
        else:
            raise KubeApiError(0, f"kubeconfig {os.pathsep.join(map(str, paths))} not found: give --kubeconfig "
                                  "or set KUBECONFIG")
    except ConfigException as e:
        raise KubeApiError(0, f"kubeconfig: {str(e).splitlines()[0]}") from None
    return cfg


def connect(target: KubernetesTargetSpec) -> "KubeApi":
    return KubeApi(k8s_client.ApiClient(load_configuration(target)), target.namespace)


class KubeApi:
    def __init__(self, api_client: k8s_client.ApiClient, namespace: str):
        self.client = api_client
        self.namespace = namespace

    @property
    def host(self) -> str:
        return self.client.configuration.host

    def auth_headers(self) -> dict[str, str]:
        """Credential headers of this client (bearer token, refreshed by the client's hook if any)."""
        return {s["key"]: s["value"] for s in self.client.configuration.auth_settings().values()
                if s["in"] == "header"}

    def call(self, method: str, path: str, query: list[tuple[str, str]] | None = None, body=None,
             content_type: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S) -> bytes:
        headers = {"Accept": "application/json, */*"}
        if content_type:
            headers["Content-Type"] = content_type
        method, url, headers, body, _ = self.client.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            resp = self.client.call_api(method, url, headers, body, _request_timeout=timeout_s)
            data = resp.read()
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeApiError(0, f"cannot reach the API server at {self.host}: {str(e).splitlines()[0]}") from None
        if not 200 <= resp.status < 300:
            raise KubeApiError(resp.status, f"{method} {path}: HTTP {resp.status} {status_message(data)}")
        return data

    def call_json(self, method: str, path: str, **kw) -> dict:
        return json.loads(self.call(method, path, **kw) or b"{}")

    def path_of(self, kind: str, name: str | None = None, namespace: str | None = None) -> str:
        """The object's (or its kind's collection's) path, in this client's namespace unless another is named."""
        path = KINDS[kind].collection_path(namespace or self.namespace)
        return path if name is None else f"{path}/{name}"

    def server_version(self) -> str:
        info = self.call_json("GET", "/version")
        found = re.match(r"^v?(\d+)\.(\d+)", info.get("gitVersion", ""))
        if found:
            return f"{found.group(1)}.{found.group(2)}"
        minor = re.sub(r"\D", "", info["minor"])   # "31+" on some managed clusters
        return f"{info['major']}.{minor}"

    def apply(self, obj: dict) -> dict:
        """Server-side apply: creates or updates the object, taking over fields from other managers."""
        meta = obj["metadata"]
        return self.call_json("PATCH", self.path_of(obj["kind"], meta["name"], meta.get("namespace")), body=obj,
                              query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                              content_type="application/apply-patch+yaml")

    def list_versioned(self, kind: str, label_selector: str | None = None) -> tuple[list[dict], str | None]:
        """The objects and the list's resourceVersion (where a watch of what changes next starts)."""
        query = [("labelSelector", label_selector)] if label_selector else []
        body = self.call_json("GET", self.path_of(kind), query=query)
        return body.get("items") or [], (body.get("metadata") or {}).get("resourceVersion") or None

    def wait_for_change(self, kind: str, label_selector: str | None, resource_version: str, timeout_s: float) -> bool:
        """Watch the objects of `kind` matching the selector from `resource_version`, for at most `timeout_s`: True as
        soon as one is added, changed or deleted, False when the watch ends without a change. KubeApiError where the
        server refuses the watch (410 when the version is too old) or answers with anything but watch events."""
        seconds = max(1, math.ceil(timeout_s))      # the server's end of the watch, in whole seconds
        query = [("watch", "true"), ("resourceVersion", resource_version), ("timeoutSeconds", str(seconds)),
                 ("allowWatchBookmarks", "false")] + ([("labelSelector", label_selector)] if label_selector else [])
        method, url, headers, body, _ = self.client.param_serialize(
            "GET", self.path_of(kind), query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        try:
            resp = self.client.call_api(method, url, headers, body,
                                        _request_timeout=(REQUEST_TIMEOUT_S, max(0.05, timeout_s)))
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeApiError(0, f"cannot reach the API server at {self.host}: {str(e).splitlines()[0]}") from None
        try:
            if not 200 <= resp.status < 300:
                raise KubeApiError(resp.status, f"watch {kind}: HTTP {resp.status} {status_message(resp.read())}")
            try:
                line = resp.response.readline()
            except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
                return False          # `timeout_s` passed without a change
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise KubeApiError(0, f"watch {kind}: {str(e).splitlines()[0]}") from None
            if not line:
                return False
            try:
                event = json.loads(line)
            except ValueError:
                raise KubeApiError(0, f"watch {kind}: the answer is not a watch event") from None
            kind_of = event.get("type") if isinstance(event, dict) else None
            if kind_of == "ERROR":
                obj = event.get("object") or {}
                raise KubeApiError(int(obj.get("code") or 0), f"watch {kind}: {obj.get('message', 'error')}")
            if kind_of not in ("ADDED", "MODIFIED", "DELETED"):
                raise KubeApiError(0, f"watch {kind}: the answer is not a watch event")
            return True
        finally:
            resp.response.close()

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        return self.call_json("GET", self.path_of(kind, name, namespace))

    def list(self, kind: str, label_selector: str | None = None, namespace: str | None = None) -> list[dict]:
        query = [("labelSelector", label_selector)] if label_selector else []
        return self.call_json("GET", self.path_of(kind, namespace=namespace), query=query).get("items") or []

    def delete(self, kind: str, name: str, namespace: str | None = None) -> bool:
        """Delete one object (dependents in the background); False when it was already gone."""
        try:
            self.call("DELETE", self.path_of(kind, name, namespace), content_type="application/json",
                      body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"})
        except KubeApiError as e:
            if e.status == 404:
                return False
            raise
        return True

    def pod_log(self, pod: str, container: str, previous: bool = False, since: str | None = None,
                timestamps: bool = False) -> str:
        query = [("container", container)]
        query += [("previous", "true")] if previous else []
        query += [("sinceTime", since)] if since else []
        query += [("timestamps", "true")] if timestamps else []
        return self.call("GET", f"{self.path_of('Pod', pod)}/log", query=query).decode("utf-8", "replace")

    def port_forward(self, pod: str, port: int):
        """A kubernetes.stream PortForward whose .socket(port) reaches the pod's port, opened on an ApiClient of its
        own: the client library's portforward() swaps the `call_api` of the ApiClient it is given for the call's
        length, so any call made meanwhile on a shared client from another thread goes over the websocket, and two
        port-forwards opened at once leave the swap in place for good (every later call then fails with "Missing
        required parameter `ports`": the real control plane's interrupt test saw the teardown fail so)."""
        from kubernetes.stream import portforward
        core = k8s_client.CoreV1Api(k8s_client.ApiClient(self.client.configuration))
        return portforward(core.connect_get_namespaced_pod_portforward, pod, self.namespace, ports=str(port))


def status_message(data: bytes) -> str:
    """The one-line message of a Kubernetes Status body (or the start of any other body)."""
    try:
        body = json.loads(data)
        return str(body.get("message") or body.get("reason") or "").splitlines()[0]
    except (ValueError, AttributeError, IndexError):
        return data[:200].decode("utf-8", "replace").replace("\n", " ")
