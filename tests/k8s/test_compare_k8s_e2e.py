"""End to end: `epdbench compare --target kubernetes` against the fake API server, whose pods front the
simulator. One run (Prefect and MLflow start-up dominate, so one run carries every scenario): pd-rdma never
schedules and fails with the scheduler's reason, epd then provisions, serves, runs its suites, its traces come
back from the cluster and it is collected, and the run is interrupted (SIGINT) while pd-tcp serves. Nothing labelled is left; and
`epdbench cleanup` removes a crashed run's leftovers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from epdbench.manifests.render import render_manifests
from epdbench.tasks.k8s.api import connect
from tests.k8s.fake_apiserver import READY, RUN, SPEC_PATH, UNSCHEDULABLE, FakeApiServer, k8s_spec
from tests.spanrows import tree_problems

pytestmark = [pytest.mark.e2e, pytest.mark.slow]    # a comparison through the fake API server: about 40 s on 2 cores
ROOT = Path(__file__).resolve().parents[2]
CONFIGS = "pd-rdma,epd,pd-tcp"   # fails, then runs, then is interrupted
FAST_METRICS = {"MC_TE_METRIC_INTERVAL_SECONDS": "0.5"}   # tiny runs still log Mooncake throughput windows


def epdbench_args(*args: str) -> list[str]:
    return [sys.executable, "-m", "epdbench.cli", *args]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def pd_rdma_never_schedules(pod: dict) -> str:
    labels = pod["metadata"]["labels"]
    return UNSCHEDULABLE if labels["epdbench/config"] == "pd-rdma" and labels["epdbench/role"] != "router" else RUN


def read_until(proc: subprocess.Popen, needle: str, timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if needle in line or not line:
            break
    assert any(needle in line for line in seen), "".join(seen)[-3000:]
    return seen


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    work = tmp_path_factory.mktemp("k8s-e2e")
    fake = FakeApiServer(work / "cluster", SPEC_PATH, behaviour=pd_rdma_never_schedules,
                         env_overrides=FAST_METRICS).start()
    out = work / "results"
    proc = subprocess.Popen(epdbench_args("compare", "--spec", str(SPEC_PATH), "--configs", CONFIGS,
                                          "--kubeconfig", str(fake.kubeconfig(work / "kubeconfig")),
                                          "--out", str(out), "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}"),
                            cwd=work, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = read_until(proc, "[pd-tcp] serving at", timeout_s=240)
        labelled_while_serving = fake.labelled("epdbench/run")
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        yield {"returncode": proc.returncode, "output": "".join(seen) + rest, "out": out, "fake": fake,
               "work": work, "labelled_while_serving": labelled_while_serving}
    finally:
        if proc.poll() is None:
            proc.kill()
        fake.stop()


def test_a_configuration_that_never_schedules_fails_with_its_reason_and_the_next_runs(run):
    failed = next(line for line in run["output"].splitlines() if line.startswith("[pd-rdma] FAILED"))
    assert "provisioning failed: not ready after 5 s" in failed
    assert "Unschedulable" in failed and "Insufficient nvidia.com/gpu" in failed
    outcome = json.loads((run["out"] / "evidence" / "pd-rdma" / "outcome.json").read_text())
    assert not outcome["ok"] and "Unschedulable" in outcome["error"]
    assert json.loads((run["out"] / "evidence" / "epd" / "outcome.json").read_text())["ok"]
    records = pd.read_parquet(run["out"] / "records.parquet")
    epd = records[records["config"] == "epd"]
    assert set(epd["suite"]) == {"fixed", "mm"} and epd["ok"].all()
    # measured inside the (fake) cluster by one load generator Job per suite, every planned request once
    assert "[epd] fixed: measured by a load generator Job in the cluster (router-node)" in run["output"]
    assert epd.groupby(["cell", "phase"])["prompt_hash"].nunique().equals(epd.groupby(["cell", "phase"]).size())


def test_evidence_and_manifests_land_in_the_results_folder(run):
    epd = run["out"] / "evidence" / "epd"
    for name in ("placement.json", "pods.json", "events.json", "router.log", "encode-0.log", "prefill-0.log",
                 "decode-0.log", "transport.json", "stages.json"):
        assert (epd / name).exists(), name
    assert json.loads((epd / "transport.json").read_text())["verdict"] == "emulated"
    assert json.loads((epd / "stages.json").read_text())["fraction_seen"]["encode"] == 1.0
    events = json.loads((run["out"] / "evidence" / "pd-rdma" / "events.json").read_text())
    assert "FailedScheduling" in {e["reason"] for e in events}
    for config in CONFIGS.split(","):
        assert len(list((run["out"] / "manifests" / config).glob("*.yaml"))) >= 7


def test_every_traced_request_has_its_tree_from_the_collector_beside_the_router(run):
    """Engines and the router's proxy exported to the collector container in the router's pod; the runner took the
    spans back through the API server's proxy and joined them with the load generator Job's records."""
    records = pd.read_parquet(run["out"] / "records.parquet")
    measured = records[(records["config"] == "epd") & (records["phase"] == "measured")]
    spans = pd.read_parquet(run["out"] / "traces" / "epd.parquet")
    assert set(spans["request_id"]) == set(measured["request_id"])   # tracing.per_cell 32: every one traced
    for tid, trace in spans.groupby("trace_id"):
        assert tree_problems(trace) == [], tid
        engines = trace[trace["name"] == "llm_request"]
        roles = {"prefill-0", "decode-0"} | ({"encode-0"} if trace["suite"].iloc[0] == "mm" else set())
        assert set(engines["pod"]) == roles and (trace["name"] == "kv_transfer").sum() == 1, tid
        assert (trace["role"] == "proxy").sum() == 1
    assert "traces:" not in run["output"]                               # no collector problem was said


def test_mlflow_configuration_runs_carry_manifests_and_evidence(run):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{run['work'] / 'mlflow.db'}")
    exp = client.get_experiment_by_name("epdbench")
    runs = client.search_runs([exp.experiment_id], "tags.`epdbench.kind` = 'configuration'")
    epd = next(r for r in runs if r.data.tags["epdbench.config"] == "epd")
    assert {a.path for a in client.list_artifacts(epd.info.run_id)} >= {"evidence", "manifests"}
    assert epd.data.params["image"] == "vllm/vllm-openai:v0.33.0"
    traces = client.search_traces(locations=[exp.experiment_id], max_results=100)
    folder = pd.read_parquet(run["out"] / "traces" / "epd.parquet")
    assert {t.info.tags["epdbench.trace_id"] for t in traces} == set(folder["trace_id"])


def test_the_interrupted_run_deletes_everything_it_applied(run):
    assert "StatefulSet/pd-tcp-prefill" in run["labelled_while_serving"]
    assert run["returncode"] == 130, run["output"][-3000:]
    assert "[pd-tcp] deleted every object labelled" in run["output"]
    assert run["fake"].labelled("epdbench/run") == []
    assert run["fake"].running_processes() == []


def test_cleanup_removes_a_crashed_runs_leftovers(tmp_path):
    fake = FakeApiServer(tmp_path / "cluster", SPEC_PATH, behaviour=lambda pod: READY).start()
    try:
        kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig")
        spec = k8s_spec(kubeconfig)
        api = connect(spec.target.kubernetes)
        for config in ("aggregated", "epd"):
            for obj in render_manifests(spec, spec.configuration(config), "crashed-run"):
                api.apply(obj)
        assert len(fake.labelled("epdbench/run=crashed-run")) > 20
        proc = subprocess.run(epdbench_args("cleanup", "--run", "crashed-run", "--kubeconfig", str(kubeconfig)),
                              cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "run crashed-run in namespace epdbench" in proc.stdout and "gone" in proc.stdout
        assert fake.labelled("epdbench/run") == []
    finally:
        fake.stop()
