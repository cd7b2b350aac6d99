"""Flows in the cluster (pure): the Prefect work pool of type kubernetes that runs epdbench's deployments
as Jobs, the flow-run ServiceAccount with the least rights the flow needs, and the optional in-cluster
worker. tasks/k8s/workpool.py creates the pool, applies these objects and computes the Job a flow run gets;
`epdbench manifests --work-pool` shows them.

The base job template starts from the installed prefect-kubernetes worker's own default (so its variables
and placeholders match the worker that fills them) and sets: the epdbench image, the namespace, the flow
ServiceAccount, where the pod reaches Prefect and MLflow, a non-root read-only pod, and a results volume.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import yaml

from epdbench.manifests.render import TEMPLATE_DIR
from epdbench.templating import make_env

WORK_POOL = "epdbench-kubernetes"
FLOW_ACCOUNT = "epdbench-flow"
WORKER_ACCOUNT = "epdbench-worker"
RESULTS_MOUNT = "/results"
LABELS = {"app.kubernetes.io/managed-by": "epdbench", "epdbench/component": "flows"}
FINISHED_JOB_TTL_S = 86400          # a finished flow-run Job (and its log) stays a day
RUN_AS = 10001                      # the image's non-root user (Dockerfile)


@dataclass(frozen=True)
class PoolSettings:
    image: str                      # the epdbench runner image (Dockerfile, target runner)
    namespace: str
    prefect_api: str                # as pods reach it, e.g. http://10.0.0.5:4200/api
    mlflow_uri: str                 # as pods reach it
    results_claim: str | None = None   # a PersistentVolumeClaim for results/; none: an emptyDir (MLflow keeps them)
    cpu: str = "2"                  # flow-run pod request and limit
    memory: str = "4Gi"
    port_forward: bool = False      # the spec's access is port-forward: grant pods/portforward
    dcgm_exporter: str | None = None   # the spec's target.kubernetes.dcgm_exporter (namespace/name:port): read it
    pool: str = WORK_POOL


def flow_env(s: PoolSettings) -> dict[str, str]:
    """What a flow-run pod needs: where Prefect and MLflow are, a writable Prefect home, telemetry off."""
    return {"PREFECT_API_URL": s.prefect_api, "MLFLOW_TRACKING_URI": s.mlflow_uri,
            "EPDBENCH_RESULTS_DIR": RESULTS_MOUNT, "PREFECT_HOME": "/tmp/prefect", "MPLCONFIGDIR": "/tmp/mpl",
            "PREFECT_SERVER_EPHEMERAL_ENABLED": "false", "DO_NOT_TRACK": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
            "PREFECT_LOGGING_LEVEL": "INFO"}


def base_job_template(upstream: dict, s: PoolSettings) -> dict:
    """The pool's base job template, from the worker's default (`KubernetesWorker.get_default_base_job_template()`)."""
    t = copy.deepcopy(upstream)
    props = t["variables"]["properties"]
    for key, value in {"image": s.image, "namespace": s.namespace, "service_account_name": FLOW_ACCOUNT,
                       "image_pull_policy": "IfNotPresent", "backoff_limit": 0, "finished_job_ttl": FINISHED_JOB_TTL_S,
                       "cpu_request": s.cpu, "cpu_limit": s.cpu, "memory_request": s.memory,
                       "memory_limit": s.memory, "env": flow_env(s)}.items():
        props[key]["default"] = value
    job = t["job_configuration"]["job_manifest"]
    pod = job["spec"]["template"]["spec"]
    for field in ("completions", "parallelism"):    # Job fields, not pod fields: a strict schema refuses them there
        if field in pod:
            job["spec"][field] = pod.pop(field)
    (container,) = pod["containers"]
    # The image's entrypoint is `epdbench`; `env` runs the worker's command (prefect flow-run execute) as given.
    container["command"] = ["env"]
    container["securityContext"] = {"privileged": False, "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    container["volumeMounts"] = [{"name": "results", "mountPath": RESULTS_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}]
    pod["securityContext"] = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                              "seccompProfile": {"type": "RuntimeDefault"}}
    results = ({"persistentVolumeClaim": {"claimName": s.results_claim}} if s.results_claim
               else {"emptyDir": {"sizeLimit": "10Gi"}})
    pod["volumes"] = [{"name": "results", **results}, {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
    return t


def render_pool_objects(s: PoolSettings, worker_in_cluster: bool = False) -> list[dict]:
    """The flow-run ServiceAccount, Role (namespace), ClusterRole (nodes, its namespace) and bindings; with a
    DCGM exporter, a Role and binding in its namespace to read it; with `worker_in_cluster`, the worker's
    ServiceAccount, Role, binding and Deployment too."""
    worker = None
    if worker_in_cluster:
        worker = {"account": WORKER_ACCOUNT,
                  "env": [{"name": k, "value": v} for k, v in {
                      "PREFECT_API_URL": s.prefect_api, "PREFECT_HOME": "/tmp/prefect", "DO_NOT_TRACK": "1",
                      "PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES": s.namespace}.items()]}
    dcgm = None
    if s.dcgm_exporter:
        namespace, _, service_port = s.dcgm_exporter.partition("/")
        dcgm = {"namespace": namespace, "service": service_port.partition(":")[0], "service_port": service_port}
    text = make_env(TEMPLATE_DIR).get_template("workpool.yaml.j2").render(
        namespace=s.namespace, flow_account=FLOW_ACCOUNT, cluster_name=f"{FLOW_ACCOUNT}-{s.namespace}",
        labels=LABELS, port_forward=s.port_forward, worker=worker, image=s.image, pool=s.pool, dcgm=dcgm)
    return [obj for obj in yaml.safe_load_all(text) if obj]

