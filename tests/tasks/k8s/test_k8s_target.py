"""tasks/k8s/target.py where a real control plane cannot answer, against the in-process fake API server
(tests/k8s/fake_apiserver.py), each test saying why; and its pure parts against scripted API answers. The rest
runs against the real control plane: tests/cluster/test_target_cluster.py."""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from epdbench.manifests.render import ManifestError
from epdbench.otlp import format_traceparent, new_span_id, new_trace_id
from epdbench.tasks.k8s import target as k8s_target
from epdbench.tasks.deployment import ProvisionError
from epdbench.tasks.k8s.api import KubeApiError, connect
from tests.k8s.fake_apiserver import cluster, k8s_spec, wait_until  # noqa: F401  (cluster: a fixture)

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
    """On the fake: a real API server's service and pod proxies dial the pod's own address, which the cluster tier
    keeps where nothing listens (and off loopback, where no test may send anything)."""
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


@pytest.mark.parametrize("version,ok", [(("1", "38"), True), (("1", "31+"), True), (("1", "24"), False)])
def test_manifests_are_validated_for_the_clusters_version(cluster, tmp_path, version, ok):
    """On the fake: it answers /version as a server of any release; the tier builds one (1.37.2)."""
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

    def list_versioned(self, kind: str, selector: str | None = None) -> tuple[list[dict], str | None]:
        return self.list(kind, selector), None     # no version: the wait sleeps between lists


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


class Watching:
    """wait_for_change as a server that watches (returns), refuses the watch (410), or cannot be reached."""

    def __init__(self, error: KubeApiError | None = None):
        self.error, self.calls = error, []

    def wait_for_change(self, kind, selector, version, seconds):
        self.calls.append((kind, selector, version, seconds))
        if self.error:
            raise self.error
        return True


def test_the_readiness_pause_watches_from_the_lists_version_and_sleeps_where_it_cannot():
    slept: list[float] = []
    api = Watching()
    k8s_target.pause_until_change(api, "epdbench/run=r", "42", 2.0, slept.append)
    assert api.calls == [("Pod", "epdbench/run=r", "42", 2.0)] and slept == []
    k8s_target.pause_until_change(Watching(KubeApiError(410, "too old resource version")), "s", "42", 2.0,
                                  slept.append)
    k8s_target.pause_until_change(api, "s", None, 1.5, slept.append)          # a list without a version
    assert len(slept) == 2 and 1.9 < slept[0] <= 2.0 and slept[1] == 1.5 and len(api.calls) == 1
