"""A run interrupted (SIGINT) while a configuration serves deletes everything it applied, and `epdbench cleanup`
removes what a crashed run left, against the real control plane: the deletes go through the real API server and
the garbage collector removes the pods of the StatefulSets, Deployments and Jobs deleted."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epdbench.manifests.render import render_manifests
from epdbench.specs.models import load_spec
from epdbench.tasks.k8s.api import KINDS as API_KINDS
from tests.cluster.kubelet import PodPlayer
from tests.cluster.specs import TINY, cluster_spec
from tests.k8s.fake_kubelet import NOT_READY

pytestmark = pytest.mark.cluster      # the tier runs apart (-m cluster), in its network namespace
ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "interrupt"
@pytest.fixture(scope="module")
def setup(control_plane, tmp_path_factory):
    cp = control_plane
    work = tmp_path_factory.mktemp("cluster-interrupt")
    cp.ensure_namespace(NAMESPACE)
    spec = cluster_spec(work / "tiny.yaml", TINY, NAMESPACE)
    return cp, work, spec, cp.kubeconfig(work / "kubeconfig", namespace=NAMESPACE)


def test_an_interrupted_run_deletes_everything_it_applied(setup):
    cp, work, spec, kubeconfig = setup
    player = PodPlayer(cp, work / "pods", spec, NAMESPACE).start()
    proc = subprocess.Popen([sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(spec), "--configs", "pd-tcp",
                             "--kubeconfig", str(kubeconfig), "--out", str(work / "results"),
                             "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}"],
                            cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen.append(line)
            if "[pd-tcp] serving at" in line or not line:
                break
        assert any("[pd-tcp] serving at" in s for s in seen), "".join(seen)[-3000:]
        while_serving = cp.labelled(NAMESPACE, "epdbench/run")
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(seen) + rest
    assert "statefulsets/pd-tcp-prefill" in while_serving and any(p.startswith("pods/") for p in while_serving)
    assert proc.returncode == 130, output[-3000:]
    assert "[pd-tcp] deleted every object labelled" in output
    assert cp.labelled(NAMESPACE, "epdbench/run") == []
    assert player.wait(lambda: player.running_processes() == [], 30), player.running_processes()
    player.stop()


def test_cleanup_removes_a_crashed_runs_leftovers(setup):
    """What a run killed by SIGKILL leaves (its objects applied, its pods made by the controllers) goes with
    `epdbench cleanup --run`; pods that never got ready are deleted all the same."""
    cp, work, spec_path, kubeconfig = setup
    player = PodPlayer(cp, work / "pods-crashed", spec_path, NAMESPACE, behaviour=lambda pod: NOT_READY).start()
    try:
        spec = load_spec(str(spec_path))
        for config in ("aggregated", "epd"):
            for obj in render_manifests(spec, spec.configuration(config), "crashed-run"):
                meta = obj["metadata"]
                base = API_KINDS[obj["kind"]].collection_path(meta.get("namespace", NAMESPACE))
                status, body = cp.request("PATCH", f"{base}/{meta['name']}?fieldManager=epdbench&force=true", obj,
                                          content_type="application/apply-patch+yaml")
                assert status in (200, 201), body
        assert player.wait(lambda: sum(x.startswith("pods/") for x in cp.labelled(NAMESPACE, "epdbench/run=crashed-run")) >= 6,
                           60), cp.labelled(NAMESPACE, "epdbench/run=crashed-run")
        proc = subprocess.run([sys.executable, "-m", "epdbench.cli", "cleanup", "--run", "crashed-run",
                               "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig)], cwd=work,
                              env={**os.environ, "PYTHONPATH": str(ROOT)},
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"run crashed-run in namespace {NAMESPACE}" in proc.stdout and "gone" in proc.stdout, proc.stdout
        assert cp.labelled(NAMESPACE, "epdbench/run") == []
    finally:
        player.stop()

