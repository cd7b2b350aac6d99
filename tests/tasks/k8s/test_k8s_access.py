"""The service-proxy relay holds the runner's credentials, so it lets no one else in: per-run token,
GET and POST only, and only this namespace's service and pod proxies, checked on the decoded path.
Against the fake API server fronting the simulator; allowed paths still stream SSE. On the fake, not the real
control plane (tests/cluster/): a real API server's service proxy dials the pod's own address, which there lies
where nothing listens, off loopback."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from epdbench.tasks.k8s import target as k8s_target
from epdbench.tasks.k8s.access import RelayRefused, checked_proxy_path
from tests.k8s.fake_apiserver import cluster, k8s_spec  # noqa: F401

NS = "epdbench"
OK = f"/api/v1/namespaces/{NS}/services/aggregated-router:8000/proxy/v1/completions"


@pytest.mark.parametrize("raw, status", [
    (f"/api/v1/namespaces/{NS}/services/x/proxy/%2e%2e/%2e%2e/%2e%2e/secrets/NAME", 400),
    (f"/api/v1/namespaces/{NS}/services/x/proxy/%2E%2E/%2E%2E/%2E%2E/secrets/NAME", 400),
    (f"/api/v1/namespaces/{NS}/services/x/proxy/%252e%252e/%252e%252e/secrets/NAME", 400),   # encoded twice
    (f"/api/v1/namespaces/{NS}/services/x/proxy/./health", 400),
    (f"/api/v1/namespaces/{NS}/services/x%2F..%2F..%2Fsecrets%2FNAME/proxy/health", 400),
    (f"/api/v1/namespaces/{NS}/services/x/proxy//health", 400),
    (f"/api/v1/namespaces/{NS}/services/x/proxy/health%5C..%5Csecrets", 400),
    ("/api/v1/namespaces/kube-system/services/x/proxy/health", 403),
    (f"/api/v1/namespaces/{NS}-other/services/x/proxy/health", 403),
    (f"/api/v1/namespaces/{NS}/secrets/NAME", 403),
    (f"/api/v1/namespaces/{NS}/configmaps/x/proxy/health", 403),
    (f"/api/v1/namespaces/{NS}/pods/x/exec", 403),
    (f"/api/v1/namespaces/{NS}/pods/x/proxy/debug/pprof", 403),
    ("/apis/apps/v1/namespaces/epdbench/deployments", 403),
])
def test_paths_outside_the_namespaces_proxies_are_refused(raw, status):
    with pytest.raises(RelayRefused) as e:
        checked_proxy_path(raw, NS)
    assert e.value.status == status


@pytest.mark.parametrize("raw", [OK, f"/api/v1/namespaces/{NS}/pods/pd-tcp-prefill-0:8000/proxy/metrics",
                                 f"/api/v1/namespaces/{NS}/services/r:29000/proxy/metrics",
                                 f"/api/v1/namespaces/{NS}/pods/x:8000/proxy/tokenize"])
def test_pipeline_paths_are_sent_exactly_as_checked(raw):
    assert checked_proxy_path(raw, NS) == raw


def call(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_relay_refuses_what_is_not_the_runs_and_streams_what_is(cluster, tmp_path: Path):
    fake = cluster()
    spec = k8s_spec(fake.kubeconfig(tmp_path / "kubeconfig"))
    run_dir = tmp_path / "results" / "run-1"
    run_dir.mkdir(parents=True)
    dep = k8s_target.start(spec, spec.configuration("aggregated"), run_dir / "spec.yaml", run_dir / "evidence")
    try:
        base = dep.access.base_url                       # http://127.0.0.1:PORT/<token>
        root, token = base.rsplit("/", 1)
        assert len(token) >= 32
        fake.requests.clear()
        refused = {
            "no token": call(root + OK.replace("/v1/completions", "/health")),
            "wrong token": call(f"{root}/{'x' * len(token)}{OK}"),
            "encoded dot segments": call(f"{base}/api/v1/namespaces/{NS}/services/x/proxy/%2e%2e/%2e%2e/%2e%2e/"
                                         "secrets/NAME"),
            "other namespace": call(f"{base}/api/v1/namespaces/kube-system/services/x/proxy/health"),
            "other resource": call(f"{base}/api/v1/namespaces/{NS}/secrets/NAME"),
            "other method": call(base + OK, method="DELETE"),
        }
        assert {k: v[0] for k, v in refused.items()} == {
            "no token": 401, "wrong token": 401, "encoded dot segments": 400, "other namespace": 403,
            "other resource": 403, "other method": 405}
        assert all(body.startswith(b"refused: ") for _, body in refused.values())
        assert fake.requests == []                       # none of them reached the API server
        status, body = call(dep.endpoint + "/v1/completions", "POST", {
            "model": spec.model.name, "prompt": "hello", "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}})
        events = [e for e in body.decode().split("\n\n") if e]
        assert status == 200 and events[-1] == "data: [DONE]" and len(events) >= 5
        assert [m for m, _ in fake.requests] == ["POST"]
    finally:
        k8s_target.stop(dep)
