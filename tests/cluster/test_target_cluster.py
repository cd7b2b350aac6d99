"""tasks/k8s/target.py against the real control plane, each test in a namespace of its own: port-forward access,
log sync, traces, server-side apply taking over, the API's errors, failure diagnosis with the cluster's own
reasons (the scheduler's, the kubelet's events), the interrupt during readiness, keep and cleanup, the bounded
teardown (a finalizer holds a pod), preflight, Pod Security, credentials. Moved here from the fake API server;
what stays there says why (tests/tasks/k8s/test_k8s_target.py)."""
from __future__ import annotations

import json
import time

import pytest
from prefect.exceptions import TerminationSignal

from epdbench.manifests.render import render_manifests, run_selector
from epdbench.otlp import format_traceparent, new_span_id, new_trace_id
from epdbench.tasks.deployment import ProvisionError
from epdbench.tasks.k8s import target as k8s_target
from epdbench.tasks.k8s.api import KubeApiError, connect
from tests.cluster.controlplane import NODE
from tests.cluster.space import RUN_ID, SELECTOR
from tests.tasks.k8s.test_k8s_target import chat, fetch
from tests.k8s.fake_kubelet import CRASH_LOG, CRASH_LOOP, IMAGE_PULL, NOT_READY, READY, RUN

pytestmark = pytest.mark.cluster      # the tier runs apart (-m cluster), in its network namespace
def traced_spans(dep, model: str, expected: int, player) -> list[tuple[str, str]]:
    trace_id, client = new_trace_id(), new_span_id()
    chat(dep.endpoint, model, {"traceparent": format_traceparent(trace_id, client)})
    spans: list[dict] = []
    player.wait(lambda: spans.extend(s for s in dep.pull_spans() if s["trace_id"] == trace_id) or
                len(spans) >= expected, 10)
    return sorted((s["name"], s["resource"]["epdbench.pod"]) for s in spans)


def test_port_forward_serves_syncs_logs_and_stop_waits_until_everything_is_gone(space):
    spec, dep = space.start("aggregated")
    try:
        assert dep.router == "vllm-router" and [p.name for p in dep.processes] == ["server-0", "router"]
        assert dep.endpoint.startswith("http://127.0.0.1:") and "/api/" not in dep.endpoint
        assert chat(dep.endpoint, spec.model.name)["choices"]
        assert "vllm:" in fetch(dep.processes[0].metrics_url)
        ev = space.work / "results" / RUN_ID / "evidence" / "aggregated"
        placement = json.loads((ev / "placement.json").read_text())
        assert {p["process"]: (p["node"], p["gpus"]) for p in placement}["server-0"] == (NODE, 1)
        assert len(list((space.work / "results" / RUN_ID / "manifests" / "aggregated").glob("*.yaml"))) == 5
        log = dep.processes[0].log_path
        time.sleep(0.5)   # the player ships the engine's output to its CRI log every 0.1 s, stamped then
        dep.sync_logs()
        size = log.stat().st_size
        time.sleep(1.1)   # past the second the API's sinceTime is cut to
        dep.sync_logs()
        assert log.stat().st_size == size
        chat(dep.endpoint, spec.model.name)
        time.sleep(0.5)
        dep.sync_logs()
        text = log.read_text()
        assert text.count("epdbench simulator") == 1 and text.count("Received request") == 3   # probe + 2 chats
        assert not text.startswith("20")   # the runtime's timestamps are stripped: lines as the engine wrote them
        assert traced_spans(dep, spec.model.name, 2, space.player) == [("llm_request", "server-0"),
                                                                       ("router.request", "router")]
    finally:
        k8s_target.stop(dep)
    space.assert_nothing_left()


