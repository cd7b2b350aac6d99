"""What the cluster says, in words (pure): pod readiness, why a configuration is not ready, where its
pods run, whether the GPU node can hold it. Functions of API dicts only; no client, no I/O."""
from __future__ import annotations

import re
from collections import defaultdict
from fractions import Fraction

from epdbench.manifests.render import LABEL_RUN, LABEL_ROLE

BENIGN_WAITING = {"ContainerCreating", "PodInitializing"}
MESSAGE_MAX = 240


def short(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= MESSAGE_MAX else line[:MESSAGE_MAX - 1] + "…"


def name_of(obj: dict) -> str:
    return obj["metadata"]["name"]


def is_terminating(obj: dict) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def condition(pod: dict, kind: str) -> dict | None:
    return next((c for c in pod.get("status", {}).get("conditions") or [] if c.get("type") == kind), None)


def is_ready(pod: dict) -> bool:
    ready = condition(pod, "Ready")
    return ready is not None and ready.get("status") == "True" and not is_terminating(pod)


def live_pods(pods: list[dict]) -> list[dict]:
    return [p for p in pods if not is_terminating(p)]


def process_name(pod: dict) -> str:
    """prefill-0, decode-1, router: the pod's role and StatefulSet ordinal (same names as the sim target)."""
    role = pod["metadata"].get("labels", {}).get(LABEL_ROLE, "pod")
    if role == "router":
        return "router"
    return f"{role}-{name_of(pod).rsplit('-', 1)[-1]}"


def container_problem(status: dict) -> str | None:
    state = status.get("state") or {}
    waiting, terminated = state.get("waiting"), state.get("terminated")
    if waiting and waiting.get("reason") not in BENIGN_WAITING:
        text = waiting.get("reason", "Waiting")
        last = (status.get("lastState") or {}).get("terminated")
        if last:
            exit_text = f"last exit {last.get('exitCode')} {last.get('reason', '')}".rstrip()
            text += f" (restarts {status.get('restartCount', 0)}, {exit_text})"
        if waiting.get("message"):
            text += f": {waiting['message']}"
        return text
    if terminated:
        return f"container exited {terminated.get('exitCode')} ({terminated.get('reason', 'Error')})"
    return None


def latest_warning_among(events: list[dict]) -> str | None:
    warnings = [e for e in events if e.get("type") == "Warning"]
    if not warnings:
        return None
    last = max(warnings, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return f"{last.get('reason', 'Warning')}: {last.get('message', '')}"


def latest_warning(events: list[dict], name: str) -> str | None:
    return latest_warning_among([e for e in events if e.get("involvedObject", {}).get("name") == name])


# What a container beside a pod's main one is, for the one line of a pod that failed because of it
# (short: the line is cut at MESSAGE_MAX)
SIDECAR_HINTS = {"traces": "the trace collector: set target.kubernetes.runner_image, or tracing: {enabled: false}"}


def pod_problem(pod: dict, events: list[dict]) -> str:
    """Why one pod is not ready, in the cluster's own words; the container named when the pod has several (and what
    it is, for epdbench's own)."""
    first = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name")
    for status in pod.get("status", {}).get("containerStatuses") or []:
        problem = container_problem(status)
        if problem:
            name = status.get("name")
            if name and name != first:
                hint = SIDECAR_HINTS.get(name)
                return f"container {name}: {problem}" + (f" ({hint})" if hint else "")
            return problem
    scheduled = condition(pod, "PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        return f"{scheduled.get('reason', 'Unschedulable')}: {scheduled.get('message', '')}"
    warning = latest_warning(events, name_of(pod))
    phase = pod.get("status", {}).get("phase", "Unknown")
    if phase == "Running":
        return f"running but not ready ({warning or 'readiness probe /health not passing yet'})"
    return f"{phase}" + (f" ({warning})" if warning else "")


def missing_pods_problem(workloads: list[dict], events: list[dict]) -> str | None:
    """Why pods were not even created (admission, quota): the latest warning of the workloads or their ReplicaSets."""
    names = [name_of(w) for w in workloads]
    owners = ("StatefulSet", "Deployment", "ReplicaSet")
    related = [e for e in events if e.get("involvedObject", {}).get("kind") in owners
               and any(e["involvedObject"].get("name", "").startswith(n) for n in names)]
    return latest_warning_among(related)


def readiness_line(pods: list[dict], expected: int) -> str:
    pods = live_pods(pods)
    waiting = [f"{name_of(p)} {p.get('status', {}).get('phase', '?')}" for p in pods if not is_ready(p)]
    line = f"{sum(map(is_ready, pods))}/{expected} pods ready"
    return line + (f" (waiting: {', '.join(waiting)})" if waiting else "")


def diagnose(pods: list[dict], workloads: list[dict], events: list[dict], expected: int, waited_s: float) -> str:
    """One line: which pods are not ready and why, grouped by reason (unschedulable GPUs, image pull …)."""
    pods = live_pods(pods)
    by_reason: dict[str, list[str]] = defaultdict(list)
    for pod in pods:
        if not is_ready(pod):
            by_reason[short(pod_problem(pod, events))].append(name_of(pod))
    parts = [f"{', '.join(names)}: {reason}" for reason, names in by_reason.items()]
    if len(pods) < expected:
        why = missing_pods_problem(workloads, events)
        parts.append(f"{expected - len(pods)} of {expected} pods not created" + (f" ({short(why)})" if why else ""))
    return f"not ready after {waited_s:.0f} s: " + "; ".join(parts or ["pods ready but the check timed out"])


def placement(pods: list[dict], gpu_resource: str, rdma_resource: str | None) -> list[dict]:
    """Where each pod runs and what it was given: node, pod IP, GPUs and RDMA interfaces requested."""
    out = []
    for pod in sorted(pods, key=name_of):
        limits: dict = {}
        for c in pod["spec"].get("containers", []):
            limits.update((c.get("resources") or {}).get("limits") or {})
        out.append({"pod": name_of(pod), "process": process_name(pod), "node": pod["spec"].get("nodeName"),
                    "pod_ip": pod.get("status", {}).get("podIP"), "gpus": quantity_count(limits.get(gpu_resource, 0)),
                    "rdma": quantity_count(limits.get(rdma_resource, 0)) if rdma_resource else 0,
                    "restarts": sum(s.get("restartCount", 0)
                                    for s in pod.get("status", {}).get("containerStatuses") or [])})
    return out


QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"            # number
                      r"(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")   # exponent or suffix
SUFFIX = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60,
          "n": Fraction(1, 10 ** 9), "u": Fraction(1, 10 ** 6), "m": Fraction(1, 1000), None: 1,
          "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18}


def quantity(value) -> Fraction:
    """The exact value of a Kubernetes quantity ("500m", "8", 8, "64Gi", "1G", "1.5", "1e3"); ValueError if none."""
    match = QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number, exponent, suffix = match.groups()
    return Fraction(number) * (Fraction(10) ** int(exponent) if exponent else SUFFIX[suffix])


def quantity_count(value) -> int:
    """A device count from a Kubernetes quantity ("8", 8, "1k")."""
    return int(quantity(value))


def cpu_text(cores: Fraction) -> str:
    return f"{float(cores):g} CPU"


def memory_text(size: Fraction) -> str:
    return f"{float(size) / 2 ** 30:.4g}Gi"


def node_capacity_problem(nodes: list[dict], selector: dict[str, str], gpu_resource: str, gpus: int,
                          rdma_resource: str | None, rdma: int, cpu: Fraction = Fraction(0),
                          memory: Fraction = Fraction(0)) -> str | None:
    """Why no node matching the selector can hold the configuration (allocatable, not free), or None. cpu
    (cores) and memory (bytes): the engine pods' requests together; 0 when not set."""
    if not nodes:
        return f"no node matches the GPU node selector {selector}"

    def allocatable(node: dict, resource: str | None) -> Fraction:
        found = (node.get("status", {}).get("allocatable") or {}).get(resource) if resource else None
        return quantity(found) if found is not None else Fraction(0)

    def problem(node: dict) -> str | None:
        name = name_of(node)
        if allocatable(node, gpu_resource) < gpus:
            return (f"needs {gpus} {gpu_resource} on one node, node {name} has "
                    f"{int(allocatable(node, gpu_resource))} allocatable")
        if rdma and allocatable(node, rdma_resource) < rdma:
            return (f"needs {rdma} {rdma_resource}, node {name} has {int(allocatable(node, rdma_resource))} "
                    "allocatable: check the RDMA device plugin and target.kubernetes.node.rdma_resource")
        if cpu and allocatable(node, "cpu") < cpu:
            return (f"needs {cpu_text(cpu)} for its engine pods, node {name} has "
                    f"{cpu_text(allocatable(node, 'cpu'))} allocatable: lower target.kubernetes.engine.cpu")
        if memory and allocatable(node, "memory") < memory:
            return (f"needs {memory_text(memory)} of memory for its engine pods, node {name} has "
                    f"{memory_text(allocatable(node, 'memory'))} allocatable: lower target.kubernetes.engine.memory")
        return None

    problems = [problem(n) for n in sorted(nodes, key=lambda n: allocatable(n, gpu_resource), reverse=True)]
    return None if None in problems else problems[0]


def other_runs(objects: list[dict], run_label: str) -> list[str]:
    """Run labels of epdbench objects that belong to another run."""
    runs = {o["metadata"].get("labels", {}).get(LABEL_RUN) for o in objects}
    return sorted(r for r in runs if r and r != run_label)


def related_events(events: list[dict], objects: list[dict]) -> list[dict]:
    """Events about these very objects (by uid, so older objects of the same name do not mislead)."""
    uids = {o["metadata"].get("uid") for o in objects} - {None}
    return [e for e in events if e.get("involvedObject", {}).get("uid") in uids]


def _sortable(stamp: str) -> str:
    """RFC 3339 timestamp with the fraction padded to nanoseconds, so strings compare in time order."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return f"{head}.{frac:0<9}"


def since_time(stamp: str) -> str:
    """The API's sinceTime has whole seconds: the second the stamp falls in (lines are filtered after)."""
    return stamp[:19] + "Z"


def lines_after(timestamped_log: str, after: str | None) -> tuple[list[str], str | None]:
    """Lines of a `timestamps=true` pod log newer than `after`, without their stamps, and the newest stamp."""
    lines, newest = [], after
    for line in timestamped_log.splitlines():
        stamp, _, message = line.partition(" ")
        if after and _sortable(stamp) <= _sortable(after):
            continue
        lines.append(message)
        newest = stamp
    return lines, newest
