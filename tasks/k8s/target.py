"""Provision a configuration on Kubernetes: render → validate → server-side apply → wait until every pod
is ready → reach the router → logs, /metrics and placement as evidence, GPU telemetry from the DCGM exporter
while deployed; delete everything by label, always (unless keep). Same interface as the sim target:
start(spec, config, spec_path, log_dir) -> Deployment and stop(Deployment); failures raise ProvisionError with
the cluster's reason."""
from __future__ import annotations

import atexit
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from epdbench.analysis.gpu_telemetry import TELEMETRY_FILE
from epdbench.manifests import podsecurity
from epdbench.manifests.render import (ENGINE_PORT, LABEL_ROLE, OTLP_PORT, ROUTER_PORT, ManifestError, label_value,
                                      manifest_files, object_name, render_loadgen, render_manifests, router_command,
                                      run_selector, schema_version_for, uses_rdma, validate_manifests)
from epdbench.specs.commands import kv_log_interval_s
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, KubernetesTargetSpec
from epdbench.tasks.k8s import status
from epdbench.tasks.deployment import Deployment, Process, ProvisionError, probe_until_served
from epdbench.tasks.k8s.access import open_access
from epdbench.tasks.k8s.api import LABELLED_KINDS, KubeApi, KubeApiError, connect, patiently
from epdbench.tasks.k8s.telemetry import start_telemetry
from epdbench.tasks.k8s.traces import SpanPuller
from epdbench.tasks.rundir.results import write_json

Clock = Callable[[], float]
Sleep = Callable[[float], None]
SMOKE_TIMEOUT_S = 120
FIRST_POLL_S = 0.25   # polls start fast and back off to target.poll_interval_s
APPLY_ATTEMPTS = 3
RETRY_DELAY_S = 1.0
WORKLOAD_KINDS = ["StatefulSet", "Deployment", "ReplicaSet"]


def say(msg: str) -> None:
    print(msg, flush=True)


@dataclass
class KubeProcess(Process):
    pod: str = ""
    containers: list[str] = field(default_factory=list)


@dataclass
class KubeDeployment(Deployment):
    api: KubeApi | None = None
    target: KubernetesTargetSpec | None = None
    run: str = ""
    selector: str = ""
    log_dir: Path = Path(".")
    access: object | None = None
    log_stamps: dict[str, str] = field(default_factory=dict)   # pod/container -> newest log timestamp read

    @property
    def cleanup_hint(self) -> str:
        return f"epdbench cleanup --run {self.run} --namespace {self.api.namespace}"


_ACTIVE: list[KubeDeployment] = []


def _stop_leftovers() -> None:
    for dep in list(_ACTIVE):
        stop(dep)


atexit.register(_stop_leftovers)


def start(spec: ExperimentSpec, config: ConfigurationSpec, spec_path: Path, log_dir: Path) -> KubeDeployment:
    """Apply the configuration and return once the router serves. The run label is the results folder's
    name; rendered manifests go to <results>/manifests/<config>/. Raises ProvisionError."""
    try:
        return _start(spec, config, spec_path.parent, log_dir)
    except (KubeApiError, ManifestError) as e:
        raise ProvisionError(str(e)) from None


def _start(spec: ExperimentSpec, config: ConfigurationSpec, run_dir: Path, log_dir: Path) -> KubeDeployment:
    target = spec.target.kubernetes
    run = label_value(run_dir.name)
    api = connect(target)
    objects = prepare_manifests(api, spec, config, run, run_dir / "manifests" / config.name)
    preflight(api, spec, config, run, objects)
    dep = KubeDeployment(config=config.name, endpoint="", router=router_command(spec, config)[0], api=api,
                         target=target, run=run, selector=run_selector(run, config.name), log_dir=log_dir,
                         kv_log_interval_s=kv_log_interval_s(config))
    _ACTIVE.append(dep)
    try:
        apply_objects(api, objects)
        say(f"[{config.name}] applied {len(objects)} objects labelled {dep.selector} in namespace {api.namespace}")
        pods = wait_ready(api, dep.selector, expected_pods(config), target, config.name)
        serve(dep, spec, config, pods)
        dep.telemetry = start_telemetry(api, target, log_dir / TELEMETRY_FILE, config.name, pods, say)
        return dep
    except BaseException as e:
        if isinstance(e, Exception):
            write_pod_logs(dep)
        stop(dep)
        raise


def schema_version(api: KubeApi, spec: ExperimentSpec) -> str:
    """The schema version manifests are validated against: the spec's, else the cluster's (bundled range)."""
    return spec.target.kubernetes.version or schema_version_for(api.server_version())