def test_port_forward_reaches_every_pod_and_the_collector_of_pd(space):
    spec, dep = space.start("pd-tcp")
    try:
        assert chat(dep.endpoint, spec.model.name)["usage"]["completion_tokens"] >= 1
        prefill = next(p for p in dep.processes if p.name == "prefill-0")
        assert "vllm:" in fetch(prefill.metrics_url)
        assert traced_spans(dep, spec.model.name, 4, space.player) == [
            ("kv_transfer", "decode-0"), ("llm_request", "decode-0"), ("llm_request", "prefill-0"),
            ("router.request", "router")]
    finally:
        k8s_target.stop(dep)
    space.assert_nothing_left()


def router_service(space) -> dict:
    spec = space.spec()
    return next(o for o in render_manifests(spec, spec.configuration("aggregated"), RUN_ID)
                if o["kind"] == "Service" and o["metadata"]["labels"].get("epdbench/role") == "router")


def test_server_side_apply_takes_over_fields_another_manager_set(space):
    """kubectl set a field of the router's Service to another value first; the forced apply takes it over."""
    theirs = router_service(space)
    theirs["metadata"]["labels"] = {**theirs["metadata"]["labels"], "epdbench/role": "someone-else"}
    space.put(theirs, manager="kubectl")
    spec, dep = space.start("aggregated")
    try:
        _, svc = space.cp.request("GET", f"/api/v1/namespaces/{space.name}/services/aggregated-router")
        assert svc["metadata"]["labels"]["epdbench/role"] == "router"
        owners = [m["manager"] for m in svc["metadata"]["managedFields"]
                  if '"f:epdbench/role"' in json.dumps(m.get("fieldsV1", {}))]
        assert owners == ["epdbench"], svc["metadata"]["managedFields"]
    finally:
        k8s_target.stop(dep)
    space.assert_nothing_left()


def test_a_same_named_service_of_another_owner_with_other_ports_fails_the_apply_in_one_line(space):
    """A server-side apply merges: a port another manager owns stays, and two unnamed ports are invalid. The real
    API server refuses with 422 (the fake replaced the object whole and went on)."""
    theirs = router_service(space)
    theirs["metadata"]["labels"] = {"owner": "someone"}
    theirs["spec"] = {"ports": [{"port": 80}]}
    space.put(theirs, manager="kubectl")
    with pytest.raises(ProvisionError) as exc:
        space.start("aggregated")
    assert "HTTP 422" in str(exc.value) and "spec.ports[0].name: Required value" in str(exc.value)
    assert "\n" not in str(exc.value)
    space.assert_nothing_left()


