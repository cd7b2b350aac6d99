"""How long publishing a cell's traces to MLflow takes, per trace, on three paths: batched (one log_spans call per
cell, one trace info per trace: tasks.publishing.traces), span by span through MLflow's client API into a store
that takes spans (what every store got before 2026-12-06: each span's end a write of its own), and span by span
into one that takes none (the fallback: MLflow's exporter keeps the spans as an artifact per trace). A fresh SQLite
store per repeat; the cells are synthetic traces shaped like a PD run's (client, router, prefill, decode spans).

    python benchmarks/pipeline/trace_publish.py                    # 3 repeats of 2 cells × 32 traces per path
    python benchmarks/pipeline/trace_publish.py --cells 4 --traces 32 --repeats 5

Prints per path the median ms per trace over the repeats with the fastest and slowest repeat, and the ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

T0 = 1_796_000_000_000_000_000


def pd_cell(cell: int, n: int) -> pd.DataFrame:
    """`n` traces of four spans each, as a PD request leaves them (times in ns, attributes as the engines')."""
    rows = []
    for i in range(n):
        tid = os.urandom(16).hex()
        ids = [os.urandom(8).hex() for _ in range(4)]
        t = T0 + (cell * n + i) * 100_000_000
        usage = {"gen_ai.usage.prompt_tokens": 4096, "gen_ai.usage.completion_tokens": 128}
        for k, (name, role, parent, a, b, attrs) in enumerate([
                ("client.request", "client", "", 0, 90, {"ok": True}),
                ("router.request", "router", ids[0], 1, 89, {}),
                ("llm_request", "prefill", ids[1], 2, 30, usage),
                ("llm_request", "decode", ids[1], 31, 88, usage)]):
            rows.append({"trace_id": tid, "span_id": ids[k], "parent_span_id": parent, "name": name, "role": role,
                         "pod": f"{role}-0", "start_ns": t + a * 1_000_000, "end_ns": t + b * 1_000_000,
                         "request_id": f"req-{cell}-{i}", "attributes": json.dumps(attrs), "emulated": True})
    return pd.DataFrame(rows)


PATHS = {"batched": "batched", "span by span": "spans", "span by span, spans as artifacts": "artifacts"}


def one_repeat(path: str, cells: int, traces: int) -> float:
    """Seconds per trace for `cells` cells of `traces` traces on a fresh store."""
    import mlflow
    import mlflow.tracing
    from mlflow import MlflowClient
    from mlflow.tracing.client import TracingClient

    from epdbench.tasks.publishing import traces as publishing
    from epdbench.tasks.publishing.mlflow_quiet import QuietClient

    work = Path(tempfile.mkdtemp(prefix="trace-publish-"))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = QuietClient(MlflowClient(uri))
    exp = client.create_experiment("bench", artifact_location=str(work / "artifacts"))
    data = [pd_cell(c, traces) for c in range(cells)]
    runs = [client.create_run(exp).info.run_id for _ in data]
    saved = (TracingClient.log_spans, publishing._in_one_batch)
    if path == "spans":
        publishing._in_one_batch = lambda *args: False
    elif path == "artifacts":     # as a store without log_spans: MLflow's exporter then keeps spans as artifacts
        def refuses(self, location, spans):
            raise NotImplementedError("log_spans is not supported")
        TracingClient.log_spans = refuses
    try:
        start = time.perf_counter()
        for run, spans in zip(runs, data):
            publishing.publish_cell_traces(client, exp, run, spans)
        publishing.flush_traces()
        took = time.perf_counter() - start
    finally:
        TracingClient.log_spans, publishing._in_one_batch = saved
        mlflow.tracing.reset()
    assert sum(len(publishing.existing_traces(client, exp, r)) for r in runs) == cells * traces
    return took / (cells * traces)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", type=int, default=2)
    p.add_argument("--traces", type=int, default=32, help="traces per cell (a spec's tracing.per_cell)")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")     # as tasks.publishing.tracking
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import logging
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    medians = {}
    for name, path in PATHS.items():
        ms = [1e3 * one_repeat(path, a.cells, a.traces) for _ in range(a.repeats)]
        medians[name] = statistics.median(ms)
        print(f"{name:>32}: {medians[name]:6.1f} ms per trace (median of {a.repeats}; {min(ms):.1f}–{max(ms):.1f}), "
              f"{a.cells} cells × {a.traces} traces of 4 spans", flush=True)
    for name in list(PATHS)[1:]:
        print(f"{name} / batched: {medians[name] / medians['batched']:.1f}×")


if __name__ == "__main__":
    main()
