"""Flows in the cluster (side effects): create or update the Prefect work pool of type kubernetes, apply the
flow-run ServiceAccount and its rights (and the in-cluster worker) to the namespace, and write the kubeconfig
a worker on this machine uses. The objects themselves are rendered by epdbench.manifests.workpool."""
from __future__ import annotations

import copy
import os
import uuid
from pathlib import Path

import yaml

from epdbench.manifests.workpool import PoolSettings, base_job_template
from epdbench.specs.models import KubernetesTargetSpec
from epdbench.tasks.k8s.api import KubeApi, KubeApiError, connect, kubeconfig_paths


def pool_template(settings: PoolSettings) -> dict:
    from prefect_kubernetes.worker import KubernetesWorker

    return base_job_template(KubernetesWorker.get_default_base_job_template(), settings)


def flow_run_job(template: dict, job_variables: dict | None = None, flow_run_name: str = "sample-run") -> dict:
    """The Job the worker would create for one flow run of a deployment with `job_variables`, computed
    offline with prefect-kubernetes's own configuration class (variable defaults, the deployment's values,
    env merged, placeholders filled, then its prepare_for_flow_run). The worker additionally resolves
    block and Prefect-variable references, which this template does not use."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.utilities.templating import apply_values
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    config = copy.deepcopy(template["job_configuration"])
    values = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    job_variables = dict(job_variables or {})
    env = {**(values.get("env") or {}), **(job_variables.pop("env", None) or {})}
    values.update(job_variables)
    values["env"] = env
    populated = apply_values(template=config, values=values)
    cfg = KubernetesWorkerJobConfiguration(**populated)
    cfg.prepare_for_flow_run(FlowRun(id=uuid.UUID(int=0), flow_id=uuid.UUID(int=1), name=flow_run_name))
    return cfg.job_manifest


def ensure_work_pool(name: str, template: dict) -> str:
    """Create the pool, or give an existing one this template; returns "created" or "updated". Refuses a
    pool of that name with another worker type."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type="kubernetes", base_job_template=template,
                                                   description="epdbench flow runs as Kubernetes Jobs"))
            return "created"
        if pool.type != "kubernetes":
            raise RuntimeError(f"work pool {name} exists with type {pool.type}, not kubernetes: "
                               "delete it or choose another --work-pool name")
        client.update_work_pool(name, WorkPoolUpdate(base_job_template=template))
        return "updated"


def apply_pool_objects(target: KubernetesTargetSpec, objects: list[dict]) -> KubeApi:
    """Server-side apply, in order; a refusal names the object (the rights to create RBAC objects are
    usually a cluster admin's). Rights in another namespace (the DCGM exporter's) are skipped, and that said,
    when that namespace does not exist."""
    api = connect(target)
    for obj in objects:
        elsewhere = obj["metadata"].get("namespace") not in (None, target.namespace)
        try:
            api.apply(obj)
        except KubeApiError as e:
            if elsewhere and e.status == 404:
                print(f"{obj['kind']} {obj['metadata']['name']} not applied: no namespace "
                      f"{obj['metadata']['namespace']} ({e}); flow runs will have no GPU telemetry", flush=True)
                continue
            hint = (" (creating Roles and ClusterRoles needs a cluster admin; apply the files of "
                    "'epdbench manifests --work-pool' once with such rights)") if e.status == 403 else ""
            raise RuntimeError(f"{obj['kind']} {obj['metadata']['name']}: {e}{hint}") from None
    return api


def delete_pool_objects(api: KubeApi, objects: list[dict]) -> list[str]:
    """Delete the given objects (the in-cluster worker at `epdbench down`); returns those that could not be."""
    left = []
    for obj in reversed(objects):
        try:
            api.delete(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
        except KubeApiError as e:
            left.append(f"{obj['kind']} {obj['metadata']['name']}: {e}")
    return left


FILE_KEYS = ("certificate-authority", "client-certificate", "client-key", "tokenFile")


def _absolute_paths(doc: dict, base: Path) -> dict:
    """Relative file references in a kubeconfig are relative to its own folder; the copy lives elsewhere."""
    for section, inner in (("clusters", "cluster"), ("users", "user")):
        for entry in doc.get(section) or []:
            fields = entry.get(inner) or {}
            for key in FILE_KEYS:
                if fields.get(key) and not Path(fields[key]).is_absolute():
                    fields[key] = str((base / fields[key]).resolve())
    return doc


def worker_kubeconfig(target: KubernetesTargetSpec, path: Path) -> Path:
    """A kubeconfig for a worker on this machine: the user's, with the chosen context made current (the
    worker always uses the current one). Owner-only: it holds credentials."""
    paths = [p for p in kubeconfig_paths(target) if p.exists()]
    if not paths:
        raise RuntimeError(f"kubeconfig {os.pathsep.join(map(str, kubeconfig_paths(target)))} not found: "
                           "give --kubeconfig or set KUBECONFIG")
    merged: dict = {}
    for p in paths:   # first file wins for each named entry, as kubectl merges KUBECONFIG
        doc = _absolute_paths(yaml.safe_load(p.read_text()) or {}, p.parent)
        for section in ("clusters", "users", "contexts"):
            have = {e["name"] for e in merged.get(section, [])}
            merged.setdefault(section, []).extend(e for e in doc.get(section) or [] if e["name"] not in have)
        merged.setdefault("current-context", doc.get("current-context"))
    context = target.context or merged.get("current-context")
    if context not in {c["name"] for c in merged["contexts"]}:
        raise RuntimeError(f"kubeconfig context {context!r} not found in {', '.join(map(str, paths))}")
    merged.update({"apiVersion": "v1", "kind": "Config", "current-context": context})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(merged, fh, sort_keys=False)
    return path