def test_api_errors_keep_their_status(space):
    api = connect(space.spec().target.kubernetes)
    with pytest.raises(KubeApiError) as missing:
        api.get("Service", "nope")
    assert missing.value.status == 404 and 'services "nope" not found' in str(missing.value)
    assert api.delete("Service", "nope") is False
    space.put({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa", "labels": {"a": "b"}}})
    with pytest.raises(KubeApiError) as conflict:
        api.call("PATCH", api.path_of("ServiceAccount", "sa"), query=[("fieldManager", "other")],
                 body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa", "labels": {"a": "c"}}},
                 content_type="application/apply-patch+yaml")
    assert conflict.value.status == 409 and 'conflict with "kubectl"' in str(conflict.value)


def prefill_script(script: str):
    """Prefill pods follow the script; every other pod gets ready without a process behind it."""
    return lambda pod: script if pod["metadata"]["labels"].get("epdbench/role") == "prefill" else READY


@pytest.fixture
def gpus_left(control_plane):
    """A pod outside the run holds all but one of the node's GPUs (in its own namespace): the scheduler can place
    one of pd-tcp's two engines, not both."""
    cp = control_plane
    ns = cp.ensure_namespace("gpu-holder")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder", "namespace": ns},
           "spec": {"containers": [{"name": "c", "image": "holder", "resources": {
               "limits": {"nvidia.com/gpu": "7"}, "requests": {"nvidia.com/gpu": "7"}}}]}}
    status, body = cp.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert status == 201, body
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not cp.request("GET", f"/api/v1/namespaces/{ns}/pods/holder")[1]["spec"].get(
            "nodeName"):
        time.sleep(0.1)
    yield
    cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/holder?gracePeriodSeconds=0")


@pytest.mark.parametrize("script,needles,evidence", [
    (CRASH_LOOP, ["pd-tcp-prefill-0", "CrashLoopBackOff", "restarts 3, last exit 1 Error"], "BackOff"),
    (IMAGE_PULL, ["pd-tcp-prefill-0", "ImagePullBackOff", 'Back-off pulling image "vllm/vllm-openai:v0.33.0"'],
     "Failed"),
    (NOT_READY, ["pd-tcp-prefill-0", "running but not ready", "Readiness probe failed"], "Unhealthy"),
])
def test_a_configuration_that_never_gets_ready_fails_with_the_reason_and_leaves_nothing(space, script, needles,
                                                                                       evidence):
    space.player.behaviour = prefill_script(script)
    with pytest.raises(ProvisionError) as exc:
        space.start("pd-tcp", ready_timeout_s=2.0)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("not ready after")
    assert all(n in msg for n in needles), msg
    ev_dir = space.work / "results" / RUN_ID / "evidence" / "pd-tcp"
    assert evidence in {e["reason"] for e in json.loads((ev_dir / "events.json").read_text())}
    pods = {p["name"]: p["status"] for p in json.loads((ev_dir / "pods.json").read_text())}
    assert pods["pd-tcp-decode-0"]["phase"] == "Running"
    if script == CRASH_LOOP:     # read through pods/log?previous=true, served by kwok from the player's file
        assert (ev_dir / "prefill-0.previous.log").read_text() == CRASH_LOG
    space.assert_nothing_left()


def test_an_engine_the_scheduler_cannot_place_fails_with_the_schedulers_reason(space, gpus_left):
    space.player.behaviour = lambda pod: RUN
    with pytest.raises(ProvisionError) as exc:
        space.start("pd-tcp", ready_timeout_s=3.0)
    msg = str(exc.value)
    assert "\n" not in msg and "Unschedulable" in msg and "Insufficient nvidia.com/gpu" in msg, msg
    assert "pd-tcp-prefill-0" in msg or "pd-tcp-decode-0" in msg
    events = json.loads((space.work / "results" / RUN_ID / "evidence" / "pd-tcp" / "events.json").read_text())
    assert "FailedScheduling" in {e["reason"] for e in events}
    space.assert_nothing_left()


@pytest.mark.parametrize("signal", [KeyboardInterrupt(), TerminationSignal(signal=15)], ids=["ctrl-c", "cancel"])
def test_interrupt_during_the_readiness_wait_still_deletes_everything(space, monkeypatch, signal):
    """Ctrl-C raises KeyboardInterrupt; a Prefect cancellation (SIGTERM) raises TerminationSignal."""
    space.player.behaviour = prefill_script(NOT_READY)
    pauses = []
    pause = k8s_target.pause_until_change

    def interrupted(*args) -> None:          # the signal arrives during the fourth wait for a change
        pauses.append(args)
        if len(pauses) > 3:
            raise signal
        pause(*args)

    monkeypatch.setattr(k8s_target, "pause_until_change", interrupted)
    with pytest.raises(type(signal)):
        space.start("pd-tcp")
    space.assert_nothing_left()


def test_keep_leaves_the_deployment_up_and_cleanup_removes_it(space, capsys):
    spec, dep = space.start("aggregated", keep=True)
    k8s_target.stop(dep)
    assert "statefulsets/aggregated-server" in space.labelled(SELECTOR)
    assert f"epdbench cleanup --run run-1 --namespace {space.name}" in capsys.readouterr().out
    found, left = k8s_target.cleanup(spec.target.kubernetes, RUN_ID)
    assert found >= 7 and left == []
    space.assert_nothing_left()


def test_teardown_is_bounded_and_names_what_is_left(space, capsys):
    """A finalizer holds one pod in Terminating (as a stuck volume detach or a node gone dark would): the teardown
    ends at its timeout and names it."""
    spec = space.spec(teardown_timeout_s=1)
    api = connect(spec.target.kubernetes)
    k8s_target.apply_objects(api, render_manifests(spec, spec.configuration("aggregated"), RUN_ID))
    pod_path = f"/api/v1/namespaces/{space.name}/pods/aggregated-server-0"
    assert space.player.wait(lambda: space.cp.request("GET", pod_path)[0] == 200, 30)
    hold = {"metadata": {"finalizers": ["epdbench.test/hold"]}}
    assert space.cp.request("PATCH", pod_path, hold, content_type="application/merge-patch+json")[0] == 200
    dep = k8s_target.KubeDeployment(config="aggregated", endpoint="", router="", api=api, target=spec.target.kubernetes,
                                    run=RUN_ID, selector=run_selector(RUN_ID, "aggregated"), log_dir=space.work / "ev")
    try:
        began = time.monotonic()
        k8s_target.stop(dep)
        assert time.monotonic() - began < 6
        out = capsys.readouterr().out
        assert "left after teardown: " in out and "Pod/aggregated-server-0" in out
        assert f"epdbench cleanup --run run-1 --namespace {space.name}" in out
    finally:
        space.cp.request("PATCH", pod_path, {"metadata": {"finalizers": None}},
                         content_type="application/merge-patch+json")
    assert space.player.wait(lambda: space.labelled(SELECTOR) == [], 30), space.labelled(SELECTOR)


def old_statefulset() -> dict:
    labels = {"epdbench/run": "old-run", "app": "old"}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "old", "labels": labels},
            "spec": {"replicas": 0, "serviceName": "old", "selector": {"matchLabels": {"app": "old"}},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c",
                                                                                          "image": "x"}]}}}}