def prepare_manifests(api: KubeApi, spec: ExperimentSpec, config: ConfigurationSpec, run: str,
                      out_dir: Path) -> list[dict]:
    """Render, validate against the cluster's schema version, and keep a copy of what will be applied."""
    version = schema_version(api, spec)
    objects = render_manifests(spec, config, run)
    validate_manifests(objects, version)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in manifest_files(objects).items():
        (out_dir / name).write_text(text)
    return objects


def readable(call: Callable):
    """The call's result, or None when these credentials may not read it (403): preflight is best effort."""
    try:
        return call()
    except KubeApiError as e:
        if e.status == 403:
            return None
        raise


def preflight(api: KubeApi, spec: ExperimentSpec, config: ConfigurationSpec, run: str,
              objects: list[dict] | None = None) -> None:
    """Refuse, before applying anything, what cannot work: no namespace, another run's leftovers on the
    node, a missing model-cache claim, a GPU node too small for the configuration. Warn about pods the
    namespace's Pod Security level would reject (`objects`: the rendered configuration, else rendered here)."""
    target = spec.target.kubernetes
    try:
        namespace = readable(lambda: api.get("Namespace", api.namespace))
    except KubeApiError as e:
        if e.status == 404:
            raise ProvisionError(f"namespace {api.namespace} does not exist: create it, or pass --namespace") from None
        raise
    check_leftovers(api, run)
    if target.model_cache.kind == "pvc":
        check_claim(api, target.model_cache.claim_name)
    check_node(api, target, config)
    if namespace is not None:
        objects = render_manifests(spec, config, run) if objects is None else objects
        labels = (namespace.get("metadata") or {}).get("labels")
        warn_pod_security(api.namespace, labels, spec, config, run, objects)


def warn_pod_security(namespace: str, labels: dict | None, spec: ExperimentSpec, config: ConfigurationSpec,
                      run: str, objects: list[dict]) -> None:
    """Say which pods, the in-cluster load generator's included, the namespace's Pod Security labels would
    reject or warn about; never raises (the cluster may exempt them)."""
    if spec.target.kubernetes.loadgen.run_in == "cluster":
        objects = objects + render_loadgen(spec, config, run, spec_yaml="")   # its Jobs' pods, as applied later
    for line in podsecurity.namespace_warnings(namespace, labels, objects):
        say(line)


def check_leftovers(api: KubeApi, run: str) -> None:
    workloads = readable(lambda: api.list("StatefulSet", "epdbench/run") + api.list("Deployment", "epdbench/run"))
    others = status.other_runs(workloads or [], run)
    if others:
        raise ProvisionError(f"namespace {api.namespace} holds objects of epdbench run(s) {', '.join(others)} "
                             f"(one run at a time on the GPU node): epdbench cleanup --run {others[0]} "
                             f"--namespace {api.namespace}")


def check_claim(api: KubeApi, claim: str) -> None:
    try:
        readable(lambda: api.get("PersistentVolumeClaim", claim))
    except KubeApiError as e:
        if e.status == 404:
            raise ProvisionError(f"PersistentVolumeClaim {claim} (model cache) not found in namespace "
                                 f"{api.namespace}: create it, or set target.kubernetes.model_cache") from None
        raise


def check_node(api: KubeApi, target: KubernetesTargetSpec, config: ConfigurationSpec) -> None:
    selector = ",".join(f"{k}={v}" for k, v in target.node.selector.items())
    nodes = readable(lambda: api.list("Node", selector))
    if nodes is None:
        return
    rdma = sum(r.replicas * r.rdma_interfaces for r in config.roles if uses_rdma(config, r.role))
    engines = sum(r.replicas for r in config.roles)   # not the router: without a node selector it may run elsewhere
    cpu = status.quantity(target.engine.cpu) * engines if target.engine.cpu else 0
    memory = status.quantity(target.engine.memory) * engines if target.engine.memory else 0
    problem = status.node_capacity_problem(nodes, target.node.selector, target.node.gpu_resource, config.gpus,
                                           target.node.rdma_resource, rdma, cpu=cpu, memory=memory)
    if problem:
        raise ProvisionError(f"GPU node: configuration {config.name} {problem}")


def apply_objects(api: KubeApi, objects: list[dict], sleep: Sleep = time.sleep) -> None:
    """Server-side apply in order; retried on transient API errors (apply is idempotent)."""
    for obj in objects:
        for attempt in range(1, APPLY_ATTEMPTS + 1):
            try:
                api.apply(obj)
                break
            except KubeApiError as e:
                if attempt == APPLY_ATTEMPTS or not e.transient:
                    raise
                sleep(RETRY_DELAY_S * attempt)


def expected_pods(config: ConfigurationSpec) -> int:
    return sum(r.replicas for r in config.roles) + 1   # + the router


