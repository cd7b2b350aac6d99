"""End to end: `epdbench compare` with tracing on (tests/data/traced.yaml): every traced request of every
configuration has one span tree in traces/<config>.parquet (client → router/proxy where one makes spans →
engines' llm_request and kv_transfer) and the same tree as an MLflow trace under its cell run."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from epdbench.specs.models import load_spec
from epdbench.specs.tracing import traced_indices
from epdbench.specs.workload import plan_cells
from tests.spanrows import tree_problems

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
DATA = Path(__file__).parent / "data"
ENGINE_ROLES = {"aggregated": [{"aggregated"}], "pd": [{"prefill"}, {"decode"}],
                "epd": [{"prefill"}, {"decode"}]}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    work = tmp_path_factory.mktemp("traces")
    out = work / "results"
    proc = subprocess.run([sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(DATA / "traced.yaml"),
                           "--out", str(out), "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}"],
                          cwd=work, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, f"sqlite:///{work / 'mlflow.db'}"


def test_every_traced_request_has_one_tree_with_its_engines(run):
    out, _ = run
    spec = load_spec(str(DATA / "traced.yaml"))
    records = pd.read_parquet(out / "records.parquet")
    want = sum(len(traced_indices(c.n_measured, spec.tracing.per_cell)) for c in plan_cells(spec))
    for config in spec.configurations:
        spans = pd.read_parquet(out / "traces" / f"{config.name}.parquet")
        assert spans["trace_id"].nunique() == want, config.name
        assert not spans.duplicated(["trace_id", "span_id"]).any()
        mine = set(records[records["config"] == config.name]["request_id"])
        for tid, trace in spans.groupby("trace_id"):
            assert tree_problems(trace) == [], (config.name, tid)
            assert trace["request_id"].nunique() == 1 and trace["request_id"].iloc[0] in mine
            engines = trace[trace["name"] == "llm_request"]
            for roles in ENGINE_ROLES[config.topology]:
                assert roles & set(engines["role"]), (config.name, tid, list(engines["role"]))
            for attrs in engines["attributes"]:
                assert "gen_ai.latency.e2e" in json.loads(attrs)
            if config.topology != "aggregated":
                assert (trace["name"] == "kv_transfer").sum() == 1, (config.name, tid)
            if config.topology == "epd":                 # the built-in proxy: a router span between
                assert (trace["role"] == "proxy").sum() == 1
            assert trace["emulated"][trace["role"] != "client"].all()


def test_mlflow_holds_the_same_traces_under_their_cell_runs(run):
    out, uri = run
    from mlflow import MlflowClient

    from epdbench.tasks.publishing.mlflow_check import mlflow_matches_results
    assert mlflow_matches_results(uri, out) == []
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("epdbench").experiment_id
    traces = client.search_traces(locations=[exp], max_results=1000)
    folder = pd.concat([pd.read_parquet(p) for p in (out / "traces").glob("*.parquet")])
    assert len(traces) == folder["trace_id"].nunique()
    for t in traces:
        assert t.info.trace_metadata.get("mlflow.sourceRun")
        spans = folder[folder["trace_id"] == t.info.tags["epdbench.trace_id"]]
        assert sorted(s.name for s in t.data.spans) == sorted(spans["name"])
        assert sum(s.parent_id is None for s in t.data.spans) == 1