@pytest.mark.parametrize("case", ["namespace", "leftovers", "claim"])
def test_preflight_refuses_before_applying_anything(space, case):
    kube = {}
    if case == "namespace":
        kube, needle = {"namespace": "absent"}, "namespace absent does not exist"
    elif case == "leftovers":
        space.put(old_statefulset())
        needle = f"epdbench cleanup --run old-run --namespace {space.name}"
    else:
        kube, needle = {"model_cache": {"kind": "pvc"}}, "PersistentVolumeClaim hf-cache (model cache) not found"
    with pytest.raises(ProvisionError) as exc:
        space.start("aggregated", **kube)
    assert needle in str(exc.value)
    assert space.labelled(SELECTOR) == []


@pytest.fixture
def node_allocatable(control_plane):
    """Set some of the GPU node's allocatable (its status, as a device plugin reports it); put back after."""
    cp = control_plane
    path = f"/api/v1/nodes/{NODE}/status"
    before = cp.request("GET", f"/api/v1/nodes/{NODE}")[1]["status"]["allocatable"]

    def change(**resources):
        status, body = cp.request("PATCH", path, {"status": {"allocatable": {**before, **resources}}},
                                  content_type="application/merge-patch+json")
        assert status == 200, body
    yield change
    cp.request("PATCH", path, {"status": {"allocatable": before}}, content_type="application/merge-patch+json")


@pytest.mark.parametrize("resources,config,needle", [
    ({"nvidia.com/gpu": "2"}, "epd", f"configuration epd needs 3 nvidia.com/gpu on one node, node {NODE} has 2"),
    ({"rdma/rdma_shared_device_a": "0"}, "pd-rdma", "needs 2 rdma/rdma_shared_device_a"),
])
def test_a_node_too_small_is_refused_before_applying(space, node_allocatable, resources, config, needle):
    node_allocatable(**resources)
    with pytest.raises(ProvisionError) as exc:
        space.start(config)
    assert needle in str(exc.value)
    assert space.labelled(SELECTOR) == []