def pause_until_change(api: KubeApi, selector: str, version: str | None, seconds: float, sleep: Sleep) -> None:
    """Until a pod matching the selector changes (a watch from the list's version) or `seconds` pass; a server that
    will not watch (or a list without a version) is waited on by sleeping the time out."""
    if version is None or seconds <= 0:
        sleep(seconds)
        return
    began = time.monotonic()
    try:
        api.wait_for_change("Pod", selector, version, seconds)
    except KubeApiError:
        sleep(max(0.0, seconds - (time.monotonic() - began)))


def wait_ready(api: KubeApi, selector: str, expected: int, target: KubernetesTargetSpec, config: str,
               clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> list[dict]:
    """Wait until all the pods are ready: list them, then watch from that list's version until one changes (at
    most the poll delay, backing off to target.poll_interval_s), and list again; on timeout, raise with the
    cluster's reason for each pod."""
    started = clock()
    deadline = started + target.ready_timeout_s
    pods: list[dict] = []
    last_line, delay_s = "", FIRST_POLL_S
    while True:
        version = None
        try:
            listed, version = api.list_versioned("Pod", selector)
            pods = status.live_pods(listed)
        except KubeApiError as e:
            if not e.transient:
                raise
            say(f"[{config}] API server hiccup while waiting, polling on: {e}")
        if len(pods) == expected and all(map(status.is_ready, pods)):
            return pods
        line = status.readiness_line(pods, expected)
        if line != last_line:
            say(f"[{config}] {line} ({clock() - started:.0f}/{target.ready_timeout_s:.0f} s)")
            last_line = line
        if clock() >= deadline:
            workloads = [w for kind in WORKLOAD_KINDS for w in api.list(kind, selector)]
            events = status.related_events(api.list("Event"), pods + workloads)
            raise ProvisionError(status.diagnose(pods, workloads, events, expected, clock() - started))
        pause_until_change(api, selector, version, min(delay_s, max(0.0, deadline - clock())), sleep)
        delay_s = min(2 * delay_s, target.poll_interval_s)


def serve(dep: KubeDeployment, spec: ExperimentSpec, config: ConfigurationSpec, pods: list[dict]) -> None:
    """Open the runner's way in, describe every pod as a process, write placement, probe the router."""
    target = spec.target.kubernetes
    dep.access = open_access(dep.api, target.access)
    dep.processes = [process_for(dep, config, pod) for pod in sorted(pods, key=pod_order)]
    dep.endpoint = next(p.url for p in dep.processes if p.role == "router")
    dep.sync_logs = lambda: sync_logs(dep)
    if spec.tracing.enabled:   # the collector beside the router (manifests/templates/router.yaml.j2)
        router = next(p for p in dep.processes if p.role == "router")
        dep.pull_spans = SpanPuller(dep.access.router_url(object_name(config, "router"), router.pod, OTLP_PORT),
                                    {p.pod: p.name for p in dep.processes}, say)
    write_json(dep.log_dir / "placement.json",
               status.placement(pods, target.node.gpu_resource, target.node.rdma_resource))
    smoke_chat(dep.endpoint, spec.model.name, time.monotonic() + SMOKE_TIMEOUT_S)


def pod_order(pod: dict) -> tuple[bool, str]:
    return pod["metadata"]["labels"].get(LABEL_ROLE) == "router", status.process_name(pod)


def process_for(dep: KubeDeployment, config: ConfigurationSpec, pod: dict) -> KubeProcess:
    name, pod_name = status.process_name(pod), status.name_of(pod)
    role = pod["metadata"]["labels"][LABEL_ROLE]
    containers = [c["name"] for c in pod["spec"]["containers"]]
    if role == "router":
        url = dep.access.router_url(object_name(config, "router"), pod_name, ROUTER_PORT)
        return KubeProcess(name, role, url, dep.log_dir / f"{name}.log", pod=pod_name, containers=containers)
    url = dep.access.pod_url(pod_name, ENGINE_PORT)
    return KubeProcess(name, role, url, dep.log_dir / f"{name}.log", metrics_url=url + "/metrics", pod=pod_name,
                       containers=containers)


def smoke_chat(url: str, model: str, deadline: float) -> None:
    """One tiny chat completion through the router (every router, EPD proxy included, serves chat)."""
    probe_until_served(url + "/v1/chat/completions",
                       {"model": model, "max_tokens": 2,
                        "messages": [{"role": "user", "content": "epdbench readiness probe"}]},
                       {}, deadline, interval_s=1.0)


def log_name(process: str, container: str, containers: list[str], previous: bool = False) -> str:
    """prefill-0.log for a pod's first container (as on the sim target), prefill-0.<container>.log for others."""
    base = process if container == containers[0] else f"{process}.{container}"
    return f"{base}.previous.log" if previous else f"{base}.log"


def sync_logs(dep: KubeDeployment) -> None:
    """Append every container's new log lines to its local file (files only grow, so byte offsets
    taken by the evidence collector stay valid); a pod that cannot be read is skipped this time."""
    for proc in dep.processes:
        for container in proc.containers:
            key = f"{proc.pod}/{container}"
            last = dep.log_stamps.get(key)
            since = status.since_time(last) if last else None
            try:
                text = dep.api.pod_log(proc.pod, container, since=since, timestamps=True)
            except KubeApiError:
                continue
            lines, dep.log_stamps[key] = status.lines_after(text, last)
            if lines:
                with open(dep.log_dir / log_name(proc.name, container, proc.containers), "a", encoding="utf-8") as fh:
                    fh.write("\n".join(lines) + "\n")


def write_pod_logs(dep: KubeDeployment) -> None:
    """Failure evidence: every container's whole log, and the previous instance's after a restart."""
    try:
        pods = dep.api.list("Pod", dep.selector)
    except KubeApiError:
        return
    dep.log_dir.mkdir(parents=True, exist_ok=True)
    for pod in pods:
        containers = [c["name"] for c in pod["spec"]["containers"]]
        for container in containers:
            for previous in (False, True):
                try:
                    text = dep.api.pod_log(status.name_of(pod), container, previous=previous)
                except KubeApiError:
                    continue
                (dep.log_dir / log_name(status.process_name(pod), container, containers, previous)).write_text(text)


def write_cluster_snapshot(dep: KubeDeployment) -> None:
    """pods.json (phase, conditions, container states, node) and events.json of this configuration."""
    pods = dep.api.list("Pod", dep.selector)
    workloads = [w for kind in WORKLOAD_KINDS for w in dep.api.list(kind, dep.selector)]
    write_json(dep.log_dir / "pods.json", [{"name": status.name_of(p), "node": p["spec"].get("nodeName"),
                                            "status": p.get("status", {})} for p in pods])
    write_json(dep.log_dir / "events.json", status.related_events(dep.api.list("Event"), pods + workloads))


def labelled_objects(api: KubeApi, selector: str) -> list[tuple[str, str]]:
    return [(kind, status.name_of(o)) for kind in LABELLED_KINDS for o in api.list(kind, selector)]


def delete_labelled(api: KubeApi, selector: str, target: KubernetesTargetSpec, clock: Clock = time.monotonic,
                    sleep: Sleep = time.sleep) -> list[str]:
    """Delete every object matching the selector and wait until all are gone (bounded by the teardown
    timeout, an unreachable API server included); returns what is still there."""
    deadline = clock() + target.teardown_timeout_s
    delay_s = FIRST_POLL_S
    while True:
        # An API server that does not answer is asked again until the deadline (it restarts; the objects stay).
        remaining = patiently(lambda: labelled_objects(api, selector), deadline, clock, sleep)
        if not remaining or clock() >= deadline:
            return [f"{kind}/{name}" for kind, name in remaining]
        for kind, name in remaining:
            patiently(lambda k=kind, n=name: api.delete(k, n), deadline, clock, sleep)
        sleep(min(delay_s, max(0.0, deadline - clock())))
        delay_s = min(2 * delay_s, target.poll_interval_s)


def stop(dep: KubeDeployment) -> None:
    """Snapshot pods and events as evidence, then delete every labelled object of the configuration and
    wait until gone; with keep, leave it up and say how to remove it. Never raises."""
    if dep in _ACTIVE:
        _ACTIVE.remove(dep)
    if dep.telemetry is not None:
        dep.telemetry.stop()
    if dep.access is not None:
        try:
            dep.access.close()
        except Exception:  # noqa: BLE001 - teardown must go on
            pass
    try:
        write_cluster_snapshot(dep)
    except (KubeApiError, OSError):
        pass
    if dep.target.keep:
        say(f"[{dep.config}] kept running (--keep); remove it with: {dep.cleanup_hint}")
        return
    try:
        remaining = delete_labelled(dep.api, dep.selector, dep.target)
    except KubeApiError as e:
        remaining = [f"(not checked: {e})"]
    if remaining:
        say(f"[{dep.config}] left after teardown: {', '.join(remaining)}; remove with: {dep.cleanup_hint}")
    else:
        say(f"[{dep.config}] deleted every object labelled {dep.selector}")


def cleanup(target: KubernetesTargetSpec, run: str) -> tuple[int, list[str]]:
    """Delete the leftovers of a run (all its configurations); returns (objects found, objects left)."""
    api = connect(target)
    selector = run_selector(run)
    found = len(labelled_objects(api, selector))
    return found, delete_labelled(api, selector, target)
