"""Faults against the real control plane, in one run of `compare --configs pd-rdma,epd,pd-tcp` (Prefect and MLflow
start-up dominate, so one run carries the three):
- pd-rdma's pods run but never become ready: the readiness wait ends at its timeout with one line naming each
  pod's state, nothing of it is left, and the next configuration runs;
- epd's decode pod is deleted mid-cell: the StatefulSet controller makes it again, the requests in flight are
  recorded as failed with their reason, the run says so, and the configuration is torn down all the same;
- kube-apiserver is restarted while pd-tcp's load generator Job runs: the runner's calls fail for a few seconds
  and it goes on; the Job (in the cluster, not through the API server) keeps measuring.
Afterwards: each planned request recorded once, MLflow equal to the results folder, nothing labelled left in etcd,
no process the pods stood for still running."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.cluster.kubelet import PodPlayer
from tests.cluster.specs import TINY, cluster_spec
from tests.k8s.fake_kubelet import NOT_READY, RUN

pytestmark = pytest.mark.cluster      # the tier runs apart (-m cluster), in its network namespace
ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "faults"
CONFIGS = "pd-rdma,epd,pd-tcp"


def longer_cells(data: dict) -> None:
    data["suites"][0].update(shapes=[{"input_tokens": 256, "output_tokens": 48}], n_measured=24)  # ~6 s: room to hit


def never_ready_rdma(pod: dict) -> str:
    labels = pod["metadata"].get("labels", {})
    return NOT_READY if labels.get("epdbench/config") == "pd-rdma" and labels.get("epdbench/role") != "router" \
        else RUN


def loadgen_running(cp, config: str) -> bool:
    status, body = cp.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector="
                                     f"epdbench/config%3D{config},epdbench/role%3Dloadgen", timeout_s=2)
    return status == 200 and any(p.get("status", {}).get("phase") == "Running" for p in body.get("items", []))


def inject(cp, player, done: threading.Event, log: list[str]) -> None:
    """epd: delete its decode pod 1 s into its first load Job; pd-tcp: restart the API server 1 s into its."""
    for config, action in (("epd", "delete"), ("pd-tcp", "restart")):
        if not player.wait(lambda: done.is_set() or loadgen_running(cp, config), 240) or done.is_set():
            return
        time.sleep(1.0)
        if action == "delete":
            status, _ = cp.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/epd-decode-0")
            log.append(f"deleted epd-decode-0: {status}")
        else:
            t0 = time.monotonic()
            cp.restart_apiserver(down_s=2.0)
            log.append(f"restarted kube-apiserver in {time.monotonic() - t0:.1f} s")


@pytest.fixture(scope="module")
def run(control_plane, tmp_path_factory):
    cp = control_plane
    work = tmp_path_factory.mktemp("cluster-faults")
    cp.ensure_namespace(NAMESPACE)
    spec = cluster_spec(work / "faults.yaml", TINY, NAMESPACE, edit=longer_cells, ready_timeout_s=8)
    player = PodPlayer(cp, work / "pods", spec, NAMESPACE, behaviour=never_ready_rdma,
                       env_overrides={"MC_TE_METRIC_INTERVAL_SECONDS": "0.5"}).start()
    done, log = threading.Event(), []
    injector = threading.Thread(target=inject, args=(cp, player, done, log), daemon=True)
    injector.start()
    out = work / "results"
    try:
        proc = subprocess.run([sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(spec), "--configs", CONFIGS,
                               "--kubeconfig", str(cp.kubeconfig(work / "kubeconfig", namespace=NAMESPACE)),
                               "--out", str(out), "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}"],
                              cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                              timeout=600)
        done.set()
        injector.join(timeout=30)
        (work / "compare.out").write_text(proc.stdout + proc.stderr)
        yield {"proc": proc, "out": out, "work": work, "player": player, "cp": cp, "log": log}
    finally:
        done.set()
        player.stop()


def test_the_faults_were_injected(run):
    assert [line.split(":")[0].split(" in ")[0] for line in run["log"]] == ["deleted epd-decode-0",
                                                                             "restarted kube-apiserver"], run["log"]


def test_a_configuration_never_ready_fails_in_one_line_and_the_next_runs(run):
    output = run["proc"].stdout
    failed = [line for line in output.splitlines() if line.startswith("[pd-rdma] FAILED")]
    assert len(failed) == 1, output[-3000:]
    assert "not ready after 8 s" in failed[0] and "pd-rdma-prefill-0" in failed[0], failed[0]
    outcome = json.loads((run["out"] / "outcome.json").read_text())
    assert outcome["configs"]["pd-rdma"]["status"] == "failed"
    assert run["proc"].returncode == 3, output[-3000:]


def test_a_pod_deleted_mid_cell_is_recorded_and_the_run_goes_on(run):
    records = pd.read_parquet(run["out"] / "records.parquet")
    epd = records[(records["config"] == "epd") & (records["phase"] == "measured")]
    failed = epd[~epd["ok"]]
    assert len(failed) > 0 and failed["error"].str.len().gt(0).all(), epd[["cell", "ok", "error"]].to_string()
    outcome = json.loads((run["out"] / "outcome.json").read_text())
    assert outcome["configs"]["epd"]["status"] in ("degraded", "failed"), outcome["configs"]["epd"]


def test_the_api_server_restart_is_ridden_through(run):
    outcome = json.loads((run["out"] / "outcome.json").read_text())
    assert outcome["configs"]["pd-tcp"]["status"] == "ok", (outcome["configs"]["pd-tcp"], run["proc"].stdout[-3000:])
    records = pd.read_parquet(run["out"] / "records.parquet")
    pd_tcp = records[(records["config"] == "pd-tcp") & (records["phase"] == "measured")]
    assert len(pd_tcp) > 0 and pd_tcp["ok"].all()
    said = [line for line in run["proc"].stdout.splitlines() if "[pd-tcp] Job pd-tcp-loadgen-fixed: the API" in line]
    assert len(said) == 2 and "does not answer" in said[0] and "answers again after" in said[1], said


def test_each_request_once_mlflow_equal_nothing_left(run):
    from epdbench.tasks.publishing.mlflow_check import mlflow_matches_results
    records = pd.read_parquet(run["out"] / "records.parquet")
    keys = ["config", "suite", "cell", "trial", "phase", "request_id"]
    assert not records.duplicated(keys).any()
    outcome = json.loads((run["out"] / "outcome.json").read_text())
    assert outcome["mlflow_pending"] == []
    assert mlflow_matches_results(f"sqlite:///{run['work'] / 'mlflow.db'}", run["out"]) == []
    cp, player = run["cp"], run["player"]
    assert cp.labelled(NAMESPACE, "epdbench/run") == []
    assert player.wait(lambda: player.running_processes() == [], 30), player.running_processes()