@pytest.mark.parametrize("engine,needle", [
    ({"cpu": "100"}, f"configuration epd needs 300 CPU for its engine pods, node {NODE} has 192 CPU allocatable"),
    ({"memory": "1Ti"}, f"needs 3072Gi of memory for its engine pods, node {NODE} has 2048Gi allocatable"),
])
def test_engine_cpu_or_memory_beyond_the_node_is_refused_before_applying(space, engine, needle):
    with pytest.raises(ProvisionError) as exc:
        space.start("epd", engine=engine)
    assert needle in str(exc.value) and "\n" not in str(exc.value)
    assert space.labelled(SELECTOR) == []


def label_namespace(space, **levels) -> None:
    status, body = space.cp.request("PATCH", f"/api/v1/namespaces/{space.name}", {"metadata": {"labels": {
        f"pod-security.kubernetes.io/{mode}": level for mode, level in levels.items()}}},
        content_type="application/merge-patch+json")
    assert status == 200, body


def test_preflight_warns_about_pods_an_enforced_pod_security_level_would_reject(space, capsys):
    label_namespace(space, enforce="baseline")
    spec = space.spec()
    k8s_target.preflight(connect(spec.target.kubernetes), spec, spec.configuration("pd-rdma"), RUN_ID)
    assert capsys.readouterr().out.splitlines() == [
        f'warning: namespace {space.name} enforces Pod Security "baseline": the pods of StatefulSet pd-rdma-{role} '
        'would be rejected: container engine adds capability IPC_LOCK; label the namespace '
        'pod-security.kubernetes.io/enforce=privileged or ask the cluster admin for an exemption'
        for role in ("prefill", "decode")]


def test_pods_an_enforced_pod_security_level_rejects_fail_the_start_with_the_admissions_reason(space, capsys):
    """The warning is the preflight's guess; the real API server's Pod Security admission then refuses the pods
    (the fake let them run), and the readiness wait ends with the controller's FailedCreate reason."""
    label_namespace(space, enforce="restricted")
    with pytest.raises(ProvisionError) as exc:
        space.start("aggregated", ready_timeout_s=3.0)
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert [line.split(": the pods of ")[1].split(" would")[0] for line in warnings] == [
        "StatefulSet aggregated-server", "Deployment aggregated-router"]
    assert "violates PodSecurity" in str(exc.value), str(exc.value)
    space.assert_nothing_left()


def test_bad_credentials_and_unreachable_servers_fail_in_one_line(space):
    kubeconfig = space.kubeconfig
    kubeconfig.write_text(kubeconfig.read_text().replace("token: ", "token: wrong-"))
    spec = space.spec()
    with pytest.raises(ProvisionError, match="HTTP 401"):
        k8s_target.start(spec, spec.configuration("aggregated"), space.work / "spec.yaml", space.work / "ev")
    kubeconfig.write_text(kubeconfig.read_text().replace(f":{space.cp.api_port}", ":9"))
    with pytest.raises(ProvisionError, match="cannot reach the API server"):
        k8s_target.start(spec, spec.configuration("aggregated"), space.work / "spec.yaml", space.work / "ev")


def test_the_readiness_wait_watches_pods_from_the_lists_version(space):
    """The real server's watch: a change after the list's version answers at once; none, by the time asked."""
    api = connect(space.spec().target.kubernetes)
    pods, version = api.list_versioned("Pod", "app=watched")
    assert pods == [] and version
    space.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated", "labels": {"app": "x"}}})
    began = time.monotonic()
    assert api.wait_for_change("Pod", "app=watched", version, 1.0) is False       # nothing of ours changed
    assert 0.9 < time.monotonic() - began < 3
    space.put({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "watched", "labels": {"app": "watched"}},
               "spec": {"containers": [{"name": "c", "image": "x"}]}})
    began = time.monotonic()
    assert api.wait_for_change("Pod", "app=watched", version, 10.0) is True
    assert time.monotonic() - began < 2
    space.cp.request("DELETE", f"/api/v1/namespaces/{space.name}/pods/watched?gracePeriodSeconds=0")
