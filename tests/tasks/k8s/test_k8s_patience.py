"""An API server that stops answering for a while (restart, upgrade): the in-cluster load generator's Job wait and
the teardown by label ask again until their deadline instead of failing the configuration or leaving its objects
(the cluster tier restarts a real kube-apiserver mid-run: tests/cluster/test_faults_cluster.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from epdbench.tasks.k8s import target as k8s_target
from epdbench.tasks.k8s.api import KubeApiError, patiently
from epdbench.tasks.k8s.loadgen import run_loadgen_job
from tests.k8s.fake_apiserver import k8s_spec


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(s, 0.01)


class Down:
    """Calls fail with `status` while the clock is before `until`."""

    def __init__(self, clock: Clock, until: float, status: int = 0):
        self.clock, self.until, self.status, self.failed = clock, until, status, 0

    def check(self) -> None:
        if self.clock() < self.until:
            self.failed += 1
            raise KubeApiError(self.status, "cannot reach the API server: connection refused")


def test_patiently_asks_again_through_transient_errors_until_the_deadline():
    clock = Clock()
    down = Down(clock, until=7.0)
    assert patiently(lambda: down.check() or "ok", 60, clock, clock.sleep) == "ok"
    assert down.failed > 2 and 7.0 <= clock() < 12.0
    with pytest.raises(KubeApiError):                       # down past the deadline
        patiently(Down(clock, until=1e9).check, clock() + 10, clock, clock.sleep)
    forbidden = Down(clock, until=1e9, status=403)
    with pytest.raises(KubeApiError):                       # not transient: at once
        patiently(forbidden.check, clock() + 60, clock, clock.sleep)
    assert forbidden.failed == 1


class JobApi:
    """A cluster whose API server is down between t=2 and t=9 while the Job runs; the Job completes at t=5."""
    namespace = "epdbench"

    def __init__(self, clock: Clock):
        self.clock, self.down = clock, Down(clock, 0)
        self.deleted: list[str] = []

    def _call(self):
        if 2.0 <= self.clock() < 9.0:
            raise KubeApiError(0, "cannot reach the API server: connection refused")

    def apply(self, obj):
        self._call()

    def get(self, kind, name):
        self._call()
        return {"status": {"succeeded": 1} if self.clock() >= 5.0 else {}}

    def list(self, kind, selector=None):
        self._call()
        return [{"metadata": {"name": "job-pod"}}]

    def pod_log(self, pod, container):
        self._call()
        return ""

    def delete(self, kind, name, namespace=None):
        self._call()
        self.deleted.append(name)
        return True


def test_the_load_generator_job_wait_rides_through_an_api_server_restart():
    spec = k8s_spec(Path("unused"))
    clock = Clock()
    api = JobApi(clock)
    lines: list[str] = []
    result = run_loadgen_job(api, spec, spec.configuration("pd-tcp"), "r", "fixed", "x: 1\n", None, "1.31",
                             timeout_s=60, poll_s=1.0, clock=clock, sleep=clock.sleep, say=lines.append)
    assert "complete" in result.problem         # the Job's state was read after the API server came back
    assert len(lines) == 2 and "does not answer" in lines[0] and "answers again after 7 s" in lines[1], lines
    assert api.deleted == ["pd-tcp-loadgen-fixed"] and clock() >= 9.0


class LabelledApi:
    namespace = "epdbench"

    def __init__(self, clock: Clock, until: float):
        self.clock, self.until = clock, until
        self.objects = {("Pod", "a"), ("Service", "b")}

    def list(self, kind, selector=None):
        if self.clock() < self.until:
            raise KubeApiError(0, "cannot reach the API server: connection refused")
        return [{"metadata": {"name": n}} for k, n in self.objects if k == kind]

    def delete(self, kind, name, namespace=None):
        self.objects.discard((kind, name))
        return True


def test_teardown_by_label_waits_for_the_api_server_within_its_timeout():
    target = k8s_spec(Path("unused"), teardown_timeout_s=30).target.kubernetes
    clock = Clock()
    api = LabelledApi(clock, until=6.0)
    assert k8s_target.delete_labelled(api, "epdbench/run=r", target, clock, clock.sleep) == []
    with pytest.raises(KubeApiError):      # still down at the teardown's deadline: raised, and stop() says so
        k8s_target.delete_labelled(LabelledApi(clock, until=1e9), "epdbench/run=r", target, clock, clock.sleep)


def test_a_schema_refusal_answered_with_500_is_not_transient():
    """kube-apiserver 1.37 answers a server-side apply of an undeclared field with HTTP 500 (the cluster tier's
    strict check shows it): a fault of the object, never asked again."""
    refused = KubeApiError(500, "PATCH /x: HTTP 500 failed to create typed patch object (ns/x; /v1, Kind=Service): "
                                ".spec.portz: field not declared in schema")
    assert not refused.transient and KubeApiError(500, "etcdserver: request timed out").transient
