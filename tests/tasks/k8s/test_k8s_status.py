"""tasks/k8s/status.py: readiness and failure diagnosis from pod/event dicts, placement, node capacity,
timestamped log slicing — pure functions, no cluster."""
from __future__ import annotations

from fractions import Fraction

import pytest

from epdbench.tasks.k8s import status


def pod(name: str, role: str = "prefill", phase: str = "Pending", ready: bool = False, conditions: list | None = None,
        containers: list | None = None, uid: str | None = None, **meta) -> dict:
    conds = conditions if conditions is not None else [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": {"name": name, "uid": uid or f"uid-{name}",
                         "labels": {"epdbench/role": role, "epdbench/run": "r1"}, **meta},
            "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "engine", "resources": {
                "limits": {"nvidia.com/gpu": 2, "rdma/rdma_shared_device_a": "2"}}}]},
            "status": {"phase": phase, "conditions": conds, "containerStatuses": containers or [],
                       "podIP": "10.0.0.7"}}


def waiting(reason: str, message: str = "", restarts: int = 0, last_exit: int | None = None) -> dict:
    s = {"name": "engine", "restartCount": restarts, "state": {"waiting": {"reason": reason, "message": message}}}
    if last_exit is not None:
        s["lastState"] = {"terminated": {"exitCode": last_exit, "reason": "Error"}}
    return s


def event(name: str, reason: str, message: str, stamp: str = "2026-01-01T00:00:01Z", kind: str = "Pod",
          type_: str = "Warning", uid: str | None = None) -> dict:
    return {"type": type_, "reason": reason, "message": message, "lastTimestamp": stamp,
            "involvedObject": {"kind": kind, "name": name, "uid": uid or f"uid-{name}"}}


