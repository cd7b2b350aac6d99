"""`compare --target kubernetes` with the load generator on the runner (`loadgen.run_in: runner`), every request
through a port-forward of the real API server: each measured request of pd-tcp recorded, its spans taken back from
the collector beside the router after each cell, one tree per request in traces/pd-tcp.parquet and in MLflow, and
MLflow equal to the results folder. Moved here from the fake API server."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.cluster.kubelet import PodPlayer
from tests.cluster.specs import TINY, cluster_spec
from tests.spanrows import tree_problems

pytestmark = pytest.mark.cluster      # the tier runs apart (-m cluster), in its network namespace
ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "runner-side"


def on_the_runner(data: dict) -> None:
    data["target"]["kubernetes"]["loadgen"]["run_in"] = "runner"


def test_runner_side_load_through_port_forwards_keeps_every_trace(control_plane, tmp_path):
    cp = control_plane
    cp.ensure_namespace(NAMESPACE)
    spec = cluster_spec(tmp_path / "k8s-runner.yaml", TINY, NAMESPACE, edit=on_the_runner)
    player = PodPlayer(cp, tmp_path / "pods", spec, NAMESPACE,    # Mooncake's throughput windows even in a short run
                       env_overrides={"MC_TE_METRIC_INTERVAL_SECONDS": "0.5"}).start()
    out, db = tmp_path / "results", tmp_path / "mlflow.db"
    try:
        proc = subprocess.run([sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(spec), "--configs",
                               "pd-tcp", "--kubeconfig", str(cp.kubeconfig(tmp_path / "kubeconfig",
                                                                           namespace=NAMESPACE)),
                               "--out", str(out), "--tracking-uri", f"sqlite:///{db}"],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                              text=True, timeout=300)
        # 3: the pods are simulators, whose `emulated` evidence proves nothing on a cluster target
        assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "pd-tcp: ok; transport emulated, stages verified" in proc.stdout
        assert "measured by a load generator Job" not in proc.stdout and "traces:" not in proc.stdout
        assert player.wait(lambda: player.running_processes() == [], 30), player.running_processes()
    finally:
        player.stop()
    records = pd.read_parquet(out / "records.parquet")
    measured = records[records["phase"] == "measured"]
    spans = pd.read_parquet(out / "traces" / "pd-tcp.parquet")
    assert len(measured) == 6 and set(spans["request_id"]) == set(measured["request_id"])
    for tid, trace in spans.groupby("trace_id"):
        assert tree_problems(trace) == [], tid
        assert sorted(trace["name"]) == ["client.request", "kv_transfer", "llm_request", "llm_request",
                                         "router.request"], tid
    from mlflow import MlflowClient

    from epdbench.tasks.publishing.mlflow_check import mlflow_matches_results
    assert mlflow_matches_results(f"sqlite:///{db}", out) == []
    client = MlflowClient(f"sqlite:///{db}")
    traces = client.search_traces(locations=[client.get_experiment_by_name("epdbench").experiment_id],
                                  max_results=100)
    assert {t.info.tags["epdbench.trace_id"] for t in traces} == set(spans["trace_id"])
    assert cp.labelled(NAMESPACE, "epdbench/run") == []
