"""tasks/k8s/target.py against the in-process fake API server (tests/k8s/fake_apiserver.py): apply order,
readiness, access (service proxy, port-forward), log sync, failure diagnosis with evidence, preflight,
teardown on success, failure, interrupt and timeout, keep and cleanup."""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from prefect.exceptions import TerminationSignal

from epdbench.manifests.render import ManifestError, render_manifests, run_selector
from epdbench.otlp import format_traceparent, new_span_id, new_trace_id
from epdbench.tasks.k8s import target as k8s_target
from epdbench.tasks.deployment import ProvisionError
from epdbench.tasks.k8s.api import KubeApiError, connect
from tests.k8s.fake_apiserver import (CRASH_LOG, CRASH_LOOP, IMAGE_PULL, NOT_READY, READY,  # noqa: F401
                                      UNSCHEDULABLE, cluster, k8s_spec, wait_until)

RUN_ID = "run-1"
SELECTOR = f"epdbench/run={RUN_ID}"


def start_config(fake, tmp_path: Path, config: str, **kube):
    spec = k8s_spec(fake.kubeconfig(tmp_path / "kubeconfig"), **kube)
    run_dir = tmp_path / "results" / RUN_ID
    run_dir.mkdir(parents=True, exist_ok=True)
    dep = k8s_target.start(spec, spec.configuration(config), run_dir / "spec.yaml", run_dir / "evidence" / config)
    return spec, dep