UNSCHEDULABLE = pod("pd-rdma-prefill-0", conditions=[
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
     "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}])


def test_ready_means_ready_condition_and_not_terminating():
    assert status.is_ready(pod("a", ready=True, phase="Running"))
    assert not status.is_ready(pod("a", ready=False, phase="Running"))
    assert not status.is_ready(pod("a", ready=True, phase="Running", deletionTimestamp="2026-01-01T00:00:00Z"))


def test_unschedulable_pods_are_named_with_the_schedulers_reason():
    line = status.diagnose([UNSCHEDULABLE, pod("pd-rdma-decode-0", conditions=UNSCHEDULABLE["status"]["conditions"],
                                               role="decode")], [], [], expected=2, waited_s=1800)
    assert line == ("not ready after 1800 s: pd-rdma-prefill-0, pd-rdma-decode-0: Unschedulable: 0/1 nodes are "
                    "available: 1 Insufficient nvidia.com/gpu.")


def test_image_pull_back_off_names_the_image_problem():
    p = pod("x-server-0", role="server", containers=[waiting("ImagePullBackOff", 'Back-off pulling image "vllm/x"')])
    assert status.pod_problem(p, []) == 'ImagePullBackOff: Back-off pulling image "vllm/x"'


def test_a_failing_container_beside_the_main_one_is_named_with_what_it_is():
    p = pod("x-router-abc", role="router", containers=[
        {"name": "router", "ready": True, "state": {"running": {}}},
        {**waiting("ImagePullBackOff", 'Back-off pulling image "ghcr.io/epdbench/epdbench:0.1.0"'), "name": "traces"}])
    p["spec"]["containers"] = [{"name": "router"}, {"name": "traces"}]
    problem = ('container traces: ImagePullBackOff: Back-off pulling image "ghcr.io/epdbench/epdbench:0.1.0" (the '
               "trace collector: set target.kubernetes.runner_image, or tracing: {enabled: false})")
    assert status.pod_problem(p, []) == problem
    assert status.diagnose([p], [], [], expected=1, waited_s=600) == f"not ready after 600 s: x-router-abc: {problem}"


def test_crash_loop_says_restarts_and_last_exit_code():
    p = pod("x-decode-0", phase="Running",
            containers=[waiting("CrashLoopBackOff", "back-off 40s", restarts=4, last_exit=1)])
    assert status.pod_problem(p, []) == "CrashLoopBackOff (restarts 4, last exit 1 Error): back-off 40s"


def test_running_but_not_ready_quotes_the_latest_probe_failure():
    p = pod("x-server-0", phase="Running", containers=[{"name": "engine", "state": {"running": {}}}])
    events = [event("x-server-0", "Unhealthy", "Readiness probe failed: old", "2026-01-01T00:00:01Z"),
              event("x-server-0", "Unhealthy", "Readiness probe failed: connection refused", "2026-01-01T00:00:09Z")]
    assert status.pod_problem(p, events) == ("running but not ready (Unhealthy: Readiness probe failed: "
                                             "connection refused)")


def test_container_creating_is_not_a_problem_but_a_mount_warning_is():
    p = pod("x-server-0", containers=[waiting("ContainerCreating")])
    events = [event("x-server-0", "FailedMount", 'persistentvolumeclaim "hf-cache" not found')]
    assert status.pod_problem(p, events) == 'Pending (FailedMount: persistentvolumeclaim "hf-cache" not found)'


def test_missing_pods_are_explained_by_their_workloads_warnings():
    sts = {"metadata": {"name": "pd-tcp-prefill", "uid": "u1"}}
    events = [event("pd-tcp-prefill", "FailedCreate", 'pods "pd-tcp-prefill-0" is forbidden: violates PodSecurity',
                    kind="StatefulSet")]
    line = status.diagnose([], [sts], events, expected=3, waited_s=5)
    assert "3 of 3 pods not created" in line and "FailedCreate" in line and "PodSecurity" in line


def test_diagnosis_is_one_line_and_bounded():
    p = pod("x-server-0", containers=[waiting("ErrImagePull", "line one\nline two " + "x" * 1000)])
    line = status.diagnose([p], [], [], expected=1, waited_s=3)
    assert "\n" not in line and len(line) < 400


def test_readiness_line_counts_ready_pods_and_lists_the_others():
    pods = [pod("a-server-0", role="server", phase="Running", ready=True), pod("a-router-x", role="router")]
    assert status.readiness_line(pods, expected=3) == "1/3 pods ready (waiting: a-router-x Pending)"


def test_process_names_match_the_sim_target():
    assert status.process_name(pod("pd-tcp-decode-1", role="decode")) == "decode-1"
    assert status.process_name(pod("pd-tcp-router-5d8f9c7b6-x0000", role="router")) == "router"


def test_placement_records_node_ip_gpus_rdma_and_restarts():
    p = pod("pd-rdma-prefill-0", phase="Running", ready=True,
            containers=[{"name": "engine", "restartCount": 2, "state": {"running": {}}}])
    assert status.placement([p], "nvidia.com/gpu", "rdma/rdma_shared_device_a") == [
        {"pod": "pd-rdma-prefill-0", "process": "prefill-0", "node": "gpu-node-1", "pod_ip": "10.0.0.7",
         "gpus": 2, "rdma": 2, "restarts": 2}]


def node(gpus: str, rdma: str | None = None, name: str = "gpu-node-1", cpu: str = "192", memory: str = "2Ti") -> dict:
    allocatable = {"nvidia.com/gpu": gpus, "cpu": cpu, "memory": memory} | ({"rdma/ib": rdma} if rdma else {})
    return {"metadata": {"name": name}, "status": {"allocatable": allocatable}}


@pytest.mark.parametrize("nodes,gpus,rdma,needle", [
    ([], 6, 0, "no node matches"),
    ([node("4")], 6, 0, "needs 6 nvidia.com/gpu on one node, node gpu-node-1 has 4 allocatable"),
    ([node("8")], 6, 4, "needs 4 rdma/ib, node gpu-node-1 has 0 allocatable"),
    ([node("8", "1k")], 6, 4, None),
    ([node("2", name="small"), node("8")], 6, 0, None),
])
def test_node_capacity(nodes, gpus, rdma, needle):
    problem = status.node_capacity_problem(nodes, {"nvidia.com/gpu.present": "true"}, "nvidia.com/gpu", gpus,
                                           "rdma/ib", rdma)
    assert problem == needle if needle is None else needle in problem


GI = 2 ** 30


@pytest.mark.parametrize("nodes,cpu,memory,needle", [
    ([node("8", cpu="16")], 24, 0, "needs 24 CPU for its engine pods, node gpu-node-1 has 16 CPU allocatable: "
                                   "lower target.kubernetes.engine.cpu"),
    ([node("8", cpu="191500m")], 192, 0, "has 191.5 CPU allocatable"),
    ([node("8", memory="263921364Ki")], 0, 384 * GI, "needs 384Gi of memory for its engine pods, node gpu-node-1 "
                                                     "has 251.7Gi allocatable: lower target.kubernetes.engine.memory"),
    ([node("8", cpu="191500m", memory="263921364Ki")], 96, 192 * GI, None),
    ([node("8", cpu="8", name="big-gpu"), node("6", name="roomy")], 24, 0, None),   # a smaller node that fits
    ([node("8", cpu="8")], 0, 0, None),                                              # not set: not checked
])
def test_node_capacity_counts_engine_cpu_and_memory(nodes, cpu, memory, needle):
    problem = status.node_capacity_problem(nodes, {}, "nvidia.com/gpu", 6, "rdma/ib", 0, cpu=cpu, memory=memory)
    assert problem == needle if needle is None else needle in problem


def test_quantities_count_devices():
    assert [status.quantity_count(q) for q in ("8", 8, "1k", "2Ki")] == [8, 8, 1000, 2048]


@pytest.mark.parametrize("text,value", [("500m", Fraction(1, 2)), ("8", 8), (8, 8), ("1.5", Fraction(3, 2)),
                                        ("64Gi", 64 * GI), ("1G", 10 ** 9), ("2Ti", 2 * 1024 * GI), ("1e3", 1000),
                                        ("12E", 12 * 10 ** 18), (".5", Fraction(1, 2)), ("100n", Fraction(1, 10 ** 7)),
                                        ("263921364Ki", 263921364 * 1024)])
def test_quantities_parse_exactly(text, value):
    assert status.quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1 Gi", "1gi", "1.5.2", "5mi"])
def test_a_malformed_quantity_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        status.quantity(text)


def test_other_runs_are_reported_for_cleanup():
    objs = [pod("a", role="server"), {"metadata": {"name": "b", "labels": {"epdbench/run": "old-run"}}}]
    assert status.other_runs(objs, "r1") == ["old-run"]
    assert status.other_runs(objs, "old-run") == ["r1"]


def test_related_events_match_by_uid_not_by_name():
    current = pod("x-server-0", uid="new")
    events = [event("x-server-0", "Failed", "old pod", uid="old"), event("x-server-0", "Failed", "this pod", uid="new")]
    assert [e["message"] for e in status.related_events(events, [current])] == ["this pod"]


def test_lines_after_drops_already_read_lines_and_their_stamps():
    log = ("2026-01-01T00:00:01.5Z first\n"
           "2026-01-01T00:00:01.123456789Z second\n"
           "2026-01-01T00:00:02Z third with  spaces\n")
    lines, newest = status.lines_after(log, None)
    assert lines == ["first", "second", "third with  spaces"] and newest == "2026-01-01T00:00:02Z"
    lines, newest = status.lines_after(log, "2026-01-01T00:00:01.2Z")
    assert lines == ["first", "third with  spaces"]
    assert status.lines_after(log, newest) == ([], newest)
    assert status.since_time("2026-01-01T00:00:01.123456789Z") == "2026-01-01T00:00:01Z"
