"""A traced cell's run in MLflow carries its TTFT breakdown metrics (ttft_breakdown.<part>.p50_ms / p95_ms, valid
names) beside its traces; a cell without spans logs none."""
from __future__ import annotations

from epdbench.analysis.breakdown import PARTS
from epdbench.reports.mlflow_names import is_valid_name
from epdbench.tasks.publishing import publish
from epdbench.tasks.rundir.results import read_records
from epdbench.tasks.rundir.traces import append_spans, traces_path
from tests.spanrows import engine, trace
from tests.tasks.publishing.test_publish import all_runs, folder, uri  # noqa: F401 - fixtures

CELL_COLUMNS = ("config", "suite", "cell", "workload", "stream", "concurrency", "trial")


def test_traced_cell_run_has_breakdown_metrics_and_untraced_cells_none(folder, uri):  # noqa: F811
    rec = read_records(folder / "records.parquet")
    mine = rec[(rec["config"] == "pd-tcp") & (rec["phase"] == "measured") & rec["ok"].astype(bool)]
    first = mine.iloc[0]
    cell = mine[(mine["suite"] == first["suite"]) & (mine["workload"] == first["workload"])
                & (mine["concurrency"] == first["concurrency"]) & (mine["stream"] == first["stream"])
                & (mine["trial"] == first["trial"])]
    rows = []
    for r in cell.to_dict("records"):
        legs = [engine("prefill", 0.0, r["ttft_ms"] / 4e3), engine("decode", 0.0, r["ttft_ms"] / 8e3)]
        rows += trace(r["request_id"], legs, kv_s=r["ttft_ms"] / 8e3, cell={c: r[c] for c in CELL_COLUMNS})
    append_spans(traces_path(folder, "pd-tcp"), rows)
    publish.sync_results(folder, uri)
    cells = [r for r in all_runs(uri) if r.data.tags.get("epdbench.kind") == "cell"
             and r.data.tags.get("epdbench.config") == "pd-tcp"]
    traced = [r for r in cells if r.data.params["cell"] == first["workload"]
              and r.data.params["suite"] == first["suite"] and r.data.params["concurrency"] == str(first["concurrency"])
              and r.data.params["stream"] == first["stream"]]
    assert len(traced) == 1
    metrics = traced[0].data.metrics
    keys = {f"ttft_breakdown.{p}.{q}_ms" for p in PARTS for q in ("p50", "p95")}
    assert keys <= set(metrics) and all(is_valid_name(k) for k in metrics)
    assert metrics["ttft_breakdown.requests"] == len(cell) and metrics["ttft_breakdown.incomplete"] == 0
    assert metrics["ttft_breakdown.adds_up"] == 1.0
    assert not [k for r in cells if r is not traced[0] for k in r.data.metrics if k.startswith("ttft_breakdown.")]
