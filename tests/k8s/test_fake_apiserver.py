"""The fake API server answers like the real one for the calls epdbench makes (so the product code tested
against it is the product code that talks to a cluster)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.k8s.fake_apiserver import READY, TOKEN, wait_until


def call(fake, method: str, path: str, body: dict | None = None, content_type: str = "application/json",
         token: str = TOKEN) -> tuple[int, dict | str]:
    req = urllib.request.Request(fake.url + path, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, data = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read().decode()
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data


STS = {"apiVersion": "apps/v1", "kind": "StatefulSet",
       "metadata": {"name": "c-prefill", "namespace": "epdbench",
                    "labels": {"epdbench/run": "r", "epdbench/config": "c", "epdbench/role": "prefill"}},
       "spec": {"replicas": 2, "serviceName": "c-prefill", "selector": {"matchLabels": {"epdbench/role": "prefill"}},
                "template": {"metadata": {"labels": {"epdbench/run": "r", "epdbench/config": "c",
                                                     "epdbench/role": "prefill"}},
                             "spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0"}]}}}}
APPLY = "/apis/apps/v1/namespaces/epdbench/statefulsets/c-prefill?fieldManager=epdbench&force=true"


def test_requests_without_the_token_are_unauthorized(cluster):
    status, body = call(cluster(), "GET", "/api/v1/namespaces/epdbench/pods", token="nope")
    assert status == 401 and body["kind"] == "Status" and body["code"] == 401


def test_apply_needs_the_apply_content_type_and_a_field_manager(cluster):
    fake = cluster()
    assert call(fake, "PATCH", APPLY, STS)[0] == 415
    assert call(fake, "PATCH", APPLY.split("?")[0], STS, "application/apply-patch+yaml")[0] == 400


def test_apply_creates_then_updates_and_the_controller_makes_pods(cluster):
    fake = cluster(behaviour=lambda pod: READY)
    assert call(fake, "PATCH", APPLY, STS, "application/apply-patch+yaml")[0] == 201
    assert call(fake, "PATCH", APPLY, STS, "application/apply-patch+yaml")[0] == 200
    assert wait_until(lambda: len(fake.objects("Pod", "epdbench/run=r")) == 2, 5)
    status, pods = call(fake, "GET", "/api/v1/namespaces/epdbench/pods?labelSelector=epdbench/role%3Dprefill")
    assert status == 200 and sorted(p["metadata"]["name"] for p in pods["items"]) == ["c-prefill-0", "c-prefill-1"]
    assert wait_until(lambda: all(p["status"]["phase"] == "Running" for p in fake.objects("Pod")), 5)


@pytest.mark.parametrize("selector,names", [("epdbench/run=r", ["c-prefill"]), ("epdbench/run!=r", []),
                                            ("epdbench/run", ["c-prefill"]), ("epdbench/run=x", [])])
def test_label_selectors_filter_lists(cluster, selector, names):
    fake = cluster(behaviour=lambda pod: READY)
    call(fake, "PATCH", APPLY, STS, "application/apply-patch+yaml")
    _, body = call(fake, "GET", f"/apis/apps/v1/namespaces/epdbench/statefulsets?labelSelector={selector}")
    assert [o["metadata"]["name"] for o in body["items"]] == names


def test_deleting_an_owner_collects_its_pods_after_their_grace_period(cluster):
    fake = cluster(behaviour=lambda pod: READY, termination_s=0.3)
    call(fake, "PATCH", APPLY, STS, "application/apply-patch+yaml")
    assert call(fake, "DELETE", APPLY.split("?")[0])[0] == 200
    assert call(fake, "DELETE", APPLY.split("?")[0])[0] == 404
    assert all(p["metadata"].get("deletionTimestamp") for p in fake.objects("Pod"))
    assert wait_until(lambda: fake.labelled("epdbench/run=r") == [], 5)


def test_unknown_resources_and_missing_objects_are_404(cluster):
    fake = cluster()
    assert call(fake, "GET", "/apis/example.com/v1/namespaces/epdbench/widgets")[0] == 404
    status, body = call(fake, "GET", "/api/v1/namespaces/epdbench/services/nope")
    assert status == 404 and body["reason"] == "NotFound"
    assert call(fake, "GET", "/api/v1/namespaces/epdbench/pods/nope/log")[0] == 404
