"""One test's namespace on the session's control plane (tests/cluster/controlplane.py), with its kubeconfig and
its pod player, and the tiny spec pointed at it (port-forward access, an emptyDir model cache)."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from epdbench.specs.models import load_spec, parse_spec
from epdbench.tasks.k8s import target as k8s_target
from epdbench.tasks.k8s.api import KINDS
from tests.cluster.kubelet import PodPlayer
from tests.cluster.specs import TINY

RUN_ID = "run-1"
SELECTOR = f"epdbench/run={RUN_ID}"
_numbers = itertools.count()


class Space:
    """One test's namespace on the session's control plane, its kubeconfig and its pod player."""

    def __init__(self, cp, work: Path):
        self.cp, self.work = cp, work
        self.name = cp.ensure_namespace(f"t{next(_numbers)}-" + re.sub(r"[^a-z0-9]+", "-", work.name.lower())[:40]
                                        .strip("-"))
        self.kubeconfig = cp.kubeconfig(work / "kubeconfig", namespace=self.name)
        self.player = PodPlayer(cp, work / "pods", TINY, self.name).start()

    def spec(self, **kube):
        data = load_spec(str(TINY)).model_dump(mode="json")
        data["target"]["kubernetes"].update({"kubeconfig": str(self.kubeconfig), "namespace": self.name,
                                             "access": "port-forward", "model_cache": {"kind": "empty-dir"}, **kube})
        return parse_spec(data, "k8s-tiny")

    def start(self, config: str, **kube):
        spec = self.spec(**kube)
        run_dir = self.work / "results" / RUN_ID
        run_dir.mkdir(parents=True, exist_ok=True)
        dep = k8s_target.start(spec, spec.configuration(config), run_dir / "spec.yaml", run_dir / "evidence" / config)
        return spec, dep

    def put(self, obj: dict, manager: str = "kubectl") -> dict:
        meta = obj["metadata"]
        path = KINDS[obj["kind"]].collection_path(meta.get("namespace", self.name))
        status, body = self.cp.request("PATCH", f"{path}/{meta['name']}?fieldManager={manager}", obj,
                                       content_type="application/apply-patch+yaml")
        assert status in (200, 201), body
        return body

    def labelled(self, selector: str = "epdbench/run") -> list[str]:
        return self.cp.labelled(self.name, selector)

    def assert_nothing_left(self) -> None:
        # The controllers' EndpointSlices go with their Service by garbage collection, moments after the teardown.
        assert self.player.wait(lambda: self.labelled(SELECTOR) == [], 30), self.labelled(SELECTOR)
        assert self.player.wait(lambda: self.player.running_processes() == [], 30), self.player.running_processes()


@pytest.fixture
def space(control_plane, tmp_path):
    s = Space(control_plane, tmp_path)
    yield s
    s.player.stop()
