"""End to end on the fake cluster with the load generator on the runner (`loadgen.run_in: runner`) through
port-forwards: every measured request of pd-tcp recorded, and its spans taken back from the collector beside the
router after each cell, one tree per request in traces/pd-tcp.parquet and in MLflow."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.k8s.fake_apiserver import SPEC_PATH, FakeApiServer
from tests.spanrows import tree_problems

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_runner_side_load_through_port_forwards_keeps_every_trace(tmp_path):
    spec = yaml.safe_load(SPEC_PATH.read_text())
    spec["target"]["kubernetes"].update(access="port-forward", loadgen={"run_in": "runner"})
    spec_path = tmp_path / "k8s-runner.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    fake = FakeApiServer(tmp_path / "cluster", SPEC_PATH,   # Mooncake's throughput windows even in a short run
                         env_overrides={"MC_TE_METRIC_INTERVAL_SECONDS": "0.5"}).start()
    out, db = tmp_path / "results", tmp_path / "mlflow.db"
    try:
        proc = subprocess.run([sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(spec_path), "--configs",
                               "pd-tcp", "--kubeconfig", str(fake.kubeconfig(tmp_path / "kubeconfig")), "--out",
                               str(out), "--tracking-uri", f"sqlite:///{db}"],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                              text=True, timeout=300)
        # 3: the fake's pods are simulators, whose `emulated` evidence proves nothing on a cluster target
        assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "pd-tcp: ok; transport emulated, stages verified" in proc.stdout
        assert "measured by a load generator Job" not in proc.stdout and "traces:" not in proc.stdout
        assert fake.labelled("epdbench/run") == [] and fake.running_processes() == []
    finally:
        fake.stop()
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