def chat(url: str, model: str, headers: dict | None = None) -> dict:
    body = json.dumps({"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "hello"}]})
    req = urllib.request.Request(url + "/v1/chat/completions", data=body.encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def traced_spans(dep, model: str, expected: int) -> list[tuple[str, str]]:
    """(name, pod) of the spans the pods exported for one traced chat, taken from the collector beside the router
    through the runner's way in (dep.pull_spans), once `expected` have come (or after 10 s)."""
    trace_id, client = new_trace_id(), new_span_id()
    chat(dep.endpoint, model, {"traceparent": format_traceparent(trace_id, client)})
    spans: list[dict] = []
    wait_until(lambda: spans.extend(s for s in dep.pull_spans() if s["trace_id"] == trace_id) or
               len(spans) >= expected, timeout_s=10, interval_s=0.2)
    return sorted((s["name"], s["resource"]["epdbench.pod"]) for s in spans)


def assert_nothing_left(fake) -> None:
    assert fake.labelled(SELECTOR) == []
    assert fake.running_processes() == []


def test_service_proxy_serves_syncs_logs_and_stop_waits_until_everything_is_gone(cluster, tmp_path):
    fake = cluster(termination_s=0.6)
    spec, dep = start_config(fake, tmp_path, "aggregated")
    try:
        assert dep.router == "vllm-router" and [p.name for p in dep.processes] == ["server-0", "router"]
        assert "/services/aggregated-router:8000/proxy" in dep.endpoint
        assert chat(dep.endpoint, spec.model.name)["choices"]
        assert "vllm:" in fetch(dep.processes[0].metrics_url)
        placement = json.loads((tmp_path / "results/run-1/evidence/aggregated/placement.json").read_text())
        assert {p["process"]: (p["node"], p["gpus"]) for p in placement}["server-0"] == ("gpu-node-1", 1)
        assert len(list((tmp_path / "results/run-1/manifests/aggregated").glob("*.yaml"))) == 5
        assert_log_sync_appends_only_new_lines(dep, spec.model.name)
        # the fake's router is the simulator's proxy, which exports its span as a router that traces would
        assert traced_spans(dep, spec.model.name, 2) == [("llm_request", "server-0"), ("router.request", "router")]
    finally:
        k8s_target.stop(dep)
    assert_nothing_left(fake)


def assert_log_sync_appends_only_new_lines(dep, model: str) -> None:
    log = dep.processes[0].log_path
    dep.sync_logs()
    size = log.stat().st_size
    time.sleep(1.1)   # past the second the API's sinceTime is cut to
    dep.sync_logs()
    assert log.stat().st_size == size
    chat(dep.endpoint, model)
    dep.sync_logs()
    text = log.read_text()
    assert text.count("epdbench simulator") == 1 and text.count("Received request") == 3   # probe + 2 chats
    assert not text.startswith("20")   # runtime timestamps are stripped: lines as the engine wrote them


def test_a_tls_api_server_is_trusted_through_the_kubeconfigs_ca(cluster, tmp_path):
    fake = cluster(tls=True)
    spec, dep = start_config(fake, tmp_path, "aggregated")
    try:
        assert fake.url.startswith("https://") and chat(dep.endpoint, spec.model.name)["choices"]
    finally:
        k8s_target.stop(dep)
    assert_nothing_left(fake)


def test_port_forward_reaches_router_and_pod_metrics(cluster, tmp_path):
    fake = cluster()
    spec, dep = start_config(fake, tmp_path, "pd-tcp", access="port-forward")
    try:
        assert dep.endpoint.startswith("http://127.0.0.1:") and "/api/" not in dep.endpoint
        assert chat(dep.endpoint, spec.model.name)["usage"]["completion_tokens"] >= 1
        prefill = next(p for p in dep.processes if p.name == "prefill-0")
        assert "vllm:" in fetch(prefill.metrics_url)
        assert traced_spans(dep, spec.model.name, 4) == [
            ("kv_transfer", "decode-0"), ("llm_request", "decode-0"), ("llm_request", "prefill-0"),
            ("router.request", "router")]
    finally:
        k8s_target.stop(dep)
    assert_nothing_left(fake)


def test_objects_are_applied_in_order_with_server_side_apply_taking_over(cluster, tmp_path):
    fake = cluster()
    fake.put({"apiVersion": "v1", "kind": "Service",
              "metadata": {"name": "aggregated-router", "namespace": "epdbench", "labels": {"owner": "someone"}},
              "spec": {"ports": [{"port": 80}]}}, manager="kubectl")
    spec, dep = start_config(fake, tmp_path, "aggregated")
    try:
        patches = [path for method, path in fake.requests if method == "PATCH"]
        assert [p.split("?")[0].rsplit("/", 2)[-2] for p in patches] == [
            "serviceaccounts", "services", "statefulsets", "services", "deployments"]
        assert all("fieldManager=epdbench" in p and "force=true" in p for p in patches)
        service = fake.objects("Service", "epdbench/role=router")[0]
        assert service["metadata"]["managedFields"][0]["manager"] == "epdbench"
    finally:
        k8s_target.stop(dep)
    assert_nothing_left(fake)


def test_api_errors_keep_their_status(cluster, tmp_path):
    fake = cluster()
    spec = k8s_spec(fake.kubeconfig(tmp_path / "kubeconfig"))
    api = connect(spec.target.kubernetes)
    with pytest.raises(KubeApiError) as missing:
        api.get("Service", "nope")
    assert missing.value.status == 404 and 'services "nope" not found' in str(missing.value)
    assert api.delete("Service", "nope") is False
    fake.put({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa", "namespace": "epdbench"}})
    with pytest.raises(KubeApiError) as conflict:
        api.call("PATCH", api.path_of("ServiceAccount", "sa"), query=[("fieldManager", "other")],
                 body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa"}},
                 content_type="application/apply-patch+yaml")
    assert conflict.value.status == 409 and 'conflict with "kubectl"' in str(conflict.value)


def engine_script(script: str):
    """Prefill pods follow the script; every other pod gets ready (without a process behind it)."""
    return lambda pod: script if pod["metadata"]["labels"]["epdbench/role"] == "prefill" else READY


@pytest.mark.parametrize("script,needles,evidence", [
    (UNSCHEDULABLE, ["pd-tcp-prefill-0", "Unschedulable", "Insufficient nvidia.com/gpu"], "FailedScheduling"),
    (IMAGE_PULL, ["ImagePullBackOff", 'Back-off pulling image "vllm/vllm-openai:v0.33.0"'], "Failed"),
    (CRASH_LOOP, ["CrashLoopBackOff", "restarts 3, last exit 1 Error"], "BackOff"),
    (NOT_READY, ["running but not ready", "Readiness probe failed"], "Unhealthy"),
])
def test_a_configuration_that_never_gets_ready_fails_with_the_reason_and_leaves_nothing(
        cluster, tmp_path, script, needles, evidence):
    fake = cluster(behaviour=engine_script(script))
    with pytest.raises(ProvisionError) as exc:
        start_config(fake, tmp_path, "pd-tcp", ready_timeout_s=1.0)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("not ready after")
    assert all(n in msg for n in needles), msg
    ev_dir = tmp_path / "results/run-1/evidence/pd-tcp"
    assert evidence in {e["reason"] for e in json.loads((ev_dir / "events.json").read_text())}
    pods = {p["name"]: p["status"] for p in json.loads((ev_dir / "pods.json").read_text())}
    assert pods["pd-tcp-decode-0"]["phase"] == "Running"
    if script == CRASH_LOOP:
        assert (ev_dir / "prefill-0.previous.log").read_text() == CRASH_LOG
    assert_nothing_left(fake)


@pytest.mark.parametrize("signal", [KeyboardInterrupt(), TerminationSignal(signal=15)], ids=["ctrl-c", "cancel"])
def test_interrupt_during_the_readiness_wait_still_deletes_everything(cluster, tmp_path, monkeypatch, signal):
    """Ctrl-C raises KeyboardInterrupt; a Prefect cancellation (SIGTERM) raises TerminationSignal."""
    fake = cluster(behaviour=engine_script(UNSCHEDULABLE))

    def interrupt(_seconds: float) -> None:
        raise signal

    wait_ready = k8s_target.wait_ready
    monkeypatch.setattr(k8s_target, "wait_ready", lambda *a, **kw: wait_ready(*a, **kw, sleep=interrupt))
    with pytest.raises(type(signal)):
        start_config(fake, tmp_path, "pd-tcp")
    assert fake.objects("StatefulSet") == []
    assert_nothing_left(fake)


def test_keep_leaves_the_deployment_up_and_cleanup_removes_it(cluster, tmp_path, capsys):
    fake = cluster()
    spec, dep = start_config(fake, tmp_path, "aggregated", keep=True)
    k8s_target.stop(dep)
    assert "StatefulSet/aggregated-server" in fake.labelled(SELECTOR)
    assert "epdbench cleanup --run run-1 --namespace epdbench" in capsys.readouterr().out
    found, left = k8s_target.cleanup(spec.target.kubernetes, RUN_ID)
    assert found >= 7 and left == []
    assert_nothing_left(fake)


def test_teardown_is_bounded_and_names_what_is_left(cluster, tmp_path, capsys):
    fake = cluster(behaviour=lambda pod: READY, termination_s=30)
    spec = k8s_spec(fake.kubeconfig(tmp_path / "kubeconfig"), teardown_timeout_s=1)
    api = connect(spec.target.kubernetes)
    k8s_target.apply_objects(api, render_manifests(spec, spec.configuration("aggregated"), RUN_ID))
    assert wait_until(lambda: len(fake.objects("Pod", SELECTOR)) == 2, 5)
    dep = k8s_target.KubeDeployment(config="aggregated", endpoint="", router="", api=api, target=spec.target.kubernetes,
                                    run=RUN_ID, selector=run_selector(RUN_ID, "aggregated"), log_dir=tmp_path / "ev")
    began = time.monotonic()
    k8s_target.stop(dep)
    assert time.monotonic() - began < 5
    out = capsys.readouterr().out
    assert "left after teardown: " in out and "Pod/aggregated-server-0" in out
    assert "epdbench cleanup --run run-1 --namespace epdbench" in out


@pytest.mark.parametrize("setup,config,needle", [
    (lambda fake: None, "absent-namespace", "namespace absent does not exist"),
    (lambda fake: fake.put({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {
        "name": "old", "namespace": "epdbench", "labels": {"epdbench/run": "old-run"}}, "spec": {}}),
     "aggregated", "epdbench cleanup --run old-run --namespace epdbench"),
    (lambda fake: fake.remove("PersistentVolumeClaim", "hf-cache"), "aggregated",
     "PersistentVolumeClaim hf-cache (model cache) not found"),
], ids=["namespace", "leftovers", "claim"])
def test_preflight_refuses_before_applying_anything(cluster, tmp_path, setup, config, needle):
    fake = cluster()
    setup(fake)
    kube = {"namespace": "absent"} if config == "absent-namespace" else {}
    with pytest.raises(ProvisionError) as exc:
        start_config(fake, tmp_path, "aggregated", **kube)
    assert needle in str(exc.value)
    assert not [path for method, path in fake.requests if method == "PATCH"]


@pytest.mark.parametrize("options,config,needle", [
    ({"node_gpus": 2}, "epd", "configuration epd needs 3 nvidia.com/gpu on one node, node gpu-node-1 has 2"),
    ({"node_rdma": 0}, "pd-rdma", "needs 2 rdma/rdma_shared_device_a"),
])
def test_a_node_too_small_is_refused_before_applying(cluster, tmp_path, options, config, needle):
    fake = cluster(**options)
    with pytest.raises(ProvisionError) as exc:
        start_config(fake, tmp_path, config)
    assert needle in str(exc.value)
    assert not [path for method, path in fake.requests if method == "PATCH"]


@pytest.mark.parametrize("engine,needle", [
    ({"cpu": "100"}, "configuration epd needs 300 CPU for its engine pods, node gpu-node-1 has 192 CPU allocatable"),
    ({"memory": "1Ti"}, "needs 3072Gi of memory for its engine pods, node gpu-node-1 has 2048Gi allocatable"),
])
def test_engine_cpu_or_memory_beyond_the_node_is_refused_before_applying(cluster, tmp_path, engine, needle):
    fake = cluster()
    with pytest.raises(ProvisionError) as exc:
        start_config(fake, tmp_path, "epd", engine=engine)
    assert needle in str(exc.value) and "\n" not in str(exc.value)
    assert not [path for method, path in fake.requests if method == "PATCH"]


def label_namespace(fake, **levels) -> None:
    fake.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "epdbench", "labels": {
        f"pod-security.kubernetes.io/{mode}": level for mode, level in levels.items()}}})


def test_preflight_warns_about_pods_an_enforced_pod_security_level_would_reject(cluster, tmp_path, capsys):
    fake = cluster()
    label_namespace(fake, enforce="baseline")
    spec = k8s_spec(fake.kubeconfig(tmp_path / "kubeconfig"))
    k8s_target.preflight(connect(spec.target.kubernetes), spec, spec.configuration("pd-rdma"), RUN_ID)
    assert capsys.readouterr().out.splitlines() == [
        f'warning: namespace epdbench enforces Pod Security "baseline": the pods of StatefulSet pd-rdma-{role} would '
        'be rejected: container engine adds capability IPC_LOCK; label the namespace '
        'pod-security.kubernetes.io/enforce=privileged or ask the cluster admin for an exemption'
        for role in ("prefill", "decode")]


def test_pod_security_warnings_do_not_stop_a_start(cluster, tmp_path, capsys):
    fake = cluster()
    label_namespace(fake, enforce="restricted", warn="restricted", audit="restricted")
    _, dep = start_config(fake, tmp_path, "aggregated")
    k8s_target.stop(dep)
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert [line.split(": the pods of ")[1].split(" would")[0] for line in warnings] == [
        "StatefulSet aggregated-server", "Deployment aggregated-router"]   # the load generator Jobs comply
    assert all("enforce=baseline or ask the cluster admin" in line for line in warnings)


@pytest.mark.parametrize("version,ok", [(("1", "38"), True), (("1", "31+"), True), (("1", "24"), False)])
def test_manifests_are_validated_for_the_clusters_version(cluster, tmp_path, version, ok):
    fake = cluster(version=version)
    spec = k8s_spec(fake.kubeconfig(tmp_path / "kubeconfig"))
    api = connect(spec.target.kubernetes)
    config = spec.configuration("pd-rdma")
    if ok:
        assert len(k8s_target.prepare_manifests(api, spec, config, "r", tmp_path / "m")) == 7
        assert len(list((tmp_path / "m").iterdir())) == 7
    else:
        with pytest.raises(ManifestError, match="older than"):
            k8s_target.prepare_manifests(api, spec, config, "r", tmp_path / "m")


def test_bad_credentials_and_unreachable_servers_fail_in_one_line(cluster, tmp_path):
    fake = cluster()
    kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig")
    kubeconfig.write_text(kubeconfig.read_text().replace("fake-token", "wrong"))
    spec = k8s_spec(kubeconfig)
    with pytest.raises(ProvisionError, match="HTTP 401"):
        k8s_target.start(spec, spec.configuration("aggregated"), tmp_path / "spec.yaml", tmp_path / "ev")
    kubeconfig.write_text(kubeconfig.read_text().replace(f":{fake.port}", ":9"))
    with pytest.raises(ProvisionError, match="cannot reach the API server"):
        k8s_target.start(spec, spec.configuration("aggregated"), tmp_path / "spec.yaml", tmp_path / "ev")


class FlakyApi:
    """Answers like a cluster whose API server fails `failures` times with `status` first."""

    namespace = "epdbench"

    def __init__(self, status: int, failures: int = 1, pods: list[dict] | None = None):
        self.status, self.failures, self.pods, self.applied = status, failures, pods or [], []

    def _maybe_fail(self) -> None:
        if self.failures:
            self.failures -= 1
            raise KubeApiError(self.status, f"HTTP {self.status}")

    def apply(self, obj: dict) -> None:
        self._maybe_fail()
        self.applied.append(obj["metadata"]["name"])

    def list(self, kind: str, selector: str | None = None) -> list[dict]:
        self._maybe_fail()
        return self.pods


OBJ = {"metadata": {"name": "x"}}


def test_apply_retries_transient_errors_only():
    api = FlakyApi(503, failures=2)
    k8s_target.apply_objects(api, [OBJ], sleep=lambda s: None)
    assert api.applied == ["x"]
    with pytest.raises(KubeApiError):
        k8s_target.apply_objects(FlakyApi(422), [OBJ], sleep=lambda s: None)


def test_readiness_wait_polls_through_an_api_hiccup_and_is_bounded():
    ready = {"metadata": {"name": "p", "labels": {}}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    target = k8s_spec(Path("unused"), ready_timeout_s=10).target.kubernetes
    ticks = iter(range(1000))
    clock = lambda: float(next(ticks))  # noqa: E731 - a scripted clock: one second per reading
    assert k8s_target.wait_ready(FlakyApi(0, pods=[ready]), "s", 1, target, "c", clock, lambda s: None) == [ready]
    with pytest.raises(KubeApiError):
        k8s_target.wait_ready(FlakyApi(403, pods=[ready]), "s", 1, target, "c", clock, lambda s: None)


def test_readiness_wait_gives_up_at_the_deadline_with_a_diagnosis():
    pending = {"metadata": {"name": "p", "labels": {}, "uid": "u"}, "status": {"phase": "Pending"}}
    target = k8s_spec(Path("unused"), ready_timeout_s=30).target.kubernetes
    ticks = iter(range(1000))
    slept: list[float] = []
    with pytest.raises(ProvisionError, match=r"not ready after 3\d s: p: Pending"):
        k8s_target.wait_ready(FlakyApi(0, failures=0, pods=[pending]), "s", 1, target, "c",
                              lambda: float(next(ticks)), slept.append)
    assert len(slept) < 30 and max(slept) <= target.poll_interval_s
